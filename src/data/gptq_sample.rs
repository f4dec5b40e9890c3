//! The GPTQ code's C4 evaluation windows (`datautils.get_c4`, `docs/data-sets.md`): with
//! Python's `random.seed(0)`, 256 times draw a document uniformly until one has at least
//! `seqlen` tokens, then a uniform start inside it; the windows are concatenated. Python's
//! generator is reproduced call for call, so the windows are the ones the papers scored.

use rand_mt::Mt;

use super::TextTokenizer;
use crate::{Error, Result};

/// Python's `random.Random` as far as `seed(int)` and `randint` go: MT19937 seeded by
/// `init_by_array` with the seed's 32-bit words, integers drawn by rejection from
/// `getrandbits(n.bit_length())`.
pub struct PyRandom(Mt);

impl PyRandom {
    /// `random.seed(seed)` for a non-negative integer that fits 32 bits.
    pub fn new(seed: u32) -> Self {
        PyRandom(Mt::new_with_key([seed]))
    }

    /// `random.randint(low, high)`, both ends included; `None` when `high < low` (where Python
    /// raises `ValueError: empty range`).
    pub fn randint(&mut self, low: usize, high: usize) -> Option<usize> {
        let n = u32::try_from(high.checked_sub(low)? + 1).ok()?;
        let bits = 32 - n.leading_zeros();
        loop {
            let r = self.0.next_u32() >> (32 - bits);
            if r < n {
                return Some(low + r as usize);
            }
        }
    }
}

/// The seed `get_c4` resets to before drawing its evaluation windows.
pub const C4_SEED: u32 = 0;

/// `windows` windows of `seqlen` tokens drawn from `docs` by the rule of `get_c4`, one after
/// another. Each document is tokenized as `tokenizer(text)` does (special tokens added).
pub fn c4_windows(
    docs: &[String],
    tokenizer: &TextTokenizer,
    seqlen: usize,
    windows: usize,
) -> Result<Vec<u32>> {
    let mut random = PyRandom::new(C4_SEED);
    let mut out = Vec::with_capacity(windows * seqlen);
    let last_doc = docs
        .len()
        .checked_sub(1)
        .ok_or_else(|| Error::InvalidArgument("C4: the data set has no documents".into()))?;
    // Documents known to be too short: drawing one again costs no tokenization, and when
    // every document is known short the draw would never end (the GPTQ code loops forever).
    let mut short = vec![false; docs.len()];
    let mut n_short = 0;
    for _ in 0..windows {
        let tokens = loop {
            let doc = random.randint(0, last_doc).expect("non-empty range");
            if short[doc] {
                continue;
            }
            let tokens = tokenizer.encode(&docs[doc], true)?;
            if tokens.len() >= seqlen {
                break tokens;
            }
            short[doc] = true;
            n_short += 1;
            if n_short == docs.len() {
                return Err(Error::InvalidArgument(format!(
                    "C4: no document has {seqlen} tokens or more; --ctx is too long for this data"
                )));
            }
        };
        let start = random
            .randint(0, tokens.len() - seqlen - 1)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "C4: a drawn document has exactly {seqlen} tokens, where the GPTQ code's \
                 randint(0, -1) fails; no window of this --ctx follows its rule"
                ))
            })?;
        out.extend_from_slice(&tokens[start..start + seqlen]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CPython 3.11: `random.seed(0); [random.randint(0, 356317) for _ in range(4)],
    /// [random.randint(0, 5) for _ in range(4)], random.randint(0, 2**31)`.
    #[test]
    fn follows_cpython_random() {
        let mut r = PyRandom::new(0);
        let big: Vec<usize> = (0..4).map(|_| r.randint(0, 356_317).unwrap()).collect();
        assert_eq!(big, [201_979, 220_500, 21_225, 135_746]);
        let small: Vec<usize> = (0..4).map(|_| r.randint(0, 5).unwrap()).collect();
        assert_eq!(small, [4, 3, 3, 2]);
        assert_eq!(r.randint(0, 1 << 31), Some(2_046_968_324));
        assert_eq!(r.randint(3, 2), None);
    }
}
