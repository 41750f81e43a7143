//! Activation statistics per weight matrix, as llama.cpp's `llama-imatrix`
//! collects them for importance-weighted quantization: for every product of
//! a weight matrix `blk.*` (and, if asked, `output.weight`) with
//! activations `x`, the sum over the activation rows of `x²` per input
//! column, and the count of rows. An expert tensor (`{cols, rows,
//! n_expert}`) keeps one row of sums and one count per expert, over the
//! tokens routed to it; a dense matrix counts products of at least 16
//! tokens only (llama-imatrix skips smaller batches).
//!
//! Install an [`ImatrixCollector`] with
//! [`coil_kernels::matmul::set_product_observer`] while the engine
//! evaluates the calibration text, then [`ImatrixCollector::take`] the sums.

use coil_gguf::GgufFile;
use coil_kernels::matmul::ProductObserver;
use coil_kernels::WeightRef;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// The fewest tokens of a dense product that count (llama-imatrix's rule).
pub const MIN_DENSE_TOKENS: usize = 16;

/// One weight matrix's sums so far.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ActivationStats {
    /// `n_mat × cols`: Σ x² per column (per expert).
    pub sums: Vec<f64>,
    /// Activation rows summed, per matrix (expert).
    pub counts: Vec<u64>,
}

struct Slot {
    start: usize,
    end: usize,
    name: String,
    cols: usize,
    n_mat: usize,
}

#[derive(Default)]
struct State {
    stats: BTreeMap<String, ActivationStats>,
    /// The first matrix whose activations were not finite.
    non_finite: Option<String>,
}

/// Collects [`ActivationStats`] of one model's products (see the module).
pub struct ImatrixCollector {
    /// The tensors' byte ranges in the model's memory, by start.
    slots: Vec<Slot>,
    state: Mutex<State>,
}

impl ImatrixCollector {
    /// A collector for the weight matrices of `file` (the engine's own
    /// file: products are told apart by where their weights lie).
    pub fn new(file: &GgufFile, process_output: bool) -> ImatrixCollector {
        let base = file.bytes().as_ptr() as usize;
        let mut slots: Vec<Slot> = file
            .tensors()
            .iter()
            .filter(|t| {
                t.dims.len() >= 2
                    && (t.name.starts_with("blk.") || (process_output && t.name == "output.weight"))
            })
            .map(|t| {
                let r = file.data_range(t);
                Slot {
                    start: base + r.start,
                    end: base + r.end,
                    name: t.name.clone(),
                    cols: t.dims[0] as usize,
                    n_mat: t.dims[2..].iter().product::<u64>().max(1) as usize,
                }
            })
            .collect();
        slots.sort_by_key(|s| s.start);
        ImatrixCollector {
            slots,
            state: Mutex::new(State::default()),
        }
    }

    fn slot(&self, at: usize) -> Option<&Slot> {
        let i = self
            .slots
            .partition_point(|s| s.start <= at)
            .checked_sub(1)?;
        let s = &self.slots[i];
        (at < s.end).then_some(s)
    }

    /// The sums collected so far (by tensor name), leaving none behind; an
    /// error names the first matrix whose activations were not finite.
    pub fn take(&self) -> Result<BTreeMap<String, ActivationStats>, String> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(name) = st.non_finite.take() {
            return Err(format!(
                "the activations of {name} are not finite (the model's output is NaN or infinite)"
            ));
        }
        Ok(std::mem::take(&mut st.stats))
    }
}

impl ProductObserver for ImatrixCollector {
    fn product(&self, w: &WeightRef, x: &[f32], n_tokens: usize) {
        let at = w.data.as_ptr() as usize;
        let Some(s) = self.slot(at) else { return };
        if s.cols != w.cols || n_tokens == 0 {
            return;
        }
        let mat = if s.n_mat > 1 {
            let per = (s.end - s.start) / s.n_mat;
            (at - s.start) / per.max(1)
        } else {
            if n_tokens < MIN_DENSE_TOKENS {
                return;
            }
            0
        };
        let cols = s.cols;
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *guard;
        let e = st
            .stats
            .entry(s.name.clone())
            .or_insert_with(|| ActivationStats {
                sums: vec![0.0; cols * s.n_mat],
                counts: vec![0; s.n_mat],
            });
        let acc = &mut e.sums[mat * cols..(mat + 1) * cols];
        for row in x.chunks_exact(cols).take(n_tokens) {
            for (a, &v) in acc.iter_mut().zip(row) {
                *a += (v * v) as f64;
            }
        }
        e.counts[mat] += n_tokens as u64;
        if st.non_finite.is_none() && !acc.iter().all(|v| v.is_finite()) {
            st.non_finite = Some(s.name.clone());
        }
    }
}
