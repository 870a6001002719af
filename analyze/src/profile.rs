//! The analysed profile: what every renderer reads.

use lrec_format::Header;

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
}

/// One distinct frame of the profile.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frame {
    /// Demangled function name, `module+0xOFFSET` when the address has no symbol, or
    /// `[unknown]` when it lies in no mapping.
    pub function: String,
    /// Basename of the module the address lies in, if any.
    pub module: Option<String>,
    pub kind: FrameKind,
}

impl Frame {
    /// The name as perf/inferno conventions print it: kernel frames end in `_[k]`.
    pub fn display_name(&self) -> String {
        match self.kind {
            FrameKind::Kernel => format!("{}_[k]", self.function),
            FrameKind::User | FrameKind::Inlined | FrameKind::Lua => self.function.clone(),
        }
    }
}

/// One sample, unwound and symbolized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileSample {
    pub time_ns: u64,
    pub pid: u32,
    pub tid: u32,
    /// Index into [`Profile::threads`].
    pub thread: usize,
    /// Root first, leaf last; kernel frames (if any) come after the user leaf.
    pub frames: Vec<FrameId>,
    /// The user stack could not be followed to its root function.
    pub truncated: bool,
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

/// Where the unwind and symbol data of a binary came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BinaryInfo {
    pub path: String,
    pub build_id: Option<Vec<u8>>,
    /// The capture holds its unwind/symbol sections.
    pub sections_embedded: bool,
    /// The capture holds its DWARF debug info.
    pub dwarf_embedded: bool,
    /// Local files that supplied sections (the binary itself or its debug file).
    pub resolved_locally: Vec<String>,
    /// Usable unwind info (.eh_frame or .debug_frame) was available.
    pub has_unwind_info: bool,
    /// DWARF debug info (embedded or local) was available.
    pub has_dwarf: bool,
    /// Why the recorder could not embed the file, if so.
    pub error: Option<String>,
    /// Samples whose unwinding passed through this binary without unwind info.
    pub samples_without_unwind_info: u64,
}

/// A Lua VM found in a recorded process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LuaVmInfo {
    pub pid: u32,
    /// `LuaJIT 2.1`.
    pub vm: String,
    /// The layout that validated, empty when none did.
    pub layout: String,
    pub path: String,
    pub error: Option<String>,
}

/// A problem met while analysing, reported once with how often it happened.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Warning {
    pub message: String,
    pub count: u64,
}

/// Counters of the analysis.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Samples in the profile (after filters).
    pub samples: u64,
    /// Samples the kernel dropped (from `Lost` records).
    pub lost: u64,
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
    pub binaries: Vec<BinaryInfo>,
    pub lua_vms: Vec<LuaVmInfo>,
    pub stats: Stats,
    pub warnings: Vec<Warning>,
}

impl Profile {
    pub fn frame(&self, id: FrameId) -> &Frame {
        &self.frames[id as usize]
    }

    pub fn thread_name(&self, sample: &ProfileSample) -> &str {
        &self.threads[sample.thread].name
    }
}
