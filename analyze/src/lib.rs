//! lanalyze: offline unwinding, symbolization and rendering of lrec captures.
//!
//! [`analyze`] is the one interpreter of a capture's raw data: it unwinds every sample's
//! registers and stack bytes with framehop over the unwind sections the capture embeds,
//! names the addresses from embedded symbol tables and DWARF, and returns a [`Profile`]
//! that every renderer in [`render`] reads. The core performs no I/O besides reading the
//! capture; local copies of binaries come only through a [`BinaryLocator`], whose file
//! system implementation lives in [`loader`].

mod address_space;
mod analysis;
mod assemble;
mod cfi;
pub mod debuginfod;
pub mod embed;
pub mod heap;
mod image;
pub mod loader;
mod lua;
mod metadata;
mod profile;
pub mod render;
mod stages;
pub mod strip;
mod symbolize;
mod symbols;
mod syscalls;
mod unwind;
mod waits;

use lrec_format::{Binary, Capture};

pub use profile::{
    BinaryInfo, Frame, FrameId, FrameKind, Latencies, LuaLines, LuaVmInfo, Mode, Naming, OffCpu,
    Profile, ProfileSample, RecordingWindow, SampleKind, StackEnd, Stats, Thread, ThreadState,
    Wait, Warning,
};

/// What [`analyze`] should do.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Never read local files: the result depends on the capture alone.
    pub offline: bool,
    /// Where separate debug files are looked up (None: `/usr/lib/debug`).
    pub debug_dir: Option<std::path::PathBuf>,
    /// Keep only samples of this process.
    pub pid: Option<u32>,
    /// Keep only samples of this thread.
    pub tid: Option<u32>,
    /// Keep only samples taken in this window of the recording.
    pub time: Option<TimeRange>,
    /// How renderers name frames (set on the returned [`Profile`]).
    pub naming: Naming,
    /// CPU samples, time off CPU, or both.
    pub mode: Mode,
}

impl Options {
    /// Whether a sample of `pid`/`tid` taken at `time_ns` passes the filters; `start_ns`
    /// is when recording started, on the samples' clock.
    pub fn keeps(&self, start_ns: u64, pid: u32, tid: u32, time_ns: u64) -> bool {
        self.pid.is_none_or(|p| p == pid)
            && self.tid.is_none_or(|t| t == tid)
            && self
                .time
                .is_none_or(|r| r.contains(time_ns.saturating_sub(start_ns)))
    }
}

/// A window of a recording, `FROM..TO` in seconds from its start (either end open).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimeRange {
    pub from: f64,
    pub to: f64,
}

impl TimeRange {
    /// Whether `offset_ns` after the start lies in the window (`from` included, `to` not).
    pub fn contains(&self, offset_ns: u64) -> bool {
        let t = offset_ns as f64 / 1e9;
        t >= self.from && t < self.to
    }
}

impl std::str::FromStr for TimeRange {
    type Err = String;

    /// `2..5`, `2..`, `..5`, in seconds (decimals allowed).
    fn from_str(s: &str) -> Result<Self, String> {
        let usage = || {
            format!(
                "`{s}` is not a time window; write FROM..TO in seconds, e.g. 2..5.5, 10.. or ..3"
            )
        };
        let (from, to) = s.split_once("..").ok_or_else(usage)?;
        let secs = |v: &str, open: f64| -> Result<f64, String> {
            match v.trim() {
                "" => Ok(open),
                v => v
                    .parse::<f64>()
                    .ok()
                    .filter(|x| *x >= 0.0)
                    .ok_or_else(usage),
            }
        };
        let range = TimeRange {
            from: secs(from, 0.0)?,
            to: secs(to, f64::INFINITY)?,
        };
        if range.from >= range.to {
            return Err(format!("`{s}`: FROM must be less than TO"));
        }
        Ok(range)
    }
}

/// Errors that stop an analysis. Damaged data does not: it is counted and warned about.
#[derive(Debug, thiserror::Error)]
pub enum AnalyzeError {
    #[error("the capture was recorded on {arch}; lanalyze can only unwind x86_64 captures")]
    UnsupportedArch { arch: String },
    #[error(
        "a stripped capture keeps CPU samples only; --off-cpu, --wall and --states need \
             the capture lrec wrote"
    )]
    StrippedCpuOnly,
    #[error(
        "the capture holds no latency measurements: record them with `lrec --latency \
         SYMBOL` (a function, entry to return) or `lrec --node-loop` (Node.js event loop)"
    )]
    NoLatency,
    #[error(
        "the capture was cut short before lrec wrote its latency measurements, which it \
         writes when the recording ends (was lrec killed?)"
    )]
    LatencyCutShort,
}

