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
use std::io::{self, Write};
use std::path::PathBuf;

use lrec_format::{
    kind, kind_bit, CaptureSink, CaptureWriter, Chunk, End, FormatError, Header, Lost, Record,
    SampleSpan,
};

use crate::capture_file::{self, WriteFailed};

/// A capture written by [`Flight::dump`].
#[derive(Debug)]
pub struct Dump {
    pub path: PathBuf,
    pub span: SampleSpan,
    pub lost: u64,
    pub bytes: u64,
}

/// The flight recorder's memory; a [`CaptureSink`] for the capture writer.
pub struct Flight {
    window_ns: u64,
    header: Header,
    /// `-o`: dump `n` goes to [`capture_file::numbered`]`(base, n)`, created as `output` says.
    base: PathBuf,
    output: lrec_inspect::files::OutputOptions,
    meta: Vec<Chunk>,
    /// Sample chunks, oldest first.
    ring: VecDeque<Chunk>,
    /// Lost counts in the window, oldest first.
    lost: VecDeque<Lost>,
    /// Samples and lost counts that left the window.
    aged: SampleSpan,
    aged_lost: u64,
    pub dumps: Vec<Dump>,
}

impl Flight {
    pub fn new(
        window_secs: f64,
        header: Header,
        base: PathBuf,
        output: lrec_inspect::files::OutputOptions,
    ) -> Flight {
        Flight {
            window_ns: (window_secs * 1e9) as u64,
            header,
            base,
            output,
            meta: Vec::new(),
            ring: VecDeque::new(),
            lost: VecDeque::new(),
            aged: SampleSpan::default(),
            aged_lost: 0,
            dumps: Vec::new(),
        }
    }

    pub fn note_lost(&mut self, lost: Lost) {
        self.lost.push_back(lost);
    }

    /// Drops the sample chunks whose newest sample is older than the window at `now_ns`,
    /// and the lost counts older than that. A dump thus spans the window and at most one
    /// chunk's time more.
    pub fn evict(&mut self, now_ns: u64) {
        let cutoff = now_ns.saturating_sub(self.window_ns);
        while self
            .ring
            .front()
            .is_some_and(|c| c.samples().last_ns < cutoff)
        {
            let chunk = self.ring.pop_front().expect("front exists");
            self.aged.merge(&chunk.samples());
        }
        while self.lost.front().is_some_and(|l| l.time_ns < cutoff) {
            self.aged_lost += self.lost.pop_front().expect("front exists").count;
        }
    }

    /// The samples in the window now.
    pub fn window(&self) -> SampleSpan {
        let mut span = SampleSpan::default();
        for c in &self.ring {
            span.merge(&c.samples());
        }
        span
    }

    /// Samples and lost counts aged out of the window so far.
    pub fn aged(&self) -> (SampleSpan, u64) {
        (self.aged, self.aged_lost)
    }

    /// Bytes held: metadata and sample chunks.
    pub fn held_bytes(&self) -> (u64, u64) {
        let bytes = |c: &Chunk| c.as_bytes().len() as u64;
        (
            self.meta.iter().map(bytes).sum(),
            self.ring.iter().map(bytes).sum(),
        )
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
        let path = capture_file::numbered(&self.base, self.dumps.len() as u32 + 1);
        let failed = |error| WriteFailed {
            path: path.clone(),
            error,
        };
        let mut out = capture_file::create_capture(&path, &self.output)
            .map_err(|e| failed(std::io::Error::other(e)))?;
        let (span, lost) = self
            .write_window(&mut out, now_ns, extra, reason)
            .map_err(failed)?;
        let bytes = capture_file::commit_capture(out)?;
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
    ) -> io::Result<(SampleSpan, u64)> {
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
        let mut write = || -> Result<(), FormatError> {
            let mut w = CaptureWriter::new(&mut *out, &header)?;
            for chunk in self.meta.iter().chain(&self.ring) {
                w.copy_chunk(chunk)?;
            }
            for l in &self.lost {
                w.push(&Record::Lost(l.clone()))?;
            }
            for r in extra {
                w.push(r)?;
            }
            w.push(&Record::End(End {
                time_ns: now_ns,
                samples: span.samples,
                lost,
                reason: reason.to_string(),
            }))?;
            w.finish()?;
            Ok(())
        };
        write().map_err(|e| match e {
            FormatError::Io(e) => e,
            e => io::Error::other(e),
        })?;
        Ok((span, lost))
    }

    pub fn window_secs(&self) -> f64 {
        self.window_ns as f64 / 1e9
    }
}

impl CaptureSink for Flight {
    fn write_file_header(&mut self, _: &[u8]) -> io::Result<()> {
        // Each dump writes its own, with its own header chunk.
        Ok(())
    }

    fn write_chunk(&mut self, chunk: Chunk) -> io::Result<()> {
        let samples =
            kind_bit(kind::SAMPLE) | kind_bit(kind::LUA_STACK) | kind_bit(kind::LUA_STACK_SHARED);
        if chunk.kinds() & samples != 0 {
            self.ring.push_back(chunk);
        } else if chunk.kinds() != kind_bit(kind::HEADER) {
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
        let flight = Flight::new(5.0, header.clone(), "out.lrec".into(), Default::default());
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
