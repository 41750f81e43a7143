//! Recurrent-state slots: for each recurrent layer and each sequence, the
//! conv window `[d_conv − 1, channels]` and the SSM state (`[H, P, N]` for
//! Mamba-2, `[d_inner, N]` for Mamba-1), in f32. Sized once; never grows
//! with context.

use super::{MemoryError, SeqId, SequenceMemory};

/// Sizes of one recurrent layer's state, in f32 elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecurrentLayerShape {
    pub conv: usize,
    pub ssm: usize,
}

/// One layer's state of one sequence, borrowed for a forward pass.
pub struct RecurrentState<'a> {
    pub conv: &'a mut [f32],
    pub ssm: &'a mut [f32],
}

#[derive(Clone)]
struct Slot {
    len: usize,
    /// Per layer (empty for non-recurrent layers).
    conv: Vec<Vec<f32>>,
    ssm: Vec<Vec<f32>>,
}

pub struct RecurrentMemory {
    shapes: Vec<Option<RecurrentLayerShape>>,
    slots: Vec<Slot>,
}

impl RecurrentMemory {
    /// `shapes[l]` is `None` for a layer without recurrent state.
    pub fn new(shapes: Vec<Option<RecurrentLayerShape>>, n_seq_max: usize) -> Self {
        let slot = Slot {
            len: 0,
            conv: shapes
                .iter()
                .map(|s| vec![0.0; s.map_or(0, |s| s.conv)])
                .collect(),
            ssm: shapes
                .iter()
                .map(|s| vec![0.0; s.map_or(0, |s| s.ssm)])
                .collect(),
        };
        RecurrentMemory {
            shapes,
            slots: vec![slot; n_seq_max.max(1)],
        }
    }

    fn check(&self, s: SeqId) -> Result<(), MemoryError> {
        if s >= self.slots.len() {
            return Err(MemoryError::SeqOutOfRange {
                seq: s,
                n_seq_max: self.slots.len(),
            });
        }
        Ok(())
    }

    pub fn n_layer(&self) -> usize {
        self.shapes.len()
    }

    /// Bytes of state per sequence.
    pub fn bytes_per_seq(&self) -> usize {
        self.shapes
            .iter()
            .flatten()
            .map(|s| (s.conv + s.ssm) * 4)
            .sum()
    }

    /// The state of `layer` for sequence `s`, or `None` if the layer has none.
    pub fn state(
        &mut self,
        layer: usize,
        s: SeqId,
    ) -> Result<Option<RecurrentState<'_>>, MemoryError> {
        self.check(s)?;
        if self.shapes.get(layer).copied().flatten().is_none() {
            return Ok(None);
        }
        let slot = &mut self.slots[s];
        Ok(Some(RecurrentState {
            conv: &mut slot.conv[layer],
            ssm: &mut slot.ssm[layer],
        }))
    }

    /// Records that `n` more tokens of `s` went through every layer.
    pub fn advance(&mut self, s: SeqId, n: usize) -> Result<(), MemoryError> {
        self.check(s)?;
        self.slots[s].len += n;
        Ok(())
    }
}

impl SequenceMemory for RecurrentMemory {
    fn n_seq_max(&self) -> usize {
        self.slots.len()
    }

    fn seq_len(&self, s: SeqId) -> Result<usize, MemoryError> {
        self.check(s)?;
        Ok(self.slots[s].len)
    }

    fn seq_clear(&mut self, s: SeqId) -> Result<(), MemoryError> {
        self.check(s)?;
        let slot = &mut self.slots[s];
        slot.len = 0;
        slot.conv
            .iter_mut()
            .chain(slot.ssm.iter_mut())
            .for_each(|v| v.fill(0.0));
        Ok(())
    }

    fn seq_truncate(&mut self, s: SeqId, p: usize) -> Result<(), MemoryError> {
        let len = self.seq_len(s)?;
        if p >= len {
            Ok(())
        } else if p == 0 {
            self.seq_clear(s)
        } else {
            Err(MemoryError::CannotTruncate {
                seq: s,
                pos: p,
                len,
            })
        }
    }

    fn seq_fork(&mut self, src: SeqId, dst: SeqId) -> Result<(), MemoryError> {
        self.check(src)?;
        self.check(dst)?;
        if src != dst {
            let copy = self.slots[src].clone();
            self.slots[dst] = copy;
        }
        Ok(())
    }

    fn seq_keep(&mut self, s: SeqId) -> Result<(), MemoryError> {
        self.check(s)?;
        for other in 0..self.slots.len() {
            if other != s {
                self.seq_clear(other)?;
            }
        }
        Ok(())
    }

    fn bytes(&self) -> usize {
        self.bytes_per_seq() * self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem() -> RecurrentMemory {
        let shape = RecurrentLayerShape { conv: 6, ssm: 8 };
        RecurrentMemory::new(vec![Some(shape), None, Some(shape)], 3)
    }

    #[test]
    fn sizes_follow_the_layer_plan() {
        let m = mem();
        assert_eq!(m.bytes_per_seq(), 2 * 14 * 4);
        assert_eq!(m.bytes(), 3 * 2 * 14 * 4);
    }

    #[test]
    fn sequence_operations() {
        let mut m = mem();
        m.state(0, 0).unwrap().unwrap().ssm[3] = 1.5;
        assert!(m.state(1, 0).unwrap().is_none());
        m.advance(0, 5).unwrap();
        assert_eq!(m.seq_len(0), Ok(5));
        m.seq_fork(0, 2).unwrap();
        assert_eq!(m.state(0, 2).unwrap().unwrap().ssm[3], 1.5);
        assert_eq!(m.seq_len(2), Ok(5));
        assert!(matches!(
            m.seq_truncate(0, 2),
            Err(MemoryError::CannotTruncate { .. })
        ));
        m.seq_truncate(0, 7).unwrap();
        m.seq_keep(2).unwrap();
        assert_eq!(m.seq_len(0), Ok(0));
        assert_eq!(m.state(0, 0).unwrap().unwrap().ssm[3], 0.0);
        assert_eq!(m.seq_len(2), Ok(5));
        assert!(matches!(
            m.seq_clear(3),
            Err(MemoryError::SeqOutOfRange { .. })
        ));
        m.seq_truncate(2, 0).unwrap();
        assert_eq!(m.seq_pos_range(2), Ok(0..0));
    }
}
