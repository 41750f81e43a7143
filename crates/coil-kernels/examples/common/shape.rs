//! The command line of the one-shape matmul examples (`#[path]`-included):
//! `FORMAT ROWS COLS N_TOKENS [THREADS]`.

use coil_gguf::GgmlType;
use coil_kernels::ThreadPool;

/// Reads `FORMAT ROWS COLS N_TOKENS [THREADS]` (threads 0 or left out: one
/// per core) as the format, the sizes and the pool; exits with the usage
/// line when they do not parse.
pub fn args(usage: &str) -> (GgmlType, usize, usize, usize, ThreadPool) {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize| a.get(i).and_then(|s| s.parse::<usize>().ok());
    let ty = a.first().and_then(|s| GgmlType::from_name(s));
    let (Some(ty), Some(rows), Some(cols), Some(n)) = (ty, num(1), num(2), num(3)) else {
        eprintln!("usage: {usage} FORMAT ROWS COLS N_TOKENS [THREADS]");
        std::process::exit(2);
    };
    (ty, rows, cols, n, ThreadPool::new(num(4).unwrap_or(0)))
}
