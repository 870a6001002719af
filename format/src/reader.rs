//! Reads captures: validates chunks, skips damage, decodes records.

use std::path::Path;

use crate::codec::{decode, LastLuaStacks};
use crate::v1::{kind, LuaStack, Record, RecordRef};
use crate::{
    chunk_crc, kind_bit, FormatError, CHUNK_HEADER_LEN, CHUNK_MAGIC, FILE_HEADER_LEN,
    FORMAT_VERSION, MAGIC, MAX_CHUNK_LEN,
};

/// Something wrong with a capture that did not stop it from being read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadWarning {
    /// The file ends inside a chunk: the recording was cut short.
    Truncated { offset: u64, missing: u64 },
    /// Bytes that are not a valid chunk were skipped.
    Corrupt { offset: u64, len: u64, what: String },
    /// Records of kinds this reader does not know were skipped.
    UnknownKind { kind: u16, count: u64 },
    /// A record did not decode and was skipped.
    BadRecord {
        chunk_offset: u64,
        kind: u16,
        what: String,
    },
    /// There is no end record: the recorder was killed or the disk filled up.
    NoEnd,
}

impl std::fmt::Display for ReadWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadWarning::Truncated { offset, missing } => write!(
                f,
                "capture was cut short: the chunk at offset {offset} lacks {missing} bytes; \
                 everything before it was read"
            ),
            ReadWarning::Corrupt { offset, len, what } => {
                write!(f, "skipped {len} corrupt bytes at offset {offset}: {what}")
            }
            ReadWarning::UnknownKind { kind, count } => write!(
                f,
                "skipped {count} records of unknown kind {kind} (written by a newer lrec?)"
            ),
            ReadWarning::BadRecord {
                chunk_offset,
                kind,
                what,
            } => write!(
                f,
                "skipped a record of kind {kind} in the chunk at offset {chunk_offset}: {what}"
            ),
            ReadWarning::NoEnd => write!(
                f,
                "capture has no end record: recording was cut short (killed, crashed or disk \
                 full); all complete chunks were read"
            ),
        }
    }
}

/// A valid chunk's place in the capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkRef {
    pub offset: u64,
    pub compressed_len: u32,
    pub uncompressed_len: u32,
    pub records: u32,
    /// Bit `k` set: the chunk holds records of kind `k` (see [`crate::kind_bit`]).
    pub kinds: u32,
}

enum Bytes {
    Map(memmap2::Mmap),
    Owned(Vec<u8>),
}

/// A capture opened for reading. Chunks are located and checksummed up front; records are
/// decoded chunk by chunk (independently, so in parallel if the caller likes).
pub struct Capture {
    bytes: Bytes,
    version: u16,
    chunks: Vec<ChunkRef>,
    warnings: Vec<ReadWarning>,
}

impl Capture {
    /// Maps a capture file.
    pub fn open(path: &Path) -> Result<Capture, FormatError> {
        let file = std::fs::File::open(path)?;
        // SAFETY: the file is only read; a concurrent writer can at worst make chunks fail
        // their checksum, which the reader handles like any damage.
        let map = unsafe { memmap2::Mmap::map(&file)? };
        Capture::new(Bytes::Map(map))
    }

