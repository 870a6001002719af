//! Writes records into compressed, checksummed chunks.

use std::io::{self, Write};

use crate::codec::LastLuaStacks;
use crate::v1::{kind, Header, LuaFrame, LuaStack, Record};
use crate::{
    chunk_crc, kind_bit, FormatError, CHUNK_HEADER_LEN, CHUNK_MAGIC, FORMAT_VERSION, MAGIC,
};

/// Uncompressed bytes buffered before a chunk is written out on its own.
const DEFAULT_CHUNK_TARGET: usize = 4 << 20;

/// The samples of a chunk: how many, and the first and last sample time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleSpan {
    pub samples: u64,
    /// Sample times ([`crate::Sample::time_ns`]) of the earliest and latest sample (0 when
    /// there are none).
    pub first_ns: u64,
    pub last_ns: u64,
}

impl SampleSpan {
    /// Adds the samples of `other`.
    pub fn merge(&mut self, other: &SampleSpan) {
        if other.samples == 0 {
            return;
        }
        if self.samples == 0 {
            *self = *other;
            return;
        }
        self.samples += other.samples;
        self.first_ns = self.first_ns.min(other.first_ns);
        self.last_ns = self.last_ns.max(other.last_ns);
    }

    /// Seconds from the first sample to the last.
    pub fn secs(&self) -> f64 {
        (self.last_ns - self.first_ns) as f64 / 1e9
    }
}

/// Encoded records waiting to become one chunk.
#[derive(Default)]
struct Pending {
    buf: Vec<u8>,
    records: u32,
    kinds: u32,
    samples: SampleSpan,
    /// The last Lua stack of each thread in this chunk.
    lua_last: LastLuaStacks,
}

impl Pending {
    /// [`Self::push`] of a Lua stack whose frames are `frames` and whose `known` outer
    /// frames its pusher knows are those of the last stack it pushed for the thread.
    fn push_lua_stack(&mut self, stack: &LuaStack, frames: &[LuaFrame], known: usize) {
        let shared = self
            .lua_last
            .share_known(stack.tid, stack.pid, frames, known);
        let framed: Result<(), std::convert::Infallible> =
            self.framed(lua_stack_kind(shared), |buf| {
                crate::codec::encode_lua_parts(stack, frames, shared, buf);
                Ok(())
            });
        let Ok(()) = framed;
    }

    fn push(&mut self, record: &Record) -> Result<(), FormatError> {
        let shared = match record {
            Record::LuaStack(s) => self.lua_last.share(s),
            _ => 0,
        };
        let k = match shared {
            0 => record.kind(),
            _ => lua_stack_kind(shared),
        };
        self.framed(k, |buf| match record {
            Record::LuaStack(s) if shared > 0 => {
                crate::codec::encode_lua_parts(s, &s.frames, shared, buf);
                Ok(())
            }
            _ => record.encode_payload(buf).map_err(FormatError::from),
        })?;
        let sample = match record {
            Record::Sample(s) => Some(s),
            Record::OffCpu(o) => Some(&o.sample),
            _ => None,
        };
        if let Some(s) = sample {
            let t = s.time_ns;
            self.samples.merge(&SampleSpan {
                samples: 1,
                first_ns: t,
                last_ns: t,
            });
        }
        Ok(())
    }

