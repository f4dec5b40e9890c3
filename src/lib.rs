//! quantppl: exact perplexity and KL divergence of quantized LLM checkpoints.
//!
//! Data flows one way: checkpoint -> plan -> scheduler -> backend -> metrics -> report.

pub mod error;
pub mod synth;

pub use error::{Error, Result};
