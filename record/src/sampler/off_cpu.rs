//! The BPF side of the recording's window and of `--off-cpu`'s counts (ebpf/offcpu.h): lrec
//! tells BPF when the recording starts and ends (the span its CPU samples describe), and BPF
//! counts only the part of each off-CPU interval inside it, per thread with the intervals
//! it cut.

use aya::maps::{Array, HashMap as BpfHashMap};
use lrec_format::ThreadOffCpuTotals;

use super::{Sampler, SamplerError};

/// `struct lrec_window`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawWindow {
    start_ns: u64,
    end_ns: u64,
}

// SAFETY: two u64s, no padding.
unsafe impl aya::Pod for RawWindow {}

/// `struct lrec_thread_off_cpu`: one thread's off-CPU time counted without a stack, and how
/// many of its intervals the window cut.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThreadOffCpu {
    pub totals: ThreadOffCpuTotals,
    /// Intervals that began before the window: counted from its start.
    pub cut_at_start: u64,
    /// Intervals still open at its end: counted to it.
    pub cut_at_end: u64,
}

// SAFETY: ThreadOffCpuTotals is #[repr(C)] (two u32s, six u64s), then two u64s: no padding.
unsafe impl aya::Pod for ThreadOffCpu {}
const _: () = assert!(std::mem::offset_of!(ThreadOffCpu, cut_at_start) == 56);
const _: () = assert!(std::mem::size_of::<ThreadOffCpu>() == 72);

const WINDOW: &str = "recording_window";

impl Sampler {
    /// The recording's window opens now, as sampling starts (Sampler::start_sampling): no
    /// off-CPU time before counts.
    pub(super) fn start_window(&mut self) -> Result<(), SamplerError> {
        self.window = (crate::procfs::monotonic_ns(), 0);
        self.write_window()
    }

    /// The recording's window, opened when sampling started, ends at `end_ns` if that is
    /// known (`-d`; an end before its start leaves it empty), else when sampling stops.
    /// `attached`: the target ran before lrec, so its threads off CPU since before lrec
    /// attached are noted (their intervals then count from the window's start); a command
    /// lrec started has none of its own. Returns the window's start.
    pub fn open_window(
        &mut self,
        end_ns: Option<u64>,
        attached: bool,
    ) -> Result<u64, SamplerError> {
        if let Some(end) = end_ns {
            self.window.1 = end.max(self.window.0);
            self.write_window()?;
        }
        if attached {
            self.run_iter("open_window")?;
        }
        Ok(self.window.0)
    }

    /// The window closes now, unless it ended earlier: no off-CPU time after it counts.
    pub(super) fn close_window(&mut self) {
        let now = crate::procfs::monotonic_ns();
        if self.window.1 == 0 || self.window.1 > now {
            self.window.1 = now;
        }
        if let Err(e) = self.write_window() {
            eprintln!("lrec: warning: off-CPU time after the recording's end may be counted: {e}");
        }
    }

    fn write_window(&mut self) -> Result<(), SamplerError> {
        let map = self
            .ebpf
            .map_mut(WINDOW)
            .ok_or(SamplerError::MissingMap(WINDOW))?;
        let mut map = Array::<_, RawWindow>::try_from(map).map_err(|source| SamplerError::Map {
            name: WINDOW,
            source,
        })?;
        let (start_ns, end_ns) = self.window;
        map.set(0, RawWindow { start_ns, end_ns }, 0)
            .map_err(|source| SamplerError::Map {
                name: WINDOW,
                source,
            })
    }

    /// The recording's window (CLOCK_MONOTONIC ns): its end is 0 until it is known.
    pub fn window(&self) -> (u64, u64) {
        self.window
    }

    /// Per thread, the off-CPU time counted but not recorded with stacks, and the
    /// intervals the window cut (threads still alive are copied from their task storage
    /// first, their intervals in progress counted to the window's end).
    pub fn off_cpu_totals(&mut self) -> Result<Vec<ThreadOffCpu>, SamplerError> {
        self.run_iter("flush_totals")?;
        let Some(map) = self.ebpf.map("thread_totals") else {
            return Ok(Vec::new());
        };
        let Ok(map) = BpfHashMap::<_, u32, ThreadOffCpu>::try_from(map) else {
            return Ok(Vec::new());
        };
        Ok(map.iter().filter_map(Result::ok).map(|(_, v)| v).collect())
    }
}
