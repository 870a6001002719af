//! The flight recorder (`--flight SECS`): keeps the last SECS seconds of samples in
//! memory and writes them out as a complete capture on demand.
//!
//! Chunks arrive whole from the capture writer. Sample chunks (samples and the Lua stacks
//! before them) go into a time-ordered ring and leave it once their newest sample is older
//! than the window; every other chunk (processes, thread names, mappings, binaries, Lua
//! runtimes and protos) is kept for the whole run, since samples of any age may need it.
//! A dump is the file header, a header chunk, all metadata chunks, the ring's chunks and a
//! last chunk with the window's lost counts, the kernel symbols and an end record: a
//! capture like any other.

use std::collections::VecDeque;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;

use lrec_format::{kind, kind_bit, CaptureSink, Chunk, End, FormatError, Header, Lost, Record};

use crate::output::{self, WriteFailed};

/// zstd level of the chunks a dump encodes itself (as the capture writer's default).
const LEVEL: i32 = 3;

/// Samples of a stretch of time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Span {
    pub samples: u64,
    /// Monotonic time of the first and last sample (0 when there are none).
    pub first_ns: u64,
    pub last_ns: u64,
}

impl Span {
    fn add(&mut self, time_ns: u64) {
        if self.samples == 0 {
            self.first_ns = time_ns;
        }
        self.samples += 1;
        self.first_ns = self.first_ns.min(time_ns);
        self.last_ns = self.last_ns.max(time_ns);
    }

