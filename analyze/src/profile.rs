//! The analysed profile: what every renderer reads.

use std::collections::BTreeMap;

use lrec_format::{Header, Latency, LatencyCall, LostCauses};

/// Index into [`Profile::frames`].
pub type FrameId = u32;

/// What kind of code a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FrameKind {
    /// A user-space function (or an address that could not be named).
    User,
    /// A user-space function inlined into its caller (from DWARF).
    Inlined,
    /// A kernel function.
    Kernel,
    /// A Lua function, a Lua VM's built-in function, or a VM state (`[GC]`).
    Lua,
    /// Time off CPU, as the leaf of its stack: `[sleeping]`, `[disk sleep]`, or time
    /// counted without a stack (`[off-CPU < 1ms]`, `[runnable]`).
    Wait,
}

/// One distinct frame of the profile.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frame {
    /// Demangled function name, `module+0xOFFSET` when the address has no symbol, or
    /// `[unknown]` when it lies in no mapping.
    pub function: String,
    /// Basename of the module the address lies in, if any.
    /// For a Lua function: its chunk (source), as `module` and `function` name it.
    pub module: Option<String>,
    pub kind: FrameKind,
    /// A Lua function's line where it is defined and its line running when sampled
    /// (0 when unknown); `None` for every other frame.
    pub lines: Option<LuaLines>,
    /// A Lua function running JIT-compiled code (a trace's start frame or a function
    /// inlined into the trace).
    pub jit: bool,
}

/// Where a Lua function is defined and where it was when sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LuaLines {
    pub first: u32,
    pub current: u32,
}

impl Frame {
    /// A frame of this kind with only a name (and module).
    pub fn named(function: impl Into<String>, module: Option<String>, kind: FrameKind) -> Frame {
        Frame {
            function: function.into(),
            module,
            kind,
            lines: None,
            jit: false,
        }
    }

    /// The name as perf/inferno conventions print it: kernel frames end in `_[k]`; Lua
    /// frames get `@LINE` (their current line) and `_[j]` (JIT-compiled) when `naming`
    /// asks.
    pub fn display_name(&self, naming: Naming) -> String {
        match self.kind {
            FrameKind::Kernel => format!("{}_[k]", self.function),
            FrameKind::User | FrameKind::Inlined | FrameKind::Wait => self.function.clone(),
            FrameKind::Lua => {
                let mut name = self.function.clone();
                if let Some(l) = self.lines.filter(|_| naming.lines) {
                    name.push_str(&format!("@{}", l.current));
                }
                if self.jit && naming.mark_jit {
                    // perf's mark for JIT-compiled code.
                    name.push_str("_[j]");
                }
                name
            }
        }
    }
}

/// Which details of a frame its name shows. The profile keeps them all, so that one
/// analysis (or a stripped capture) serves every naming.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Naming {
    /// Split Lua functions by current line: `chunk.lua:12@14`.
    pub lines: bool,
    /// Mark Lua functions running JIT-compiled code: `hot app.lua:9_[j]`.
    pub mark_jit: bool,
}

/// One sample, unwound and symbolized.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProfileSample {
    pub time_ns: u64,
    pub pid: u32,
    pub tid: u32,
    /// Index into [`Profile::threads`].
    pub thread: usize,
    /// Root first, leaf last; kernel frames (if any) come after the user leaf.
    pub frames: Vec<FrameId>,
    /// How far the user stack could be followed.
    pub end: StackEnd,
    /// Taken while the thread ran in the kernel.
    pub kernel_mode: bool,
    /// The Lua VM's state (`G->vmstate`), when the sample ran in a Lua VM.
    pub vm_state: Option<i32>,
    /// In a LuaJIT trace: whether its snapshot mapped the sample to the inlined frames.
    pub jit_mapped: Option<bool>,
    /// A CPU sample, time off CPU, or a thread's state.
    pub kind: SampleKind,
}

/// What a [`ProfileSample`] is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SampleKind {
    /// A cpu-clock sample.
    #[default]
    Cpu,
    /// Time the thread spent off CPU (`lanalyze --off-cpu`, `--wall`).
    OffCpu(OffCpu),
    /// The thread's state at one moment (`lanalyze --states`).
    State(ThreadState),
}

impl ProfileSample {
    pub fn off_cpu(&self) -> Option<OffCpu> {
        match self.kind {
            SampleKind::OffCpu(o) => Some(o),
            _ => None,
        }
    }
}

