//! A minimal reader of SentencePiece's `tokenizer.model` (a protobuf
//! `ModelProto`): the pieces with their scores and types, and the
//! normalizer's `add_dummy_prefix`. Everything else is skipped.

use crate::error::{ConvertError, Result};

/// SentencePiece piece types (`ModelProto.SentencePiece.Type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PieceType {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

#[derive(Clone, Debug)]
pub struct Piece {
    pub text: String,
    pub score: f32,
    pub kind: PieceType,
}

#[derive(Clone, Debug)]
pub struct SpmModel {
    pub pieces: Vec<Piece>,
    /// `normalizer_spec.add_dummy_prefix` (default true).
    pub add_dummy_prefix: bool,
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

fn bad(reason: impl Into<String>) -> ConvertError {
    ConvertError::Tokenizer(format!("tokenizer.model: {}", reason.into()))
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self
                .buf
                .get(self.pos)
                .ok_or_else(|| bad("truncated varint"))?;
            self.pos += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(bad("varint longer than 10 bytes"))
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or_else(|| bad("field runs past the end of the file"))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    /// Next (field number, wire type), or `None` at the end.
    fn key(&mut self) -> Result<Option<(u64, u8)>> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let k = self.varint()?;
        Ok(Some((k >> 3, (k & 7) as u8)))
    }

    /// Reads a value of wire type `wt`: length-delimited payload or nothing.
    fn value(&mut self, wt: u8) -> Result<Option<&'a [u8]>> {
        match wt {
            0 => {
                self.varint()?;
                Ok(None)
            }
            1 => self.bytes(8).map(|_| None),
            2 => {
                let n = self.varint()? as usize;
                self.bytes(n).map(Some)
            }
            5 => self.bytes(4).map(|_| None),
            other => Err(bad(format!("unsupported protobuf wire type {other}"))),
        }
    }
}

fn parse_piece(buf: &[u8]) -> Result<Piece> {
    let mut r = Reader { buf, pos: 0 };
    let mut p = Piece {
        text: String::new(),
        score: 0.0,
        kind: PieceType::Normal,
    };
    while let Some((field, wt)) = r.key()? {
        match (field, wt) {
            (1, 2) => {
                let n = r.varint()? as usize;
                p.text = String::from_utf8(r.bytes(n)?.to_vec())
                    .map_err(|_| bad("a piece is not UTF-8"))?;
            }
            (2, 5) => {
                let b = r.bytes(4)?;
                p.score = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
            (3, 0) => {
                p.kind = match r.varint()? {
                    2 => PieceType::Unknown,
                    3 => PieceType::Control,
                    4 => PieceType::UserDefined,
                    5 => PieceType::Unused,
                    6 => PieceType::Byte,
                    _ => PieceType::Normal,
                }
            }
            (_, wt) => {
                r.value(wt)?;
            }
        }
    }
    Ok(p)
}

impl SpmModel {
    pub fn parse(buf: &[u8]) -> Result<SpmModel> {
        let mut r = Reader { buf, pos: 0 };
        let mut m = SpmModel {
            pieces: Vec::new(),
            add_dummy_prefix: true,
        };
        while let Some((field, wt)) = r.key()? {
            match (field, wt) {
                (1, 2) => {
                    let n = r.varint()? as usize;
                    m.pieces.push(parse_piece(r.bytes(n)?)?);
                }
                (3, 2) => {
                    // NormalizerSpec: field 3 = add_dummy_prefix.
                    let n = r.varint()? as usize;
                    let mut nr = Reader {
                        buf: r.bytes(n)?,
                        pos: 0,
                    };
                    while let Some((f, w)) = nr.key()? {
                        if (f, w) == (3, 0) {
                            m.add_dummy_prefix = nr.varint()? != 0;
                        } else {
                            nr.value(w)?;
                        }
                    }
                }
                (_, wt) => {
                    r.value(wt)?;
                }
            }
        }
        if m.pieces.is_empty() {
            return Err(bad("no pieces (not a SentencePiece model?)"));
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(n: u64, wt: u64, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![((n << 3) | wt) as u8];
        if wt == 2 {
            v.push(payload.len() as u8);
        }
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn parses_pieces() {
        let mut piece = field(1, 2, b"<unk>");
        piece.extend(field(2, 5, &0f32.to_le_bytes()));
        piece.extend(field(3, 0, &[2]));
        let mut piece2 = field(1, 2, "▁a".as_bytes());
        piece2.extend(field(2, 5, &(-1.5f32).to_le_bytes()));
        let mut model = field(1, 2, &piece);
        model.extend(field(1, 2, &piece2));
        model.extend(field(3, 2, &[0x18, 0x00]));
        let m = SpmModel::parse(&model).unwrap();
        assert_eq!(m.pieces.len(), 2);
        assert_eq!(m.pieces[0].kind, PieceType::Unknown);
        assert_eq!(m.pieces[1].text, "▁a");
        assert_eq!(m.pieces[1].score, -1.5);
        assert!(!m.add_dummy_prefix);
        assert!(SpmModel::parse(&[0x0a, 0x05, 0x01]).is_err());
    }
}