    /// Reads a capture held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Capture, FormatError> {
        Capture::new(Bytes::Owned(bytes))
    }

    fn new(bytes: Bytes) -> Result<Capture, FormatError> {
        let data: &[u8] = match &bytes {
            Bytes::Map(m) => m,
            Bytes::Owned(v) => v,
        };
        if data.len() < FILE_HEADER_LEN {
            if data.len() >= 4 && data[..4] != MAGIC[..4] {
                return Err(FormatError::BadMagic);
            }
            return Err(FormatError::TooShort(data.len()));
        }
        if data[..8] != MAGIC {
            return Err(FormatError::BadMagic);
        }
        let version = u16::from_le_bytes([data[8], data[9]]);
        if version > FORMAT_VERSION || version == 0 {
            return Err(FormatError::UnsupportedVersion {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        let (chunks, warnings) = scan_chunks(data);
        Ok(Capture {
            bytes,
            version,
            chunks,
            warnings,
        })
    }

    fn data(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Map(m) => m,
            Bytes::Owned(v) => v,
        }
    }

    pub fn version(&self) -> u16 {
        self.version
    }

    pub fn len(&self) -> u64 {
        self.data().len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// The valid chunks, in file order.
    pub fn chunks(&self) -> &[ChunkRef] {
        &self.chunks
    }

    /// Damage found while locating chunks.
    pub fn warnings(&self) -> &[ReadWarning] {
        &self.warnings
    }

    /// Decodes one chunk. Records that fail to decode are skipped and reported.
    pub fn decode_chunk(&self, chunk: &ChunkRef) -> (Vec<Record>, Vec<ReadWarning>) {
        let mut records = Vec::with_capacity(chunk.records.min(1 << 16) as usize);
        let warnings = self.visit_chunk(
            chunk,
            |_| true,
            |r| {
                records.push(match r {
                    RecordRef::Sample(s) => Record::Sample(s.to_owned()),
                    RecordRef::OffCpu(o) => Record::OffCpu(o.to_owned()),
                    RecordRef::Other(r) => r,
                })
            },
        );
        (records, warnings)
    }

    /// A chunk's records as stored: its payload inflated, not decoded.
    pub fn inflate_chunk(&self, chunk: &ChunkRef) -> Result<Vec<u8>, ReadWarning> {
        let mut raw = Vec::new();
        self.inflate_into(chunk, &mut raw).map(|()| raw)
    }

    /// Inflates a chunk's payload into `raw` (cleared first; left empty on damage).
    fn inflate_into(&self, chunk: &ChunkRef, raw: &mut Vec<u8>) -> Result<(), ReadWarning> {
        let start = chunk.offset as usize + CHUNK_HEADER_LEN;
        let payload = &self.data()[start..start + chunk.compressed_len as usize];
        raw.clear();
        raw.reserve(chunk.uncompressed_len as usize);
        // Inflates into the spare capacity: no zeroing of the buffer first.
        let inflated =
            zstd::bulk::Decompressor::new().and_then(|mut d| d.decompress_to_buffer(payload, raw));
        let damage = match inflated {
            Ok(n) if n == chunk.uncompressed_len as usize => return Ok(()),
            Ok(n) => format!("inflates to {n} bytes"),
            Err(e) => format!("zstd: {e}"),
        };
        raw.clear();
        Err(corrupt(chunk, damage))
    }

    /// Decodes one chunk in place, calling `visit` on each record whose kind `want`
    /// accepts; other records are skipped without being decoded. Samples borrow their
    /// stack bytes from a per-thread buffer, so nothing is copied or allocated per
    /// sample: this is the fast path for analysis.
    pub fn visit_chunk(
        &self,
        chunk: &ChunkRef,
        mut want: impl FnMut(u16) -> bool,
        mut visit: impl FnMut(RecordRef<'_>),
    ) -> Vec<ReadWarning> {
        let mut warnings = Vec::new();
        // Reuse one buffer per thread: fresh multi-MiB buffers cost more in page faults
        // than decompression itself.
        let mut raw = CHUNK_BUFFER.with(|b| b.take());
        if let Err(w) = self.inflate_into(chunk, &mut raw) {
            warnings.push(w);
        }
        let mut unknown: Vec<(u16, u64)> = Vec::new();
        // Lua stacks sharing frames with earlier ones are rebuilt from the last stack of
        // each thread in the chunk.
        let mut lua_last =
            (chunk.kinds & kind_bit(kind::LUA_STACK_SHARED) != 0).then(LastLuaStacks::default);
        let mut pos = 0usize;
        while pos < raw.len() {
            if raw.len() - pos < 6 {
                warnings.push(corrupt(chunk, "record header cut off".into()));
                break;
            }
            let k = u16::from_le_bytes([raw[pos], raw[pos + 1]]);
            let len = u32::from_le_bytes(raw[pos + 2..pos + 6].try_into().unwrap()) as usize;
            pos += 6;
            if len > raw.len() - pos {
                warnings.push(corrupt(
                    chunk,
                    format!("record of kind {k} overruns its chunk"),
                ));
                break;
            }
            let body = &raw[pos..pos + len];
            pos += len;
            if !want(if k == kind::LUA_STACK_SHARED {
                kind::LUA_STACK
            } else {
                k
            }) {
                continue;
            }
            if let Some(lua) = &mut lua_last {
                if k == kind::LUA_STACK || k == kind::LUA_STACK_SHARED {
                    match lua_stack(lua, k, body) {
                        Ok(s) => visit(RecordRef::Other(Record::LuaStack(s))),
                        Err(what) => {
                            // A stack not read cannot be shared from: none is, after it.
                            lua.clear();
                            warnings.push(ReadWarning::BadRecord {
                                chunk_offset: chunk.offset,
                                kind: k,
                                what,
                            })
                        }
                    }
                    continue;
                }
            }
            match decode_record(k, body) {
                Ok(Some(r)) => visit(r),
                Ok(None) => {
                    match unknown.iter_mut().find(|(kk, _)| *kk == k) {
                        Some((_, n)) => *n += 1,
                        None => unknown.push((k, 1)),
                    }
                    visit(RecordRef::Other(Record::Unknown {
                        kind: k,
                        payload: body.to_vec(),
                    }));
                }
                Err(what) => warnings.push(ReadWarning::BadRecord {
                    chunk_offset: chunk.offset,
                    kind: k,
                    what,
                }),
            }
        }
        CHUNK_BUFFER.with(|b| b.replace(raw));
        warnings.extend(
            unknown
                .into_iter()
                .map(|(kind, count)| ReadWarning::UnknownKind { kind, count }),
        );
        warnings
    }

    /// Decodes every chunk in order. Warnings include the damage found when opening and
    /// [`ReadWarning::NoEnd`] when the capture lacks an end record.
    pub fn read_all(&self) -> (Vec<Record>, Vec<ReadWarning>) {
        let mut records = Vec::new();
        let mut warnings = self.warnings.clone();
        for c in &self.chunks {
            let (r, w) = self.decode_chunk(c);
            records.extend(r);
            warnings.extend(w);
        }
        if !records.iter().any(|r| matches!(r, Record::End(_))) {
            warnings.push(ReadWarning::NoEnd);
        }
        (records, merge_unknown(warnings))
    }
}

fn corrupt(chunk: &ChunkRef, what: String) -> ReadWarning {
    ReadWarning::Corrupt {
        offset: chunk.offset,
        len: (CHUNK_HEADER_LEN as u64) + chunk.compressed_len as u64,
        what,
    }
}

/// Sums UnknownKind warnings of the same kind across chunks.
pub(crate) fn merge_unknown(warnings: Vec<ReadWarning>) -> Vec<ReadWarning> {
    let mut out: Vec<ReadWarning> = Vec::new();
    for w in warnings {
        if let ReadWarning::UnknownKind { kind, count } = w {
            if let Some(ReadWarning::UnknownKind { count: c, .. }) = out
                .iter_mut()
                .find(|o| matches!(o, ReadWarning::UnknownKind { kind: k, .. } if *k == kind))
            {
                *c += count;
                continue;
            }
        }
        out.push(w);
    }
    out
}

thread_local! {
    static CHUNK_BUFFER: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Decodes a `LUA_STACK` or `LUA_STACK_SHARED` record (kind `k`) in full, its shared
/// frames from `last`.
fn lua_stack(last: &mut LastLuaStacks, k: u16, body: &[u8]) -> Result<LuaStack, String> {
    let (mut s, shared) = match k {
        kind::LUA_STACK => match crate::codec::lua_stack(body) {
            Some(s) => (s, 0),
            None => (decode(body)?, 0),
        },
        _ => crate::codec::lua_stack_shared(body)
            .ok_or("not a Lua stack sharing frames".to_string())?,
    };
    last.complete(&mut s, shared)?;
    Ok(s)
}

/// `Ok(None)` for kinds this reader does not know. Samples (on and off CPU) are decoded in
/// place.
fn decode_record(k: u16, body: &[u8]) -> Result<Option<RecordRef<'_>>, String> {
    if k == kind::SAMPLE {
        if let Some(s) = crate::codec::sample_ref(body) {
            return Ok(Some(RecordRef::Sample(s)));
        }
        return Ok(Some(RecordRef::Sample(decode(body)?)));
    }
    if k == kind::OFF_CPU {
        return Ok(Some(RecordRef::OffCpu(decode(body)?)));
    }
    if k == kind::LUA_STACK {
        if let Some(s) = crate::codec::lua_stack(body) {
            return Ok(Some(RecordRef::Other(Record::LuaStack(s))));
        }
    }
    Ok(Record::decode_payload(k, body)?.map(RecordRef::Other))
}

/// Finds every valid chunk. After damage, resynchronises on the next chunk magic whose
/// header and checksum are valid.
fn scan_chunks(data: &[u8]) -> (Vec<ChunkRef>, Vec<ReadWarning>) {
    let mut chunks = Vec::new();
    let mut warnings = Vec::new();
    let mut pos = FILE_HEADER_LEN;
    let mut bad_since: Option<usize> = None;
    while pos < data.len() {
        match check_chunk(data, pos) {
            ChunkCheck::Valid(c) => {
                if let Some(b) = bad_since.take() {
                    warnings.push(ReadWarning::Corrupt {
                        offset: b as u64,
                        len: (pos - b) as u64,
                        what: "not a valid chunk".into(),
                    });
                }
                pos += CHUNK_HEADER_LEN + c.compressed_len as usize;
                chunks.push(c);
            }
            ChunkCheck::Truncated { missing }
                if bad_since.is_none() && !valid_chunk_after(data, pos) =>
            {
                warnings.push(ReadWarning::Truncated {
                    offset: pos as u64,
                    missing,
                });
                return (chunks, warnings);
            }
            ChunkCheck::Truncated { .. } | ChunkCheck::Invalid => {
                bad_since.get_or_insert(pos);
                // Look for the next chunk magic.
                let magic = CHUNK_MAGIC.to_le_bytes();
                match data[pos + 1..].windows(4).position(|w| w == magic) {
                    Some(i) => pos = pos + 1 + i,
                    None => pos = data.len(),
                }
            }
        }
    }
    if let Some(b) = bad_since {
        warnings.push(ReadWarning::Corrupt {
            offset: b as u64,
            len: (data.len() - b) as u64,
            what: "not a valid chunk (damaged or cut short)".into(),
        });
    }
    (chunks, warnings)
}

/// Whether a valid chunk starts somewhere after `pos` (then a chunk that seems to run
/// past the end of the file is damage, not truncation).
fn valid_chunk_after(data: &[u8], pos: usize) -> bool {
    let magic = CHUNK_MAGIC.to_le_bytes();
    let mut at = pos + 1;
    while let Some(i) = data
        .get(at..)
        .and_then(|d| d.windows(4).position(|w| w == magic))
    {
        if let ChunkCheck::Valid(_) = check_chunk(data, at + i) {
            return true;
        }
        at += i + 1;
    }
    false
}

enum ChunkCheck {
    Valid(ChunkRef),
    Truncated { missing: u64 },
    Invalid,
}

fn check_chunk(data: &[u8], pos: usize) -> ChunkCheck {
    let rest = &data[pos..];
    if rest.len() < CHUNK_HEADER_LEN {
        if rest.len() >= 4 && rest[..4] != CHUNK_MAGIC.to_le_bytes() {
            return ChunkCheck::Invalid;
        }
        return ChunkCheck::Truncated {
            missing: (CHUNK_HEADER_LEN - rest.len()) as u64,
        };
    }
    let word = |i: usize| u32::from_le_bytes(rest[i..i + 4].try_into().unwrap());
    let (magic, clen, ulen, records, kinds) = (word(0), word(4), word(8), word(12), word(16));
    let crc = word(20);
    if magic != CHUNK_MAGIC || clen > MAX_CHUNK_LEN || ulen > MAX_CHUNK_LEN || records == 0 {
        return ChunkCheck::Invalid;
    }
    let end = CHUNK_HEADER_LEN + clen as usize;
    if rest.len() < end {
        return ChunkCheck::Truncated {
            missing: (end - rest.len()) as u64,
        };
    }
    if chunk_crc(&rest[..20], &rest[CHUNK_HEADER_LEN..end]) != crc {
        return ChunkCheck::Invalid;
    }
    ChunkCheck::Valid(ChunkRef {
        offset: pos as u64,
        compressed_len: clen,
        uncompressed_len: ulen,
        records,
        kinds,
    })
}
