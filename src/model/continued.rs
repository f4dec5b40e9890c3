//! Batches whose sequences continue rows an earlier batch computed (`serve`'s prefix cache):
//! every op runs on the batch's own rows; the attention sees each sequence whole, the earlier
//! rows' keys and values taken from where the earlier batch left them. A continued sequence is
//! then scored as if it had run whole, within the backend's contract (the same products on the
//! same rows; only the batch around them differs).

use crate::backend::{SeqLayout, Shaped};
use crate::{Error, Result};

/// How a batch's own rows and the rows it continues make up the attention's sequences.
#[derive(Clone, Debug)]
pub struct Continuation {
    /// The attention's layout: each sequence's earlier rows, then its rows in this batch.
    pub attention: SeqLayout,
    /// This batch's rows alone, at the positions they have in `attention`: what RoPE and
    /// every op but the attention read.
    pub rows: SeqLayout,
    /// Per row of `attention`, where its key and value come from: the earlier rows laid end to
    /// end (`earlier` of them), then this batch's rows.
    pub keys: Vec<u32>,
    /// Per row of `attention`, the batch row whose query it takes: its own, or for an earlier
    /// row the sequence's first own row (the output there is dropped).
    pub queries: Vec<u32>,
    /// Per batch row, its row of `attention`.
    pub outputs: Vec<u32>,
    /// How many earlier rows the keys may name.
    pub earlier: usize,
}

impl Continuation {
    /// The sequences of `attention` (whole), sequence `s` beginning with the rows an earlier
    /// batch computed that `continued[s]` names (indices into `earlier` rows laid end to end;
    /// empty: none); each sequence keeps at least one row of its own.
    pub fn new(attention: SeqLayout, continued: &[Vec<u32>], earlier: usize) -> Result<Self> {
        if continued.len() != attention.n_seqs() {
            return Err(Error::InvalidArgument(format!(
                "{} continued sequences for a batch of {}",
                continued.len(),
                attention.n_seqs()
            )));
        }
        let n = attention.n_tokens();
        let own = n - continued.iter().map(Vec::len).sum::<usize>();
        let mut keys = Vec::with_capacity(n);
        let mut queries = Vec::with_capacity(n);
        let mut outputs = Vec::with_capacity(own);
        let mut starts = vec![0];
        let mut positions = Vec::with_capacity(own);
        for (w, before) in attention.starts.windows(2).zip(continued) {
            let len = w[1] - w[0];
            if before.len() >= len {
                return Err(Error::InvalidArgument(format!(
                    "a sequence of {len} rows continuing {} earlier rows",
                    before.len()
                )));
            }
            if let Some(&bad) = before.iter().find(|&&r| r as usize >= earlier) {
                return Err(Error::InvalidArgument(format!(
                    "earlier row {bad} of {earlier}"
                )));
            }
            let first_own = outputs.len() as u32;
            keys.extend_from_slice(before);
            queries.extend(std::iter::repeat_n(first_own, before.len()));
            for r in w[0] + before.len()..w[1] {
                let c = outputs.len() as u32;
                keys.push(earlier as u32 + c);
                queries.push(c);
                outputs.push(r as u32);
                positions.push(attention.positions[r]);
            }
            starts.push(outputs.len());
        }
        // Branches are the attention's alone; where nothing continues, it reads `rows`.
        let rows = match outputs.len() == n {
            true => attention.clone(),
            false => SeqLayout {
                starts,
                positions,
                hidden: Vec::new(),
            },
        };
        Ok(Self {
            rows,
            attention,
            keys,
            queries,
            outputs,
            earlier,
        })
    }

    /// Whether some sequence continues earlier rows.
    pub fn continues(&self) -> bool {
        self.outputs.len() < self.attention.n_tokens()
    }

    /// The rows of `kept` (tensors of one layer laid end to end, as `keys` counts them) that
    /// the earlier rows of `attention` take; an error where they do not add up to `earlier`.
    pub fn check_earlier<T: Shaped>(&self, kept: &[&T]) -> Result<()> {
        let rows: usize = kept.iter().map(|t| t.rows()).sum();
        if rows != self.earlier {
            return Err(Error::InvalidArgument(format!(
                "{rows} kept rows where the batch continues {}",
                self.earlier
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Branches;

    /// Rows of the attention map to the earlier rows, then to the batch's own in order, and
    /// back; the batch's rows keep the positions (and branches' positions) of the whole.
    #[test]
    fn continued_rows_map_both_ways() {
        let branches = Branches {
            prefix: 4,
            lens: vec![2, 3],
        };
        let attention = SeqLayout::from_sequences([(5, None), (9, Some(&branches)), (3, None)]);
        let c = Continuation::new(attention, &[vec![7, 8], vec![0, 1, 2], vec![]], 10).unwrap();
        assert!(c.continues());
        assert_eq!(c.rows.starts, vec![0, 3, 9, 12]);
        assert_eq!(c.rows.positions, vec![2, 3, 4, 3, 4, 5, 4, 5, 6, 0, 1, 2]);
        assert_eq!(&c.keys[..5], &[7, 8, 10, 11, 12]);
        assert_eq!(&c.keys[5..8], &[0, 1, 2]);
        assert_eq!(&c.queries[..5], &[0, 0, 0, 1, 2]);
        assert_eq!(&c.queries[5..9], &[3, 3, 3, 3]);
        for (own, &r) in c.outputs.iter().enumerate() {
            assert_eq!(c.queries[r as usize], own as u32);
            assert_eq!(c.keys[r as usize], 10 + own as u32);
        }
        assert!(Continuation::new(c.attention.clone(), &[vec![0; 5], vec![], vec![]], 10).is_err());
        assert!(Continuation::new(c.attention.clone(), &[vec![10], vec![], vec![]], 10).is_err());
    }
}