    /// Appends a record of kind `k` whose body `body` writes: its header, its length once
    /// written (nothing kept when `body` fails), and the chunk's counts.
    fn framed<E>(
        &mut self,
        k: u16,
        body: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<(), E> {
        let buf = &mut self.buf;
        let start = buf.len();
        buf.extend_from_slice(&k.to_le_bytes());
        buf.extend_from_slice(&[0; 4]);
        if let Err(e) = body(buf) {
            buf.truncate(start);
            return Err(e);
        }
        let len = (buf.len() - start - 6) as u32;
        buf[start + 2..start + 6].copy_from_slice(&len.to_le_bytes());
        self.records += 1;
        self.kinds |= kind_bit(k);
        Ok(())
    }

    fn encode(&self, level: i32) -> Result<Chunk, FormatError> {
        let payload = zstd::bulk::compress(&self.buf, level)?;
        let mut bytes = Vec::with_capacity(CHUNK_HEADER_LEN + payload.len());
        bytes.extend_from_slice(&CHUNK_MAGIC.to_le_bytes());
        bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&(self.buf.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&self.records.to_le_bytes());
        bytes.extend_from_slice(&self.kinds.to_le_bytes());
        let crc = chunk_crc(&bytes[..20], &payload);
        bytes.extend_from_slice(&crc.to_le_bytes());
        bytes.extend_from_slice(&payload);
        Ok(Chunk {
            bytes,
            records: self.records,
            kinds: self.kinds,
            samples: self.samples,
        })
    }
}

/// The kind of a Lua stack record that shares `shared` outer frames with its thread's last.
fn lua_stack_kind(shared: usize) -> u16 {
    match shared {
        0 => kind::LUA_STACK,
        _ => kind::LUA_STACK_SHARED,
    }
}

/// One complete chunk as it appears in a capture: header and compressed records, with
/// what its header says and the span of its samples (which the file does not hold).
#[derive(Clone, Debug)]
pub struct Chunk {
    bytes: Vec<u8>,
    records: u32,
    kinds: u32,
    samples: SampleSpan,
}

impl Chunk {
    /// Encodes `records` as one chunk (zstd `level`), in order.
    pub fn encode(records: &[Record], level: i32) -> Result<Chunk, FormatError> {
        let mut pending = Pending::default();
        for r in records {
            pending.push(r)?;
        }
        pending.encode(level)
    }

    /// A chunk of records already encoded (`kind, len, bincode` each, as
    /// [`crate::Capture::inflate_chunk`] returns them), trusted as they are: for tools that
    /// rewrite captures and for the fuzz tests, which feed damaged records past the
    /// checksum.
    pub fn from_encoded(
        records: &[u8],
        count: u32,
        kinds: u32,
        level: i32,
    ) -> Result<Chunk, FormatError> {
        let pending = Pending {
            buf: records.to_vec(),
            records: count,
            kinds,
            samples: SampleSpan::default(),
            lua_last: LastLuaStacks::default(),
        };
        pending.encode(level)
    }

    /// The chunk's bytes, to be written as they are.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Bit `k` set: the chunk holds records of kind `k` (see [`crate::kind_bit`]).
    pub fn kinds(&self) -> u32 {
        self.kinds
    }

    pub fn records(&self) -> u32 {
        self.records
    }

    /// Its samples' count and times.
    pub fn samples(&self) -> SampleSpan {
        self.samples
    }
}

/// Where a [`CaptureWriter`] puts a capture: the file header once, then whole chunks.
/// Every [`io::Write`] is one (it gets the capture's bytes in order); lrec's flight
/// recorder keeps the chunks apart instead, to drop old samples and write the rest later.
pub trait CaptureSink {
    fn write_file_header(&mut self, bytes: &[u8]) -> io::Result<()>;
    fn write_chunk(&mut self, chunk: Chunk) -> io::Result<()>;
    fn flush(&mut self) -> io::Result<()>;
}

impl<W: Write> CaptureSink for W {
    fn write_file_header(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.write_all(bytes)
    }

    fn write_chunk(&mut self, chunk: Chunk) -> io::Result<()> {
        self.write_all(chunk.as_bytes())
    }

