//! The lrec capture format.
//!
//! A capture is a file header followed by a stream of chunks:
//!
//! ```text
//! file   := MAGIC (8 bytes) version (u16 LE) reserved (u16) chunk*
//! chunk  := CHUNK_MAGIC (u32 LE) compressed_len (u32) uncompressed_len (u32)
//!           record_count (u32) kinds (u32) crc32(header[0..20] ++ payload) (u32) payload
//! payload:= zstd frame of record*
//! record := kind (u16 LE) len (u32 LE) bincode(struct)
//! ```
//!
//! `kinds` has bit `k` set when the chunk holds a record of kind `k` (bit 31 for kinds
//! ≥ 31), so a reader can skip chunks without inflating them.
//!
//! Chunks decode independently, so a capture cut short by a crash or a full disk is
//! readable up to its last complete chunk, and a corrupt chunk is skipped (the reader
//! resynchronises on the next chunk magic). Unknown record kinds are skipped, not fatal.
//! This crate performs no I/O beyond reading and writing the streams it is handed. What
//! lrec and lanalyze know about binaries, Lua VMs and output files is `lrec-inspect`'s.

mod codec;
pub mod heap;
mod reader;
pub mod v1;
mod writer;

pub use heap::*;
pub use reader::{Capture, ChunkRef, ReadWarning};
pub use v1::*;
pub use writer::{CaptureSink, CaptureWriter, Chunk, SampleSpan};

/// First bytes of every capture. The `\r\n\x1a` catch text-mode and truncation damage.
pub const MAGIC: [u8; 8] = *b"\x89LREC\r\n\x1a";
/// The version this crate writes.
pub const FORMAT_VERSION: u16 = 1;
/// Starts every chunk, so a reader can find the next chunk after damage.
pub const CHUNK_MAGIC: u32 = u32::from_le_bytes(*b"LRCK");
pub(crate) const FILE_HEADER_LEN: usize = 12;
pub(crate) const CHUNK_HEADER_LEN: usize = 24;
/// No chunk is larger than this, compressed or not; larger length fields are damage.
pub const MAX_CHUNK_LEN: u32 = 256 << 20;

/// Errors of reading or writing a capture.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("not an lrec capture (bad magic); was it written by lrec?")]
    BadMagic,
    #[error("capture format version {found} is newer than this lanalyze understands ({supported}); upgrade lanalyze")]
    UnsupportedVersion { found: u16, supported: u16 },
    #[error("capture is too short to hold a header ({0} bytes)")]
    TooShort(usize),
    #[error("chunk at offset {offset}: {what}")]
    BadChunk { offset: u64, what: String },
    #[error("record encoding failed: {0}")]
    Encode(#[from] bincode::error::EncodeError),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
}

/// The checksum covers the chunk header too, so a damaged length or kinds field is
/// caught like damaged data.
pub(crate) fn chunk_crc(header: &[u8], payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(header);
    h.update(payload);
    h.finalize()
}

/// The bit of record kind `kind` in a chunk's `kinds` mask.
pub fn kind_bit(kind: u16) -> u32 {
    1 << kind.min(31)
}

pub(crate) fn bincode_config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<{ MAX_CHUNK_LEN as usize }>()
}
