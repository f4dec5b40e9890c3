//! quantppl: exact perplexity and KL divergence of quantized LLM checkpoints.
//!
//! Data flows one way: checkpoint -> plan -> run -> backend -> report.

pub mod assets;
pub mod backend;
pub mod cache;
pub mod check;
pub mod checkpoint;
pub mod cli;
pub mod data;
pub mod error;
pub mod fnv;
pub mod hub;
pub mod model;
pub mod numerics;
pub mod plan;
pub mod report;
pub mod rng;
pub mod run;
pub mod serve;
pub mod synth;
pub mod units;

pub use error::{Error, Result};
