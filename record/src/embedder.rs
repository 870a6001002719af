//! Reads mapped binaries and extracts their unwind and symbol sections on a worker
//! thread: a big file (a binary with DWARF) takes long enough to read that the recording
//! loop would otherwise miss the moment a short-lived target maps its libraries.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};

use lrec_format::{Binary, Chunk, Record, Segment};

use crate::procfs::{self, MapsEntry};
use lrec_inspect::debug_files::{self, DebugFile};
use lrec_inspect::elf::{self, DebugInfo};

/// A binary to embed: the mapping it was seen in, and for the vDSO its bytes.
pub struct Job {
    pub pid: u32,
    pub entry: MapsEntry,
    pub build_id: Option<Vec<u8>>,
    /// Bytes already copied from the process (the vDSO has no file).
    pub memory: Option<std::io::Result<Vec<u8>>>,
    pub debug: DebugInfo,
    /// Where separate debug files are (`--debug-dir`).
    pub debug_dir: PathBuf,
    /// zstd level of the capture's chunks.
    pub level: i32,
}

/// A binary embedded: its record encoded as a chunk of its own, ready to be written, and
/// what the recorder needs of it.
pub struct Embedded {
    /// Build-id, or path when there is none: the key of the binary.
    pub key: Vec<u8>,
    pub segments: Vec<Segment>,
    /// LuaJIT's interpreter, if the binary holds it.
    pub luajit: Option<lrec_inspect::lua::detect::LuaJitVm>,
    /// Embedded without the DWARF asked for: lrec's memory was past its shedding mark.
    pub shed: bool,
    pub chunk: Result<Chunk, lrec_format::FormatError>,
}

/// The embedding thread (it ends when this is dropped, after its current job).
pub struct Embedder {
    jobs: Sender<Job>,
    done: Receiver<Embedded>,
    /// Jobs submitted and not yet handed back.
    queued: usize,
    thread: crate::priority::Yielding,
}

impl Embedder {
    pub fn new() -> Embedder {
        let (jobs, inbox) = channel::<Job>();
        let (outbox, done) = channel();
        let thread = crate::priority::Yielding::default();
        let yielding = thread.clone();
        let handle = std::thread::Builder::new()
            .name("lrec-embed".into())
            .spawn(move || {
                // Reading and compressing binaries yields to the target on a busy machine,
                // until lrec waits for it.
                yielding.lower();
                for job in inbox {
                    let level = job.level;
                    let shed = job.debug != DebugInfo::None && crate::memory::shedding();
                    let binary = embed(job);
                    let done = Embedded {
                        key: binary
                            .build_id
                            .clone()
                            .unwrap_or_else(|| binary.path.as_bytes().to_vec()),
                        segments: binary.segments.clone(),
                        luajit: lrec_inspect::lua::detect::luajit_vm(&binary),
                        shed,
                        // Encoding and compressing a big binary takes tens of
                        // milliseconds: here, not on the thread that drains samples;
                        // at zstd's fastest level, twice as fast as the default for
                        // unwind and symbol tables a few percent bigger.
                        chunk: Chunk::encode(&[Record::Binary(binary)], level.min(1)),
                    };
                    if outbox.send(done).is_err() {
                        break;
                    }
                }
            })
            .expect("spawning the embedding thread");
        thread.spawned(&handle);
        Embedder {
            jobs,
            done,
            queued: 0,
            thread,
        }
    }

    pub fn submit(&mut self, job: Job) {
        if self.jobs.send(job).is_ok() {
            self.queued += 1;
        }
    }

    /// Binaries finished so far.
    pub fn finished(&mut self) -> Vec<Embedded> {
        let done: Vec<Embedded> = self.done.try_iter().collect();
        self.queued -= done.len();
        done
    }

