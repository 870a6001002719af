//! Records of a stripped capture (`lanalyze --strip`): frames already unwound and named,
//! samples as frame ids, and what the analysis behind it found about binaries, Lua VMs and
//! problems.

use serde::{Deserialize, Serialize};

/// Frames already unwound and named, as a stripped capture holds them (`lanalyze --strip`),
/// numbered from `first` on in the order given. A stripped capture holds no raw samples,
/// stack bytes, registers or binaries: only these, [`ResolvedSample`]s, a
/// [`ResolvedSummary`], the header, thread names, lost counts and the end record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ResolvedFrames {
    pub first: u32,
    pub frames: Vec<ResolvedFrame>,
}

/// One named frame (see `lanalyze::Frame`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ResolvedFrame {
    pub function: String,
    pub module: Option<String>,
    /// [`resolved_frame_kind`].
    pub kind: u8,
    /// A Lua function's (line defined, line running).
    pub lua_lines: Option<(u32, u32)>,
    /// A Lua function running JIT-compiled code.
    pub jit: bool,
}

/// [`ResolvedFrame::kind`] values.
pub mod resolved_frame_kind {
    pub const USER: u8 = 0;
    pub const INLINED: u8 = 1;
    pub const KERNEL: u8 = 2;
    pub const LUA: u8 = 3;
    /// A marker of time off CPU (`[sleeping]`).
    pub const WAIT: u8 = 4;
}

/// One sample of a stripped capture: its frames (ids of [`ResolvedFrames`]), root first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ResolvedSample {
    pub time_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub frames: Vec<u32>,
    /// [`resolved_flags`].
    pub flags: u32,
    /// The Lua VM's state, when the sample ran in a Lua VM.
    pub vm_state: Option<i32>,
}

/// [`ResolvedSample::flags`] bits.
pub mod resolved_flags {
    /// The stack stops before its root function.
    pub const TRUNCATED: u32 = 1;
    /// Not even one frame beyond the leaf was found.
    pub const FAILED: u32 = 2;
    pub const KERNEL_MODE: u32 = 4;
    /// In a LuaJIT trace, mapped to its snapshot's frames / not mapped.
    pub const JIT_MAPPED: u32 = 8;
    pub const JIT_UNMAPPED: u32 = 16;
}

/// What the analysis behind a stripped capture found about the binaries and Lua VMs of
/// the original, and what it warned about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ResolvedSummary {
    pub binaries: Vec<ResolvedBinary>,
    pub lua_vms: Vec<ResolvedLuaVm>,
    pub warnings: Vec<ResolvedWarning>,
}

/// Where the unwind and symbol data of a binary came from (`lanalyze::BinaryInfo`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ResolvedBinary {
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

/// What the analysis behind a stripped capture found that [`ResolvedSummary`] (written by
/// earlier versions) does not hold, for `lanalyze --info`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ResolvedDetails {
    /// How each binary of the summary was named, in the order of its `binaries`.
    pub binary_names: Vec<BinaryNames>,
    /// How many Lua VMs (distinct global states) ran in samples, per process and kind.
    pub lua_states: Vec<LuaStates>,
}

/// Lua VMs seen running in one process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct LuaStates {
    pub pid: u32,
    /// PUC Lua (else LuaJIT).
    pub puc: bool,
    pub vms: u64,
}

/// What named a binary's functions, and how many samples it left without names
/// (`lanalyze::BinaryInfo`'s companion).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct BinaryNames {
    /// The best naming section and where it came from: `symbol table, debuginfod URL`,
    /// `exported symbols only (.dynsym), embedded in the capture`, `none`.
    pub names_from: String,
    /// Samples with a native frame in the binary.
    pub samples: u64,
    /// Of those, samples with a frame in it that no symbol names (shown as `file+0xOFFSET`).
    pub unnamed: u64,
}

/// A Lua VM found in a recorded process (`lanalyze::LuaVmInfo`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ResolvedLuaVm {
    pub pid: u32,
    /// `LuaJIT 2.1`.
    pub vm: String,
    /// The layout that validated, empty when none did.
    pub layout: String,
    pub path: String,
    pub error: Option<String>,
}

/// A problem met while analysing, reported once with how often it happened
/// (`lanalyze::Warning`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, Default)]
pub struct ResolvedWarning {
    pub message: String,
    pub count: u64,
}
