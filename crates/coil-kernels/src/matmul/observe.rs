//! An observer of every weight · activation product (what `coil imatrix`
//! collects its statistics from): while one is installed, [`super::matmul`],
//! [`super::matmul_at`] and [`super::matmul_shared`] hand it each weight
//! matrix and the activations `x` (`[n_tokens, cols]`) before computing.
//! Without one, a product pays one relaxed atomic load.

use crate::matmul::weight::WeightRef;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

/// Sees the products; called from any thread of the pool (expert products
/// run side by side), so it synchronises itself.
pub trait ProductObserver: Send + Sync {
    fn product(&self, w: &WeightRef, x: &[f32], n_tokens: usize);
}

static ACTIVE: AtomicBool = AtomicBool::new(false);
static OBSERVER: RwLock<Option<Arc<dyn ProductObserver>>> = RwLock::new(None);

/// Installs `o` as the process's observer (replacing any), or removes it
/// with `None`.
pub fn set_product_observer(o: Option<Arc<dyn ProductObserver>>) {
    let on = o.is_some();
    *OBSERVER.write().unwrap_or_else(|p| p.into_inner()) = o;
    ACTIVE.store(on, Ordering::Release);
}

/// Hands one product to the observer, if one is installed.
#[inline]
pub(crate) fn notify(w: &WeightRef, x: &[f32], n_tokens: usize) {
    if !ACTIVE.load(Ordering::Relaxed) {
        return;
    }
    let o = OBSERVER.read().unwrap_or_else(|p| p.into_inner()).clone();
    if let Some(o) = o {
        o.product(w, x, n_tokens);
    }
}
