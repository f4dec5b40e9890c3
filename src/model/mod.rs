//! The transformer, written once over the `Backend` trait.

pub mod forward;
pub mod rope;

pub use forward::{LoadFor, Model};