/// A thread as a thread-state sample saw it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThreadState {
    /// `ps`'s letter: `R` (running or runnable), `S`, `D`, `T`, `I`, `Z`, …
    pub state: char,
    /// On a CPU at that moment.
    pub on_cpu: bool,
    /// The system call it was in, and for how long (known when lrec traced system calls).
    pub syscall: Option<u32>,
    pub syscall_ns: Option<u64>,
}

/// A stretch of time a thread spent off CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffCpu {
    pub start_ns: u64,
    pub duration_ns: u64,
    pub wait: Wait,
}

/// What a thread's time off CPU was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Wait {
    /// Blocked, in this state (`ps`'s letter: `S`, `D`, …), with its stacks recorded.
    Blocked(char),
    /// Preempted: runnable, waiting for a CPU (counted per thread, no stack).
    Runnable,
    /// Blocked for less than `lrec --off-cpu-min` (counted per thread, no stack).
    Short,
    /// Blocked, but the thread ran user code before lrec could take its stack (counted).
    Unpaired,
    /// A Lua coroutine yielded to C (ngx.sleep, a cosocket read), until resumed: its time,
    /// not its thread's, which meanwhile runs other work.
    LuaYield,
}

/// Which samples a profile holds, and what they weigh.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Mode {
    /// CPU samples, one each.
    #[default]
    Cpu,
    /// Time off CPU, in microseconds.
    OffCpu,
    /// CPU samples (a sampling period each) and time off CPU, in microseconds.
    Wall,
    /// Thread-state samples, one each.
    States,
}

impl Mode {
    /// Samples weigh time (microseconds), not one each.
    pub fn is_timed(self) -> bool {
        matches!(self, Mode::OffCpu | Mode::Wall)
    }
}

impl ProfileSample {
    /// The user stack could not be followed to its root function.
    pub fn truncated(&self) -> bool {
        self.end != StackEnd::Complete
    }
}

/// How an unwind ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum StackEnd {
    /// The root function was reached (its unwind info says there is no caller).
    #[default]
    Complete,
    /// Some frames were found, then unwinding stopped early.
    Truncated,
    /// Nothing beyond the leaf could be found.
    Failed,
}

/// A thread that samples were taken from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Thread {
    pub pid: u32,
    pub tid: u32,
    /// The thread's comm, or `[tid N]` when the capture does not name it.
    pub name: String,
    pub samples: u64,
}

/// Where the unwind and symbol data of a binary came from (a stripped capture keeps it).
pub use lrec_format::BinaryNames;
pub use lrec_format::ResolvedBinary as BinaryInfo;
/// A Lua VM found in a recorded process.
pub use lrec_format::ResolvedLuaVm as LuaVmInfo;
/// A problem met while analysing, reported once with how often it happened.
pub use lrec_format::ResolvedWarning as Warning;

/// Counters of the analysis.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Samples in the profile (after filters).
    pub samples: u64,
    /// Samples the kernel dropped (from `Lost` records).
    pub lost: u64,
    /// Why, when lrec said (a capture cut short, or older, does not).
    pub lost_causes: Option<LostCauses>,
    /// Stacks that stopped before their root function.
    pub truncated: u64,
    /// Samples for which not even one user frame beyond the leaf could be found, or whose
    /// user registers were missing.
    pub failed_unwinds: u64,
    /// Samples taken while the thread ran in the kernel.
    pub kernel_samples: u64,
    /// Samples per Lua VM state (interpreted, JIT-compiled, C, GC, JIT compiler, …),
    /// for samples taken while a Lua VM ran on the thread.
    pub vm_states: std::collections::BTreeMap<&'static str, u64>,
    /// Samples in LuaJIT traces that their snapshot mapped to the inlined functions and
    /// lines, and those left with the trace's base frame (unknown or flushed trace).
    pub jit_mapped: u64,
    pub jit_unmapped: u64,
    /// Per process and kind of VM (PUC Lua or not), how many Lua VMs (distinct global
    /// states) its samples ran in (not kept by `--strip`).
    pub lua_states: std::collections::BTreeMap<(u32, bool), usize>,
    /// First and last sample time.
    pub first_time_ns: Option<u64>,
    pub last_time_ns: Option<u64>,
}