    /// Waits for every binary submitted so far, unless `give_up` says to stop waiting
    /// (lrec was told to stop, and its time to finish is over); more may be submitted
    /// afterwards.
    pub fn wait(&mut self, give_up: impl Fn() -> bool) -> Vec<Embedded> {
        use std::sync::mpsc::RecvTimeoutError;
        // Now on lrec's way: and at lrec's exit, a thread at nice +10 among a saturating
        // target's would wait seconds for a CPU to end.
        self.thread.hurry();
        let mut done = Vec::with_capacity(self.queued);
        while self.queued > 0 && !give_up() {
            match self.done.recv_timeout(std::time::Duration::from_millis(20)) {
                Ok(binary) => {
                    self.queued -= 1;
                    done.push(binary);
                }
                Err(RecvTimeoutError::Timeout) => {}
                // The worker died (a panic): what it did not finish never comes.
                Err(RecvTimeoutError::Disconnected) => self.queued = 0,
            }
        }
        done
    }

    /// Binaries submitted and not handed back.
    pub fn queued(&self) -> usize {
        self.queued
    }
}

fn embed(job: Job) -> Binary {
    let data = match job.memory {
        Some(m) => m.map(Bytes::Copied),
        None => map_mapped_file(job.pid, &job.entry).map(Bytes::Mapped),
    };
    let data = data.and_then(|d| match (&job.build_id, elf::build_id(&d)) {
        (Some(want), Some(got)) if *want != got => Err(std::io::Error::other(
            "the file on disk is not the one that was mapped (build-id differs)",
        )),
        _ => Ok(d),
    });
    match data {
        Ok(d) => {
            // Past lrec's memory's shedding mark, DWARF (the bulk) is left out.
            let debug = match crate::memory::shedding() {
                true => DebugInfo::None,
                false => job.debug,
            };
            let mut binary = elf::binary_record(&job.entry.path, &d, debug);
            add_debug_symbols(&mut binary, &job.debug_dir);
            binary
        }
        Err(e) => Binary {
            build_id: job.build_id,
            path: job.entry.path.clone(),
            error: Some(format!("cannot read {}: {e}", job.entry.path)),
            ..Binary::default()
        },
    }
}

/// A binary's bytes: copied from the process (the vDSO) or a file mapped read-only, so
/// that only the pages of the sections embedded are read (lrec's memory does not grow
/// with the size of the target's libraries).
enum Bytes {
    Copied(Vec<u8>),
    Mapped(memmap2::Mmap),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Copied(v) => v,
            Bytes::Mapped(m) => m,
        }
    }
}

/// A stripped binary gets the symbol table of its separate debug file (Debian's `-dbg`
/// packages, found by build-id or debuglink), so that its static functions are named
/// offline too.
fn add_debug_symbols(binary: &mut Binary, debug_dir: &Path) {
    if binary.section(".symtab").is_some() {
        return;
    }
    let Some(debug) = separate_debug_file(debug_dir, binary) else {
        return;
    };
    let debug = elf::binary_record(&binary.path, &debug.data, DebugInfo::None);
    for name in [".symtab", ".strtab"] {
        match debug.section(name) {
            Some(s) if !s.data.is_empty() => binary.sections.push(s.clone()),
            _ => return,
        }
    }
}

/// The separate debug file of `binary` under `debug_dir` (`--debug-dir`), by the lookup
/// lanalyze shares.
pub fn separate_debug_file(debug_dir: &Path, binary: &Binary) -> Option<DebugFile> {
    debug_files::find_debug_file(
        debug_dir,
        &binary.path,
        binary.build_id.as_deref(),
        debug_files::debuglink(binary).as_ref(),
    )
}

/// A mapped file, mapped here read-only: through /proc while the process lives, else
/// from its path (the caller checks the build-id).
fn map_mapped_file(pid: u32, entry: &MapsEntry) -> std::io::Result<memmap2::Mmap> {
    let f = match (procfs::open_mapped_file(pid, entry), entry.file_path()) {
        (Ok(f), _) => f,
        (Err(_), Some(path)) if !entry.is_deleted() => File::open(path)?,
        (Err(e), _) => return Err(e),
    };
    procfs::map_file(&f)
}
