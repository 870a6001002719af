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
    /// `-d`: counted from lrec's start ([`Config::started`]).
    pub duration: Option<Duration>,
    /// When lrec started (its first step in main).
    pub started: std::time::Instant,
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

impl Config {
    /// The sample ring's size in MiB: `--ring-mib`, else for the rate and stack size asked:
    /// [`ring_mib_for`] the online CPUs.
    pub fn ring_mib(&self) -> u32 {
        let cpus = aya::util::online_cpus().map_or(2, |c| c.len() as u32);
        (self.ring_mib).unwrap_or_else(|| ring_mib_for(cpus, self.frequency_hz, self.stack_size))
    }
}

/// A quarter of a second of every CPU's samples at `hz` with stacks of `stack_size` bytes
/// (4 MiB per CPU at 999 Hz with 16 KiB stacks: lrec drains at every quarter, sooner when
/// the ring fills up), in MiB, a power of two from 8 to 128.
fn ring_mib_for(cpus: u32, hz: u64, stack_size: u32) -> u32 {
    let bytes = u64::from(cpus) * hz * u64::from(stack_size) / 4;
    (bytes.div_ceil(1 << 20) as u32)
        .clamp(8, 128)
        .next_power_of_two()
}

#[cfg(test)]
mod tests {
    use super::ring_mib_for;

    #[test]
    fn the_ring_grows_with_the_rate_and_the_stacks() {
        // 999 Hz, 16 KiB stacks: 4 MiB per CPU, as before the rate counted.
        assert_eq!(ring_mib_for(2, 999, 16384), 8);
        assert_eq!(ring_mib_for(4, 999, 16384), 16);
        // Five times the rate on 2 CPUs: 40 MiB, a power of two up.
        assert_eq!(ring_mib_for(2, 4999, 16384), 64);
        assert_eq!(ring_mib_for(2, 999, 65536), 32);
        // Bounds.
        assert_eq!(ring_mib_for(2, 99, 16384), 8);
        assert_eq!(ring_mib_for(64, 4999, 65536), 128);
    }
}
