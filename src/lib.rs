//! quantppl: exact perplexity and KL divergence of quantized LLM checkpoints.
//!
//! Data flows one way: checkpoint -> plan -> scheduler -> backend -> metrics -> report.

pub mod assets;
pub mod backend;
pub mod check;
pub mod checkpoint;
pub mod cli;
pub mod data;
pub mod error;
pub mod eval;
pub mod model;
pub mod numerics;
pub mod synth;

pub use error::{Error, Result};
