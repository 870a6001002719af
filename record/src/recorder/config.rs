//! What a recording is asked to do: lrec's command line (main.rs) turned into the
//! recorder's own terms, so that nothing below main.rs reads the command line.

use std::path::PathBuf;
use std::time::Duration;

use lrec_inspect::elf::DebugInfo;

use crate::latency::Spec;

/// DWARF of one binary embedded by `--debuginfo auto` up to this size.
pub const AUTO_DEBUG_LIMIT: u64 = 32 << 20;

pub struct Config {
    /// CPU samples per second per thread on CPU (`-F`).
    pub frequency_hz: u64,
    /// User-stack bytes copied per sample.
    pub stack_size: u32,
    /// `-d`: counted from the first sample.
    pub duration: Option<Duration>,
    /// The ring buffer's size (a power of two), if not the default.
    pub ring_mib: Option<u32>,
    /// Also record the processes the targets fork.
    pub follow_children: bool,
    /// Replace an output file that is not lrec's or lanalyze's.
    pub force: bool,
    /// Which binaries' DWARF is embedded, and where separate debug files are.
    pub debug: DebugInfo,
    pub debug_dir: PathBuf,
    /// No live status line, no summaries of snapshots.
    pub quiet: bool,
    /// The command started (`-- CMD`), empty for `-p`.
    pub command: Vec<String>,
    /// The optional parts of the recording (recorder/features.rs).
    pub flight_secs: Option<f64>,
    pub off_cpu: Option<OffCpu>,
    pub states_hz: Option<u32>,
    pub latency: Option<Latency>,
    pub heap: Option<Heap>,
}

/// `--off-cpu`.
pub struct OffCpu {
    /// Blocked intervals shorter than this are counted, not recorded with stacks.
    pub min_ns: u64,
    /// Lua coroutine waits stop being timed above this many yields a second (0: never).
    pub lua_waits_max_rate: u64,
}

/// `--latency`, `--node-loop`.
pub struct Latency {
    pub specs: Vec<Spec>,
    pub node_loop: bool,
    /// A function called more often a second stops being timed (0: never).
    pub max_rate: u64,
    /// Also write each timed call.
    pub events: bool,
}

/// `--lua-heap`.
#[derive(Clone, Copy)]
pub struct Heap {
    /// Stop the process while its memory is copied.
    pub freeze: bool,
    /// Copy at most this much of a process's memory.
    pub max_bytes: u64,
}
