//! The protobuf wire format, as much of it as profile.proto needs: varints,
//! length-delimited fields and packed repeated integers.
//!
//! Fields holding their default value (0, false) are left out, as proto3 encoders do;
//! strings and messages are always written, since an element of a repeated field (such as
//! `string_table[0] == ""`) must be present even when empty.

use std::io::{self, Write};

/// Wire type of varint fields (integers, bools).
const VARINT: u64 = 0;
/// Wire type of length-delimited fields (strings, bytes, messages, packed repeated).
const LEN: u64 = 2;

/// Appends `value` as a base-128 varint, low 7 bits first.
pub fn put_varint(buf: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        buf.push(value as u8 | 0x80);
        value >>= 7;
    }
    buf.push(value as u8);
}

/// The encoding of one message, built field by field.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Message {
    buf: Vec<u8>,
}

impl Message {
    pub fn new() -> Message {
        Message::default()
    }

    /// The encoded fields.
    #[cfg(test)]
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// An unsigned integer field (`uint64`), left out when 0.
    pub fn uint(&mut self, field: u32, value: u64) -> &mut Self {
        if value != 0 {
            self.key(field, VARINT);
            put_varint(&mut self.buf, value);
        }
        self
    }

    /// A signed integer field (`int64`: two's complement, so negative values take 10
    /// bytes), left out when 0.
    pub fn int(&mut self, field: u32, value: i64) -> &mut Self {
        self.uint(field, value as u64)
    }

    /// A `bool` field, left out when false.
    pub fn bool(&mut self, field: u32, value: bool) -> &mut Self {
        self.uint(field, u64::from(value))
    }

    /// A length-delimited field: a string, bytes or an encoded message.
    pub fn len_delimited(&mut self, field: u32, bytes: &[u8]) -> &mut Self {
        self.key(field, LEN);
        put_varint(&mut self.buf, bytes.len() as u64);
        self.buf.extend_from_slice(bytes);
        self
    }

    /// A message field (or one element of a repeated message field).
    pub fn message(&mut self, field: u32, message: &Message) -> &mut Self {
        self.len_delimited(field, &message.buf)
    }

    /// A packed repeated integer field (`repeated uint64`/`int64`), left out when empty.
    pub fn packed(&mut self, field: u32, values: impl IntoIterator<Item = u64>) -> &mut Self {
        let mut packed = Vec::new();
        for v in values {
            put_varint(&mut packed, v);
        }
        if !packed.is_empty() {
            self.len_delimited(field, &packed);
        }
        self
    }

    /// Writes this message's fields to `out` and empties it, so that the fields of a
    /// large outer message can be streamed instead of held whole.
    pub fn flush_to(&mut self, out: &mut dyn Write) -> io::Result<()> {
        out.write_all(&self.buf)?;
        self.buf.clear();
        Ok(())
    }

    fn key(&mut self, field: u32, wire_type: u64) {
        put_varint(&mut self.buf, (u64::from(field) << 3) | wire_type);
    }
}

/// A minimal decoder, for tests: the fields of one message in order.
#[cfg(test)]
pub mod decode {
    /// A decoded field's value.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Value<'a> {
        Varint(u64),
        Bytes(&'a [u8]),
    }

    /// Reads a varint at `*pos`, advancing it.
    pub fn varint(buf: &[u8], pos: &mut usize) -> u64 {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let b = buf[*pos];
            *pos += 1;
            value |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return value;
            }
        }
        panic!("varint longer than 10 bytes");
    }

    /// `(field number, value)` of every field of a message, in order.
    pub fn fields(buf: &[u8]) -> Vec<(u32, Value<'_>)> {
        let mut pos = 0;
        let mut out = Vec::new();
        while pos < buf.len() {
            let key = varint(buf, &mut pos);
            let field = (key >> 3) as u32;
            match key & 7 {
                0 => out.push((field, Value::Varint(varint(buf, &mut pos)))),
                2 => {
                    let len = varint(buf, &mut pos) as usize;
                    out.push((field, Value::Bytes(&buf[pos..pos + len])));
                    pos += len;
                }
                t => panic!("unexpected wire type {t}"),
            }
        }
        out
    }

    /// The integers of a packed repeated field.
    pub fn packed(buf: &[u8]) -> Vec<u64> {
        let mut pos = 0;
        let mut out = Vec::new();
        while pos < buf.len() {
            out.push(varint(buf, &mut pos));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(v: u64) -> Vec<u8> {
        let mut buf = Vec::new();
        put_varint(&mut buf, v);
        buf
    }

    #[test]
    fn varints_are_little_endian_base_128() {
        assert_eq!(varint(0), [0x00]);
        assert_eq!(varint(1), [0x01]);
        assert_eq!(varint(127), [0x7f]);
        assert_eq!(varint(128), [0x80, 0x01]);
        // The protobuf documentation's example.
        assert_eq!(varint(150), [0x96, 0x01]);
        assert_eq!(varint(300), [0xac, 0x02]);
        assert_eq!(
            varint(u64::MAX),
            [0xff; 9]
                .iter()
                .chain(&[0x01])
                .copied()
                .collect::<Vec<u8>>()
        );
        for v in [0, 1, 127, 128, 150, 16_383, 16_384, 1 << 35, u64::MAX] {
            let buf = varint(v);
            let mut pos = 0;
            assert_eq!(decode::varint(&buf, &mut pos), v);
            assert_eq!(pos, buf.len());
        }
    }

    #[test]
    fn fields_are_keyed_and_defaults_left_out() {
        let mut inner = Message::new();
        inner.uint(1, 150);
        let mut m = Message::new();
        m.uint(1, 0)
            .int(2, -1)
            .bool(3, true)
            .bool(4, false)
            .len_delimited(5, b"")
            .len_delimited(6, b"hi")
            .message(7, &inner)
            .packed(8, [3, 270])
            .packed(9, []);
        let mut expected = vec![0x10];
        expected.extend([0xff; 9]);
        expected.push(0x01);
        expected.extend([0x18, 0x01]); // field 3, varint 1
        expected.extend([0x2a, 0x00]); // field 5, length 0
        expected.extend([0x32, 0x02, b'h', b'i']);
        expected.extend([0x3a, 0x03, 0x08, 0x96, 0x01]);
        expected.extend([0x42, 0x03, 0x03, 0x8e, 0x02]);
        assert_eq!(m.bytes(), expected.as_slice());
        let fields = decode::fields(m.bytes());
        assert_eq!(fields[0], (2, decode::Value::Varint(u64::MAX)));
        assert_eq!(fields[5], (8, decode::Value::Bytes(&[0x03, 0x8e, 0x02])));
        assert_eq!(decode::packed(&[0x03, 0x8e, 0x02]), [3, 270]);
    }

    #[test]
    fn flush_streams_and_empties() {
        let mut m = Message::new();
        m.uint(1, 1);
        let mut out = Vec::new();
        m.flush_to(&mut out).unwrap();
        m.uint(2, 2);
        m.flush_to(&mut out).unwrap();
        assert_eq!(out, [0x08, 0x01, 0x10, 0x02]);
        assert!(m.bytes().is_empty());
    }
}
