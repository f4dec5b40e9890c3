//! Checkpoints opened for a run: the model, its tokenizer and the name reports give it.

use std::path::Path;

use crate::checkpoint::Checkpoint;
use crate::data::TextTokenizer;

/// How input activations are treated where the checkpoint declares activation quantization.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Activations {
    /// Fake-quantize activations exactly as the checkpoint's quantizer does (compressed-tensors'
    /// NVFP4 W4A4, FP8/INT8 W8A8; native FP8's `act_quant`; DeepSeek-V4's FP4 experts' inputs as
    /// DeepGEMM casts them).
    Declared,
    /// Keep activations unquantized (what vLLM runs for NVFP4 W4A4 on Hopper).
    WeightOnly,
}

/// A checkpoint opened for evaluation, with the name reports use.
pub struct OpenedModel {
    pub name: String,
    pub ckpt: Checkpoint,
    pub tokenizer: TextTokenizer,
}

/// Opens the checkpoint in `dir` with its activations treated as `activations` says.
pub fn open_checkpoint(dir: &Path, activations: Activations) -> crate::Result<Checkpoint> {
    let mut ckpt = Checkpoint::open(dir)?;
    ckpt.weight_only = activations == Activations::WeightOnly;
    Ok(ckpt)
}

/// Opens the model in `dir` (`None`: the bundled INT4 model) with `tokenizer` (`None`: the
/// model directory's own), refusing a tokenizer whose ids do not fit the model's vocabulary.
pub fn open_model(
    dir: Option<&Path>,
    tokenizer: Option<&Path>,
    activations: Activations,
) -> anyhow::Result<OpenedModel> {
    let (dir, name) = crate::assets::model_dir_or_bundled(dir)?;
    let ckpt = open_checkpoint(&dir, activations)?;
    let tokenizer = match tokenizer {
        Some(t) if t.as_os_str() == crate::assets::BUNDLED => {
            TextTokenizer::from_model_dir(&crate::assets::default_model_dir()?)?
        }
        Some(t)
            if t.is_file()
                && t.extension()
                    .is_some_and(|e| e.eq_ignore_ascii_case("gguf")) =>
        {
            TextTokenizer::from_gguf(t)?
        }
        Some(t) => TextTokenizer::from_file(&crate::checkpoint::locate::tokenizer_file(t)?)?,
        None => TextTokenizer::from_model_dir(&ckpt.dir)?,
    };
    if tokenizer.vocab_size() > ckpt.config.vocab_size {
        anyhow::bail!(
            "tokenizer {} has {} tokens but the model's vocabulary is {}",
            tokenizer.path().display(),
            tokenizer.vocab_size(),
            ckpt.config.vocab_size
        );
    }
    Ok(OpenedModel {
        name,
        ckpt,
        tokenizer,
    })
}