/// The result of [`crate::analyze`].
#[derive(Debug, Clone, Default)]
pub struct Profile {
    pub header: Header,
    /// Why recording stopped, from the end record (None when the capture was cut short).
    pub end_reason: Option<String>,
    pub samples: Vec<ProfileSample>,
    pub frames: Vec<Frame>,
    pub threads: Vec<Thread>,
    /// Each sampled process's name (its main thread's, else its executable's), by pid,
    /// whether or not its main thread was sampled.
    pub processes: BTreeMap<u32, String>,
    pub binaries: Vec<BinaryInfo>,
    /// How each of `binaries` was named, in the same order (empty for a stripped capture
    /// of a lanalyze that did not say).
    pub binary_names: Vec<BinaryNames>,
    pub lua_vms: Vec<LuaVmInfo>,
    pub stats: Stats,
    pub warnings: Vec<Warning>,
    /// How renderers name frames.
    pub naming: Naming,
    /// Which samples the profile holds and what they weigh.
    pub mode: Mode,
    /// What `lrec --latency` or `--node-loop` timed, when it did.
    pub latency: Option<Latencies>,
    /// The recording's window and the off-CPU intervals it cut, when lrec recorded them
    /// (`--off-cpu`, `--states`).
    pub window: Option<RecordingWindow>,
}

/// The span a capture's samples, off-CPU time and thread states describe
/// (CLOCK_MONOTONIC ns), and per thread (by pid, tid, with its name) the off-CPU intervals
/// it cut at its start and at its end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordingWindow {
    pub start_ns: u64,
    pub end_ns: u64,
    pub cuts: Vec<(lrec_format::WindowCuts, String)>,
}

/// What `lrec --latency` or `--node-loop` measured: the capture's [`Latency`] record and
/// its [`LatencyCall`]s, kept as recorded but for the `--pid`/`--tid`/`--time` filters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Latencies {
    /// The probes and each thread's histogram of durations (filtered by pid and tid: a
    /// histogram covers the whole recording).
    pub record: Latency,
    /// Each timed call (`lrec --latency-events`), in capture order, filtered by its start.
    pub calls: Vec<LatencyCall>,
    /// The name of every thread of `record` and `calls`, by (pid, tid).
    pub thread_names: BTreeMap<(u32, u32), String>,
    /// CLOCK_MONOTONIC when recording started (the header's).
    pub start_ns: u64,
}

impl Profile {
    pub fn frame(&self, id: FrameId) -> &Frame {
        &self.frames[id as usize]
    }

    /// Every frame's name under [`Profile::naming`], by frame id.
    pub fn display_names(&self) -> Vec<String> {
        self.frames
            .iter()
            .map(|f| f.display_name(self.naming))
            .collect()
    }

    /// Every frame's name for the apps that mark kernel code their own way (speedscope's
    /// file, the Firefox Profiler's Kernel category): as [`Profile::display_names`], but
    /// kernel functions bare, without `_[k]`.
    pub fn app_names(&self) -> Vec<String> {
        self.frames
            .iter()
            .map(|f| match f.kind {
                FrameKind::Kernel => f.function.clone(),
                _ => f.display_name(self.naming),
            })
            .collect()
    }

    /// The index in [`Profile::threads`] of process `pid`'s main thread (tid = pid), if
    /// it was sampled.
    pub fn main_thread(&self, pid: u32) -> Option<usize> {
        self.threads
            .iter()
            .position(|t| t.pid == pid && t.tid == pid)
    }

    /// What `sample` weighs: 1 for CPU samples in a CPU profile; microseconds in an
    /// off-CPU or wall-clock profile (a CPU sample stands for its sampling period).
    pub fn weight(&self, sample: &ProfileSample) -> u64 {
        match (self.mode.is_timed(), sample.off_cpu()) {
            (false, _) => 1,
            (_, Some(o)) => o.duration_ns.div_ceil(1000),
            (_, None) => crate::render::period_ns(self.header.frequency_hz)
                .map_or(1, |ns| (ns / 1000.0).round() as u64),
        }
    }

    /// The sum of all samples' weights.
    pub fn total_weight(&self) -> u64 {
        match self.mode.is_timed() {
            false => self.samples.len() as u64,
            true => self.samples.iter().map(|s| self.weight(s)).sum(),
        }
    }

    /// What weights count: `samples` or `us`.
    pub fn unit(&self) -> &'static str {
        match self.mode.is_timed() {
            false => "samples",
            true => "us",
        }
    }

    pub fn thread_name(&self, sample: &ProfileSample) -> &str {
        &self.threads[sample.thread].name
    }
}
