//! What the recurrent-kernel examples share (`#[path]`-included): timing
//! and their numeric arguments.

use std::time::Instant;

/// CPU time of this thread in seconds (Linux schedstat; wall time elsewhere):
/// the machine this was tuned on is shared, and wall times there are noise.
pub fn cpu_now() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .map(|ns| ns * 1e-9)
        .unwrap_or_else(|| {
            static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
            T0.get_or_init(Instant::now).elapsed().as_secs_f64()
        })
}

/// Time of `f` after one warm-up run: with one thread the mean of this
/// thread's CPU time over `reps` runs (schedstat moves in ticks: a mean over
/// many runs), with more the best wall time of `reps` runs.
pub fn time(reps: usize, threads: usize, mut f: impl FnMut()) -> f64 {
    f();
    if threads == 1 {
        let c = cpu_now();
        (0..reps).for_each(|_| f());
        return (cpu_now() - c) / reps as f64;
    }
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// The command line's numeric arguments, in order (others skipped).
pub fn numeric_args() -> Vec<usize> {
    std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect()
}
