//! quantppl: exact perplexity and KL divergence of quantized LLM checkpoints.
//!
//! Data flows one way: checkpoint -> plan -> scheduler -> backend -> metrics -> report.

pub mod error;

pub use error::{Error, Result};
pub mod backend;
pub mod checkpoint;
pub mod model;
pub mod numerics;
