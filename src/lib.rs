//! quantppl: exact perplexity and KL divergence of quantized LLM checkpoints.
//!
//! Data flows one way: checkpoint -> plan -> scheduler -> backend -> metrics -> report.
