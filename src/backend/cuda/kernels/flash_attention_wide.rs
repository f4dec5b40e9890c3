//! `flash_attention_wide.cu`: causal GQA attention on the tensor cores (mma.sync, sm_80 and
//! later) for bf16 heads of 512, each pair of warps splitting a head's output columns.
//! Launched by `attention::run` with the arguments of `flash_attention.cu`.

use super::flash_attention::{FlashAttention, Operands};
use super::{Loader, Module, Source, cuda_source};
use crate::Result;

/// Must match FW_BM and FW_BN in flash_attention_wide.cu (its FW_WARPS is flash_attention.cu's
/// FA_WARPS, the threads `Operands::Pointers` launches).
const FW_ROWS: usize = 64;
const FW_KEYS: usize = 32;

/// `flash_attention_wide.cu`'s kernel, where the device has its 195 KiB of shared memory.
pub struct Entries(pub FlashAttention);

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("flash_attention_wide");

    fn load(l: &Loader) -> Result<Option<Self>> {
        let operands = Operands::Pointers {
            row_pad: 8,
            planes: 1,
            rows: FW_ROWS,
            keys: FW_KEYS,
        };
        Ok(Some(Self(FlashAttention::load(
            l,
            "flash_attention_wide",
            operands,
            &[512],
        )?)))
    }
}
