//! The transformer, written once over the `Backend` trait.

mod compressed;
pub mod continued;
pub mod forward;
mod layers;
pub mod rope;

pub use continued::Continuation;
pub use forward::{KeyValuePair, KeysOfLayers, LoadFor, Model};