    fn merge(&mut self, other: &Span) {
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

/// A sample chunk in the ring.
struct Kept {
    span: Span,
    chunk: Chunk,
}

/// A capture written by [`Flight::dump`].
#[derive(Debug)]
pub struct Dump {
    pub path: PathBuf,
    pub span: Span,
    pub lost: u64,
    pub bytes: u64,
}

/// The flight recorder's memory; a [`CaptureSink`] for the capture writer.
pub struct Flight {
    window_ns: u64,
    header: Header,
    /// `-o`: dump `n` goes to [`output::numbered`]`(base, n)`.
    base: PathBuf,
    file_header: Vec<u8>,
    meta: Vec<Chunk>,
    meta_bytes: u64,
    ring: VecDeque<Kept>,
    ring_bytes: u64,
    /// Samples pushed since the last sample chunk: they are the next one's.
    pending: Span,
    /// Lost counts in the window, oldest first.
    lost: VecDeque<Lost>,
    /// Samples and lost counts that left the window.
    aged: Span,
    aged_lost: u64,
    pub dumps: Vec<Dump>,
}

impl Flight {
    pub fn new(window_secs: f64, header: Header, base: PathBuf) -> Flight {
        Flight {
            window_ns: (window_secs * 1e9) as u64,
            header,
            base,
            file_header: Vec::new(),
            meta: Vec::new(),
            meta_bytes: 0,
            ring: VecDeque::new(),
            ring_bytes: 0,
            pending: Span::default(),
            lost: VecDeque::new(),
            aged: Span::default(),
            aged_lost: 0,
            dumps: Vec::new(),
        }
    }

    /// A sample about to be pushed to the capture writer (call before pushing it: a push
    /// may write out the chunk it lands in).
    pub fn saw_sample(&mut self, time_ns: u64) {
        self.pending.add(time_ns);
    }

    pub fn note_lost(&mut self, lost: Lost) {
        self.lost.push_back(lost);
    }

    /// Drops the sample chunks whose newest sample is older than the window at `now_ns`,
    /// and the lost counts older than that. A dump thus spans the window and at most one
    /// chunk's time more.
    pub fn evict(&mut self, now_ns: u64) {
        let cutoff = now_ns.saturating_sub(self.window_ns);
        while self.ring.front().is_some_and(|k| k.span.last_ns < cutoff) {
            let k = self.ring.pop_front().expect("front exists");
            self.aged.merge(&k.span);
            self.ring_bytes -= k.chunk.as_bytes().len() as u64;
        }
        while self.lost.front().is_some_and(|l| l.time_ns < cutoff) {
            self.aged_lost += self.lost.pop_front().expect("front exists").count;
        }
    }

    /// The samples in the window now.
    pub fn window(&self) -> Span {
        let mut span = Span::default();
        for k in &self.ring {
            span.merge(&k.span);
        }
        span
    }

    /// Samples and lost counts aged out of the window so far.
    pub fn aged(&self) -> (Span, u64) {
        (self.aged, self.aged_lost)
    }

    /// Bytes held: metadata and sample chunks.
    pub fn held_bytes(&self) -> (u64, u64) {
        (self.meta_bytes, self.ring_bytes)
    }

    /// Writes the window at `now_ns` to the next numbered file; `extra` records (kernel
    /// symbols) go before the end record.
    pub fn dump(
        &mut self,
        now_ns: u64,
        extra: &[Record],
        reason: &str,
    ) -> Result<&Dump, WriteFailed> {
        self.evict(now_ns);
        let path = output::numbered(&self.base, self.dumps.len() as u32 + 1);
        let failed = |error| WriteFailed {
            path: path.clone(),
            error,
        };
        let file = output::create_private(&path).map_err(failed)?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        let (span, lost) = self
            .write_window(&mut out, now_ns, extra, reason)
            .map_err(failed)?;
        let file = out.into_inner().map_err(|e| failed(e.into_error()))?;
        let bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
        self.dumps.push(Dump {
            path,
            span,
            lost,
            bytes,
        });
        Ok(self.dumps.last().expect("just pushed"))
    }

    /// Writes the capture of the window into `out`.
    fn write_window(
        &self,
        out: &mut impl Write,
        now_ns: u64,
        extra: &[Record],
        reason: &str,
    ) -> io::Result<(Span, u64)> {
        let span = self.window();
        let lost: u64 = self.lost.iter().map(|l| l.count).sum();
        // The capture starts with the window: lanalyze's --time counts from there.
        let start = match span.samples {
            0 => now_ns.saturating_sub(self.window_ns),
            _ => span.first_ns,
        };
        let shift = start.saturating_sub(self.header.monotonic_start_ns);
        let header = Header {
            monotonic_start_ns: self.header.monotonic_start_ns + shift,
            wall_clock_start_ns: self.header.wall_clock_start_ns + shift,
            ..self.header.clone()
        };
        let mut tail: Vec<Record> = self.lost.iter().cloned().map(Record::Lost).collect();
        tail.extend_from_slice(extra);
        tail.push(Record::End(End {
            time_ns: now_ns,
            samples: span.samples,
            lost,
            reason: reason.to_string(),
        }));
        let encode = |records: &[Record]| {
            Chunk::encode(records, LEVEL).map_err(|e| match e {
                FormatError::Io(e) => e,
                e => io::Error::other(e),
            })
        };
        let head = encode(&[Record::Header(header)])?;
        let tail = encode(&tail)?;
        let chunks = std::iter::once(&head)
            .chain(&self.meta)
            .chain(self.ring.iter().map(|k| &k.chunk))
            .chain(std::iter::once(&tail));
        out.write_all(&self.file_header)?;
        for chunk in chunks {
            out.write_all(chunk.as_bytes())?;
        }
        out.flush()?;
        Ok((span, lost))
    }

    pub fn window_secs(&self) -> f64 {
        self.window_ns as f64 / 1e9
    }
}

impl CaptureSink for Flight {
    fn write_file_header(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.file_header = bytes.to_vec();
        Ok(())
    }

    fn write_chunk(&mut self, chunk: Chunk) -> io::Result<()> {
        let samples = kind_bit(kind::SAMPLE) | kind_bit(kind::LUA_STACK);
        if chunk.kinds() & samples != 0 {
            let span = std::mem::take(&mut self.pending);
            self.ring_bytes += chunk.as_bytes().len() as u64;
            self.ring.push_back(Kept { span, chunk });
        } else if chunk.kinds() == kind_bit(kind::HEADER) {
            // The writer's header chunk: each dump writes its own, starting at its window.
        } else {
            self.meta_bytes += chunk.as_bytes().len() as u64;
            self.meta.push(chunk);
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lrec_format::{Capture, CaptureWriter, LuaStack, Sample, ThreadName};

    const SEC: u64 = 1_000_000_000;

    /// Records one sample (with its Lua stack) and one thread name per 0.25 s for 20 s,
    /// with a 5 s window, one chunk per 0.25 s.
    fn flight() -> CaptureWriter<Flight> {
        let header = Header {
            monotonic_start_ns: 100 * SEC,
            wall_clock_start_ns: 1_000 * SEC,
            ..Header::default()
        };
        let flight = Flight::new(5.0, header.clone(), "out.lrec".into());
        let mut w = CaptureWriter::new(flight, &header).unwrap();
        for i in 0..80 {
            let t = 100 * SEC + i * SEC / 4;
            w.push(&Record::ThreadName(ThreadName {
                pid: 1,
                tid: i as u32,
                name: format!("t{i}"),
            }))
            .unwrap();
            w.push(&Record::LuaStack(LuaStack {
                time_ns: t,
                ..LuaStack::default()
            }))
            .unwrap();
            w.get_mut().saw_sample(t);
            w.push(&Record::Sample(Sample {
                time_ns: t,
                ..Sample::default()
            }))
            .unwrap();
            w.get_mut().note_lost(Lost {
                time_ns: t,
                count: 1,
            });
            w.flush().unwrap();
            w.get_mut().evict(t + SEC / 8);
        }
        w
    }

    #[test]
    fn the_window_keeps_the_last_seconds_of_samples_and_all_metadata() {
        let mut w = flight();
        let now = 120 * SEC;
        let f = w.get_mut();
        f.evict(now);
        let window = f.window();
        // Samples at 115.0 … 119.75 s.
        assert_eq!(window.samples, 20);
        assert_eq!(
            (window.first_ns, window.last_ns),
            (115 * SEC, 119_750_000_000)
        );
        let (aged, aged_lost) = f.aged();
        assert_eq!((aged.samples, aged_lost), (60, 60));
        assert_eq!(aged.last_ns, 114_750_000_000);

        let mut bytes = Vec::new();
        let extra = [Record::KernelSymbols(Default::default())];
        let (span, lost) = f.write_window(&mut bytes, now, &extra, "test").unwrap();
        assert_eq!((span, lost), (window, 20));
        let cap = Capture::from_bytes(bytes).unwrap();
        let (records, warnings) = cap.read_all();
        assert!(warnings.is_empty(), "{warnings:?}");
        let Record::Header(h) = &records[0] else {
            panic!("no header first: {:?}", records[0]);
        };
        // The capture's time starts with its window.
        assert_eq!(h.monotonic_start_ns, 115 * SEC);
        assert_eq!(h.wall_clock_start_ns, 1_015 * SEC);
        let count = |k: u16| records.iter().filter(|r| r.kind() == k).count();
        assert_eq!(count(kind::HEADER), 1);
        assert_eq!(count(kind::THREAD_NAME), 80, "metadata never ages out");
        assert_eq!(count(kind::SAMPLE), 20);
        assert_eq!(count(kind::LUA_STACK), 20);
        assert_eq!(count(kind::LOST), 20);
        assert_eq!(count(kind::KERNEL_SYMBOLS), 1);
        let Some(Record::End(end)) = records.last() else {
            panic!("no end last");
        };
        assert_eq!(
            (end.samples, end.lost, end.reason.as_str()),
            (20, 20, "test")
        );
    }

    #[test]
    fn memory_held_stays_bounded() {
        let mut w = flight();
        let (_, ring) = w.get_mut().held_bytes();
        // 21 chunks of one sample at most, whatever the recording's length.
        assert!(w.get_mut().ring.len() <= 21, "{}", w.get_mut().ring.len());
        assert!(ring < 21 * 200, "{ring} bytes of samples held");
    }

    #[test]
    fn an_idle_window_is_empty() {
        let mut w = flight();
        let f = w.get_mut();
        let mut bytes = Vec::new();
        f.evict(200 * SEC);
        let (span, lost) = f.write_window(&mut bytes, 200 * SEC, &[], "idle").unwrap();
        assert_eq!((span.samples, lost), (0, 0));
        let (records, warnings) = Capture::from_bytes(bytes).unwrap().read_all();
        assert!(warnings.is_empty(), "{warnings:?}");
        let Record::Header(h) = &records[0] else {
            panic!("no header first");
        };
        assert_eq!(h.monotonic_start_ns, 195 * SEC);
    }
}
