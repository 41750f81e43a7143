use coil_gguf::GgmlType;

/// Errors from checking kernel inputs that come from files.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KernelError {
    #[error("weight type {0} is not supported by the kernels")]
    UnsupportedType(GgmlType),
    #[error("weight of type {ty}: {cols} columns is not a multiple of the block size {block}")]
    BadColumns {
        ty: GgmlType,
        cols: usize,
        block: usize,
    },
    #[error("weight of type {ty} with {rows}x{cols} elements needs {expected} bytes, got {got}")]
    BadLength {
        ty: GgmlType,
        rows: usize,
        cols: usize,
        expected: usize,
        got: usize,
    },
}
