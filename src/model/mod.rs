//! The transformer, written once over the `Backend` trait.

pub mod forward;
mod layers;
pub mod rope;

pub use forward::{LoadFor, Model};