/// What a [`BinaryLocator`] is asked to find.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wanted {
    /// The capture lacks the binary's unwind or symbol sections.
    pub sections: bool,
    /// The capture lacks DWARF debug info for it.
    pub debug_info: bool,
}

/// Where a binary's sections came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The local file at the binary's recorded path.
    LocalBinary,
    /// A separate debug file on this machine (`/usr/lib/debug`, a debuglink).
    DebugFile,
    /// A debuginfod server (its URL).
    Debuginfod(String),
    /// The debuginfod cache that gdb, perf and lanalyze share, from an earlier download.
    DebuginfodCache,
}

/// A file that completes a recorded binary, read as lrec would have embedded it.
#[derive(Debug, Clone)]
pub struct Located {
    pub file: Binary,
    pub source: Source,
}

impl Located {
    pub fn new(file: Binary, source: Source) -> Located {
        Located { file, source }
    }
}

/// Supplies local copies of recorded binaries (or their debug files) that are provably the
/// recorded build.
pub trait BinaryLocator: Sync {
    /// Files whose sections complete `binary`, best first. `mapping_paths` are the paths
    /// it was mapped under.
    fn locate(&self, binary: &Binary, mapping_paths: &[&str], wanted: Wanted) -> Vec<Located>;

    /// Names for a binary that samples ran in and that nothing local names (debuginfod):
    /// asked only once stacks are known, so only binaries that matter are fetched.
    fn fetch_debug_info(&self, _binary: &Binary) -> Option<Located> {
        None
    }
}

/// A locator that finds nothing: the capture alone is used.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoLocalFiles;

impl BinaryLocator for NoLocalFiles {
    fn locate(&self, _: &Binary, _: &[&str], _: Wanted) -> Vec<Located> {
        Vec::new()
    }
}

/// Analyses a capture, reading local binaries for what it lacks unless `opts.offline`.
pub fn analyze(capture: &Capture, opts: &Options) -> Result<Profile, AnalyzeError> {
    analyze_with(capture, opts, locator(opts).as_ref())
}

/// What `lrec --latency` or `--node-loop` measured, filtered by `opts` (`mode`, `naming`
/// and `offline` do not matter): only the capture's metadata is decoded, no sample is
/// unwound.
pub fn read_latencies(capture: &Capture, opts: &Options) -> Result<Latencies, AnalyzeError> {
    let meta = metadata::read_metadata(capture);
    meta.latencies(opts).ok_or(match meta.end {
        Some(_) => AnalyzeError::NoLatency,
        None => AnalyzeError::LatencyCutShort,
    })
}

/// The locator `opts` asks for: none with `offline`, else local files and debuginfod.
pub fn locator(opts: &Options) -> Box<dyn BinaryLocator> {
    if opts.offline {
        Box::new(NoLocalFiles)
    } else {
        let mut files = loader::LocalFiles::default();
        if let Some(dir) = &opts.debug_dir {
            files.debug_root = dir.clone();
        }
        Box::new(files)
    }
}

/// Analyses a capture with local files supplied by `locator`.
pub fn analyze_with(
    capture: &Capture,
    opts: &Options,
    locator: &dyn BinaryLocator,
) -> Result<Profile, AnalyzeError> {
    let mut profile = analysis::run(capture, opts, locator)?;
    profile.naming = opts.naming;
    profile.mode = opts.mode;
    Ok(profile)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_windows_parse_with_open_ends_and_reject_nonsense() {
        let r: TimeRange = "2..5.5".parse().unwrap();
        assert_eq!((r.from, r.to), (2.0, 5.5));
        assert!(r.contains(2_000_000_000) && !r.contains(5_500_000_000));
        let r: TimeRange = "10..".parse().unwrap();
        assert!(r.contains(u64::MAX / 2) && !r.contains(9_999_999_999));
        let r: TimeRange = "..3".parse().unwrap();
        assert!(r.contains(0));
        for bad in ["5", "5..2", "a..b", "-1..2", "3..3"] {
            assert!(bad.parse::<TimeRange>().is_err(), "{bad}");
        }
    }
}