    fn flush(&mut self) -> io::Result<()> {
        Write::flush(self)
    }
}

/// Streams records into a capture. Call [`CaptureWriter::flush`] periodically so that a
/// crash loses at most what was buffered since; [`CaptureWriter::finish`] at the end.
///
/// Samples and all other records go into separate chunks, so that a reader after the few
/// metadata records (mappings, binaries, names) never inflates samples, and one after
/// samples never inflates the embedded binaries. A flush writes the metadata chunk first.
pub struct CaptureWriter<W: CaptureSink> {
    out: W,
    meta: Pending,
    samples: Pending,
    level: i32,
    chunk_target: usize,
    bytes_written: u64,
}

impl<W: CaptureSink> CaptureWriter<W> {
    /// Writes the file header and a first chunk holding `header`.
    pub fn new(mut out: W, header: &Header) -> Result<Self, FormatError> {
        let mut file_header = [0u8; crate::FILE_HEADER_LEN];
        file_header[..8].copy_from_slice(&MAGIC);
        file_header[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.write_file_header(&file_header)?;
        let mut w = CaptureWriter {
            out,
            meta: Pending::default(),
            samples: Pending::default(),
            level: 1,
            chunk_target: DEFAULT_CHUNK_TARGET,
            bytes_written: crate::FILE_HEADER_LEN as u64,
        };
        w.push(&Record::Header(header.clone()))?;
        w.flush()?;
        Ok(w)
    }

    /// zstd level for later chunks (1–19; default 1, as `perf record -z`: stack bytes
    /// compress nearly as well at 1 as at 3, at half the CPU time).
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

    pub fn get_ref(&self) -> &W {
        &self.out
    }

    /// The output; writing to it directly would put bytes between chunks.
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.out
    }

    /// Buffers one record; writes a chunk when the buffer reaches the chunk target.
    pub fn push(&mut self, record: &Record) -> Result<(), FormatError> {
        // A sample's Lua frames travel with it, just before it in the same chunk.
        let is_sample = matches!(
            record.kind(),
            kind::SAMPLE
                | kind::LUA_STACK
                | kind::OFF_CPU
                | kind::THREAD_STATES
                | kind::LATENCY_CALL
        );
        let pending = if is_sample {
            &mut self.samples
        } else {
            &mut self.meta
        };
        pending.push(record)?;
        if pending.buf.len() >= self.chunk_target && record.kind() != kind::LUA_STACK {
            self.flush()?;
        }
        Ok(())
    }

    /// Pushes a sample's Lua stack, as [`Self::push`] would `Record::LuaStack` with `frames`
    /// for `stack`'s frames (which are not read), knowing that its `known` outermost
    /// frames are those of the last Lua stack pushed for its thread: a deep stack's frames,
    /// shared with the thread's last sample, are neither copied nor compared again. The
    /// pusher's knowledge is taken as it is; 0 is always right.
    pub fn push_lua_stack(
        &mut self,
        stack: &LuaStack,
        frames: &[LuaFrame],
        known: usize,
    ) -> Result<(), FormatError> {
        self.samples.push_lua_stack(stack, frames, known);
        Ok(())
    }

    /// Writes buffered records as chunks (metadata first) and flushes the output.
    pub fn flush(&mut self) -> Result<(), FormatError> {
        self.write_pending()?;
        self.out.flush()?;
        Ok(())
    }

    /// Writes buffered records as chunks, metadata first.
    fn write_pending(&mut self) -> Result<(), FormatError> {
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
        Ok(())
    }

    fn write_chunk(&mut self, p: &Pending) -> Result<(), FormatError> {
        if p.records == 0 {
            return Ok(());
        }
        let chunk = p.encode(self.level)?;
        self.bytes_written += chunk.as_bytes().len() as u64;
        self.out.write_chunk(chunk)?;
        Ok(())
    }

    /// Writes a chunk of another capture as it is, after what is buffered.
    pub fn copy_chunk(&mut self, chunk: &Chunk) -> Result<(), FormatError> {
        self.write_pending()?;
        self.bytes_written += chunk.as_bytes().len() as u64;
        self.out.write_chunk(chunk.clone())?;
        Ok(())
    }

    /// Writes a chunk encoded elsewhere ([`Chunk::encode`], on another thread), after the
    /// chunks written so far; records buffered here stay buffered. For records that may
    /// stand anywhere in a capture (metadata), not samples.
    pub fn write_encoded(&mut self, chunk: Chunk) -> Result<(), FormatError> {
        self.bytes_written += chunk.as_bytes().len() as u64;
        self.out.write_chunk(chunk)?;
        Ok(())
    }

    /// zstd level of the chunks this writer encodes.
    pub fn level(&self) -> i32 {
        self.level
    }

    /// Flushes and returns the output.
    pub fn finish(mut self) -> Result<W, FormatError> {
        self.flush()?;
        Ok(self.out)
    }
}
