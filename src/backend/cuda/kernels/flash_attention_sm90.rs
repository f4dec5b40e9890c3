//! `flash_attention_sm90.cu`: causal GQA attention on Hopper's wgmma, q, k and v tiles loaded
//! by TMA, bf16 heads of 64 and 128, one persistent block a multiprocessor. Launched by
//! `attention::run` as a `FlashAttention`.

use super::flash_attention::{FlashAttention, Operands};
use super::{Loader, Module, Source, cuda_source, multiprocessors};
use crate::Result;

/// `flash_attention_sm90.cu`'s kernel.
pub struct Entries(pub FlashAttention);

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("flash_attention_sm90");

    fn load(l: &Loader) -> Result<Option<Self>> {
        let operands = Operands::TensorMaps {
            blocks: multiprocessors(l.ctx)?,
        };
        Ok(Some(Self(FlashAttention::load(
            l,
            "flash_attention_sm90",
            operands,
            &[64, 128],
        )?)))
    }
}
