//! Writes records into compressed, checksummed chunks.

use std::io::Write;

use crate::v1::{Header, Record};
use crate::{bincode_config, chunk_crc, FormatError, CHUNK_MAGIC, FORMAT_VERSION, MAGIC};

/// Uncompressed bytes buffered before a chunk is written out on its own.
const DEFAULT_CHUNK_TARGET: usize = 8 << 20;

/// Streams records into a capture. Call [`CaptureWriter::flush`] periodically so that a
/// crash loses at most what was buffered since; [`CaptureWriter::finish`] at the end.
pub struct CaptureWriter<W: Write> {
    out: W,
    buf: Vec<u8>,
    records: u32,
    kinds: u32,
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
            buf: Vec::new(),
            records: 0,
            kinds: 0,
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
        let start = self.buf.len();
        self.buf.extend_from_slice(&record.kind().to_le_bytes());
        self.buf.extend_from_slice(&[0; 4]);
        let cfg = bincode_config();
        let res = match record {
            Record::Header(r) => bincode::serde::encode_into_std_write(r, &mut self.buf, cfg),
            Record::Process(r) => bincode::serde::encode_into_std_write(r, &mut self.buf, cfg),
            Record::ThreadName(r) => bincode::serde::encode_into_std_write(r, &mut self.buf, cfg),
            Record::Mapping(r) => bincode::serde::encode_into_std_write(r, &mut self.buf, cfg),
            Record::Binary(r) => bincode::serde::encode_into_std_write(r, &mut self.buf, cfg),
            Record::Sample(r) => bincode::serde::encode_into_std_write(r, &mut self.buf, cfg),
            Record::Lost(r) => bincode::serde::encode_into_std_write(r, &mut self.buf, cfg),
            Record::End(r) => bincode::serde::encode_into_std_write(r, &mut self.buf, cfg),
            Record::KernelSymbols(r) => {
                bincode::serde::encode_into_std_write(r, &mut self.buf, cfg)
            }
            Record::Unknown { payload, .. } => {
                self.buf.extend_from_slice(payload);
                Ok(payload.len())
            }
        };
        if let Err(e) = res {
            self.buf.truncate(start);
            return Err(e.into());
        }
        let len = (self.buf.len() - start - 6) as u32;
        self.buf[start + 2..start + 6].copy_from_slice(&len.to_le_bytes());
        self.records += 1;
        self.kinds |= crate::kind_bit(record.kind());
        if self.buf.len() >= self.chunk_target {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes buffered records as one chunk and flushes the output.
    pub fn flush(&mut self) -> Result<(), FormatError> {
        if self.records > 0 {
            let payload = zstd::bulk::compress(&self.buf, self.level)?;
            let mut head = [0u8; crate::CHUNK_HEADER_LEN];
            head[0..4].copy_from_slice(&CHUNK_MAGIC.to_le_bytes());
            head[4..8].copy_from_slice(&(payload.len() as u32).to_le_bytes());
            head[8..12].copy_from_slice(&(self.buf.len() as u32).to_le_bytes());
            head[12..16].copy_from_slice(&self.records.to_le_bytes());
            head[16..20].copy_from_slice(&self.kinds.to_le_bytes());
            let crc = chunk_crc(&head[..20], &payload);
            head[20..24].copy_from_slice(&crc.to_le_bytes());
            self.out.write_all(&head)?;
            self.out.write_all(&payload)?;
            self.bytes_written += (head.len() + payload.len()) as u64;
            self.buf.clear();
            self.records = 0;
            self.kinds = 0;
        }
        self.out.flush()?;
        Ok(())
    }

    /// Flushes and returns the output.
    pub fn finish(mut self) -> Result<W, FormatError> {
        self.flush()?;
        Ok(self.out)
    }
}
