//! Writes records into compressed, checksummed chunks.

use std::io::Write;

use crate::v1::{kind, Header, Record};
use crate::{
    chunk_crc, kind_bit, FormatError, CHUNK_HEADER_LEN, CHUNK_MAGIC, FORMAT_VERSION, MAGIC,
};

/// Uncompressed bytes buffered before a chunk is written out on its own.
const DEFAULT_CHUNK_TARGET: usize = 8 << 20;

/// Encoded records waiting to become one chunk.
#[derive(Default)]
struct Pending {
    buf: Vec<u8>,
    records: u32,
    kinds: u32,
}

/// Streams records into a capture. Call [`CaptureWriter::flush`] periodically so that a
/// crash loses at most what was buffered since; [`CaptureWriter::finish`] at the end.
///
/// Samples and all other records go into separate chunks, so that a reader after the few
/// metadata records (mappings, binaries, names) never inflates samples, and one after
/// samples never inflates the embedded binaries. A flush writes the metadata chunk first.
pub struct CaptureWriter<W: Write> {
    out: W,
    meta: Pending,
    samples: Pending,
    level: i32,
    chunk_target: usize,
    bytes_written: u64,
}

impl<W: Write> CaptureWriter<W> {
    /// Writes the file header and a first chunk holding `header`.
    pub fn new(mut out: W, header: &Header) -> Result<Self, FormatError> {
        out.write_all(&MAGIC)?;
        out.write_all(&FORMAT_VERSION.to_le_bytes())?;
        out.write_all(&0u16.to_le_bytes())?;
        let mut w = CaptureWriter {
            out,
            meta: Pending::default(),
            samples: Pending::default(),
            level: 3,
            chunk_target: DEFAULT_CHUNK_TARGET,
            bytes_written: crate::FILE_HEADER_LEN as u64,
        };
        w.push(&Record::Header(header.clone()))?;
        w.flush()?;
        Ok(w)
    }

    /// zstd level for later chunks (1–19; default 3).
    pub fn set_level(&mut self, level: i32) {
        self.level = level;
    }

    /// Uncompressed size at which a chunk is written without waiting for `flush`.
    pub fn set_chunk_target(&mut self, bytes: usize) {
        self.chunk_target = bytes.max(1);
    }

    /// Bytes written to the output so far.
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written
    }

    /// Buffers one record; writes a chunk when the buffer reaches the chunk target.
    pub fn push(&mut self, record: &Record) -> Result<(), FormatError> {
        // A sample's Lua frames travel with it, just before it in the same chunk.
        let is_sample = matches!(record.kind(), kind::SAMPLE | kind::LUA_STACK);
        let pending = if is_sample {
            &mut self.samples
        } else {
            &mut self.meta
        };
        let buf = &mut pending.buf;
        let start = buf.len();
        buf.extend_from_slice(&record.kind().to_le_bytes());
        buf.extend_from_slice(&[0; 4]);
        let res = record.encode_payload(buf);
        if let Err(e) = res {
            buf.truncate(start);
            return Err(e.into());
        }
        let len = (buf.len() - start - 6) as u32;
        buf[start + 2..start + 6].copy_from_slice(&len.to_le_bytes());
        pending.records += 1;
        pending.kinds |= kind_bit(record.kind());
        if pending.buf.len() >= self.chunk_target && record.kind() != kind::LUA_STACK {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes buffered records as chunks (metadata first) and flushes the output.
    pub fn flush(&mut self) -> Result<(), FormatError> {
        let meta = std::mem::take(&mut self.meta);
        self.write_chunk(&meta)?;
        let samples = std::mem::take(&mut self.samples);
        self.write_chunk(&samples)?;
        // Keep the allocations for the next chunks.
        self.meta = Pending {
            buf: meta.buf,
            ..Pending::default()
        };
        self.samples = Pending {
            buf: samples.buf,
            ..Pending::default()
        };
        self.meta.buf.clear();
        self.samples.buf.clear();
        self.out.flush()?;
        Ok(())
    }

    fn write_chunk(&mut self, p: &Pending) -> Result<(), FormatError> {
        if p.records == 0 {
            return Ok(());
        }
        let payload = zstd::bulk::compress(&p.buf, self.level)?;
        let mut head = [0u8; CHUNK_HEADER_LEN];
        head[0..4].copy_from_slice(&CHUNK_MAGIC.to_le_bytes());
        head[4..8].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        head[8..12].copy_from_slice(&(p.buf.len() as u32).to_le_bytes());
        head[12..16].copy_from_slice(&p.records.to_le_bytes());
        head[16..20].copy_from_slice(&p.kinds.to_le_bytes());
        let crc = chunk_crc(&head[..20], &payload);
        head[20..24].copy_from_slice(&crc.to_le_bytes());
        self.out.write_all(&head)?;
        self.out.write_all(&payload)?;
        self.bytes_written += (head.len() + payload.len()) as u64;
        Ok(())
    }

    /// Flushes and returns the output.
    pub fn finish(mut self) -> Result<W, FormatError> {
        self.flush()?;
        Ok(self.out)
    }
}
