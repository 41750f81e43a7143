//! Minimal `.npy` (NumPy array file) reading and writing for float32
//! C-order arrays: reference logits in tests, `coil logits` output.

use std::io::Write;

#[derive(Debug, thiserror::Error)]
pub enum NpyError {
    #[error("not a .npy file: {0}")]
    Format(String),
    #[error("unsupported .npy array: {0} (only little-endian float32 in C order)")]
    Unsupported(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// A float32 array and its shape.
#[derive(Clone, Debug, PartialEq)]
pub struct NpyF32 {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// Parses a `.npy` image holding a little-endian float32 C-order array.
pub fn parse_f32(bytes: &[u8]) -> Result<NpyF32, NpyError> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(NpyError::Format("missing \\x93NUMPY magic".into()));
    }
    let major = bytes[6];
    let (hlen, hstart) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10usize),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => return Err(NpyError::Format(format!("version {v}"))),
    };
    let header = bytes
        .get(hstart..hstart.saturating_add(hlen))
        .ok_or_else(|| NpyError::Format("header runs past the end".into()))?;
    let header =
        std::str::from_utf8(header).map_err(|_| NpyError::Format("header is not text".into()))?;
    if !header.contains("'descr': '<f4'") {
        return Err(NpyError::Unsupported(header.trim().to_string()));
    }
    if header.contains("'fortran_order': True") {
        return Err(NpyError::Unsupported("Fortran order".into()));
    }
    let shape_txt = header
        .split("'shape':")
        .nth(1)
        .and_then(|s| s.split('(').nth(1))
        .and_then(|s| s.split(')').next())
        .ok_or_else(|| NpyError::Format("no shape in header".into()))?;
    let shape = shape_txt
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>()
                .map_err(|_| NpyError::Format(format!("shape entry {s:?}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| NpyError::Format("shape overflows".into()))?;
    let body = &bytes[hstart + hlen..];
    if body.len() != n * 4 {
        return Err(NpyError::Format(format!(
            "{} data bytes for {n} float32 values",
            body.len()
        )));
    }
    let data = body
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok(NpyF32 { shape, data })
}

/// Writes a float32 C-order array as `.npy` version 1.0.
pub fn write_f32(w: &mut impl Write, shape: &[usize], data: &[f32]) -> Result<(), NpyError> {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let shape_txt = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape_txt}, }}");
    // Pad so that the data starts on a 64-byte boundary; end with '\n'.
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - total % 64) % 64));
    header.push('\n');
    w.write_all(b"\x93NUMPY\x01\x00")?;
    w.write_all(&(header.len() as u16).to_le_bytes())?;
    w.write_all(header.as_bytes())?;
    let mut buf = Vec::with_capacity(data.len() * 4);
    for v in data {
        buf.extend_from_slice(&v.to_le_bytes());
    }
    w.write_all(&buf)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let data: Vec<f32> = (0..6).map(|i| i as f32 * 0.5 - 1.0).collect();
        let mut buf = Vec::new();
        write_f32(&mut buf, &[2, 3], &data).unwrap();
        assert_eq!((buf.len() - data.len() * 4) % 64, 0);
        let a = parse_f32(&buf).unwrap();
        assert_eq!(a.shape, vec![2, 3]);
        assert_eq!(a.data, data);
        assert!(parse_f32(&buf[..buf.len() - 1]).is_err());
        assert!(parse_f32(b"nope").is_err());
    }
}
