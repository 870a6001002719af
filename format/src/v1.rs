//! Records of format version 1.
//!
//! Every record is a plain struct encoded with bincode (serde, standard config) and framed
//! in a chunk as `kind: u16, len: u32, payload`. A reader that meets a kind it does not know
//! skips `len` bytes and counts it, so new record kinds never break old readers.

use crate::heap::{LuaHeap, LuaHeapCopy, LuaHeapMemory, ResolvedHeap};
use serde::{Deserialize, Serialize};

mod latency;
mod off_cpu;
mod resolved;
pub use latency::*;
pub use off_cpu::*;
pub use resolved::*;

/// Numeric record kinds. Never reuse a number; add new kinds at the end.
pub mod kind {
    pub const HEADER: u16 = 1;
    pub const PROCESS: u16 = 2;
    pub const THREAD_NAME: u16 = 3;
    pub const MAPPING: u16 = 4;
    pub const BINARY: u16 = 5;
    pub const SAMPLE: u16 = 6;
    pub const LOST: u16 = 7;
    pub const END: u16 = 8;
    pub const KERNEL_SYMBOLS: u16 = 9;
    /// A [`LuaStack`](super::LuaStack) sharing its outer frames with the previous Lua
    /// stack of its thread (and process) in the same chunk: encoded as a `LUA_STACK` of
    /// the frames it does not share, then how many it does (a varint). Readers give it as
    /// a whole `LuaStack`; lrec writes it for a deep stack whose outer frames did not
    /// change (most samples of a deep stack).
    pub const LUA_STACK_SHARED: u16 = 10;
    /// The Lua frames of one sample ([`LuaStack`](super::LuaStack)), written just before
    /// the sample it belongs to, in the same chunk.
    pub const LUA_STACK: u16 = 16;
    /// A Lua function prototype's names and lines ([`LuaProto`](super::LuaProto)).
    pub const LUA_PROTO: u16 = 17;
    /// A Lua VM found in a process ([`LuaRuntime`](super::LuaRuntime)).
    pub const LUA_RUNTIME: u16 = 18;
    /// Frames of a stripped capture ([`ResolvedFrames`](super::ResolvedFrames)).
    pub const RESOLVED_FRAMES: u16 = 19;
    /// A sample of a stripped capture ([`ResolvedSample`](super::ResolvedSample)).
    pub const RESOLVED_SAMPLE: u16 = 20;
    /// What the analysis behind a stripped capture found
    /// ([`ResolvedSummary`](super::ResolvedSummary)).
    pub const RESOLVED_SUMMARY: u16 = 21;
    /// A blocked interval of a thread with its stacks at switch-out ([`OffCpu`](super::OffCpu)),
    /// its Lua stack (if any) just before it, as for a sample.
    pub const OFF_CPU: u16 = 22;
    /// Every recorded thread's state at one moment ([`ThreadStates`](super::ThreadStates)).
    pub const THREAD_STATES: u16 = 23;
    /// Off-CPU time counted but not recorded with stacks, per thread
    /// ([`OffCpuTotals`](super::OffCpuTotals)).
    pub const OFF_CPU_TOTALS: u16 = 24;
    /// What `--latency`/`--node-loop` timed and the histograms of the durations
    /// ([`Latency`](super::Latency)), written at the end.
    pub const LATENCY: u16 = 25;
    /// One timed call (`--latency-events`, [`LatencyCall`](super::LatencyCall)).
    pub const LATENCY_CALL: u16 = 26;
    /// What a stripped capture's summary leaves out: how binaries were named, how many Lua
    /// VMs ran ([`ResolvedDetails`](super::ResolvedDetails)).
    pub const RESOLVED_DETAILS: u16 = 27;
    /// A Lua VM of a heap snapshot ([`LuaHeap`](crate::heap::LuaHeap)).
    pub const LUA_HEAP: u16 = 28;
    /// What a process's heap snapshot cost ([`LuaHeapCopy`](crate::heap::LuaHeapCopy)).
    pub const LUA_HEAP_COPY: u16 = 29;
    /// A piece of a heap snapshot's memory ([`LuaHeapMemory`](crate::heap::LuaHeapMemory)).
    pub const LUA_HEAP_MEMORY: u16 = 30;
    /// A Lua VM's heap census and paths in a stripped capture
    /// ([`ResolvedHeap`](crate::heap::ResolvedHeap)).
    pub const RESOLVED_HEAP: u16 = 31;
    /// Why samples were lost ([`LostCauses`](super::LostCauses)), written at the end.
    pub const LOST_CAUSES: u16 = 32;
    /// The recording's window and the off-CPU intervals it cut
    /// ([`OffCpuWindow`](super::OffCpuWindow)), written at the end.
    pub const OFF_CPU_WINDOW: u16 = 33;
}

/// What the recording was and where it happened. Always the first record of a capture.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Header {
    /// `lrec x.y.z`.
    pub tool_version: String,
    /// `uname -r` of the recording machine.
    pub kernel_release: String,
    pub hostname: String,
    /// `x86_64`, `aarch64`, …: the register layout of [`Regs`] depends on it.
    pub arch: String,
    pub page_size: u32,
    pub frequency_hz: u32,
    /// The perf event sampled, e.g. `cpu-clock`.
    pub event: String,
    /// The most user-stack bytes copied per sample.
    pub stack_size: u32,
    /// The lrec command line.
    pub command_line: Vec<String>,
    /// Wall-clock time at start, nanoseconds since the Unix epoch.
    pub wall_clock_start_ns: u64,
    /// CLOCK_MONOTONIC at start (the clock of [`Sample::time_ns`]).
    pub monotonic_start_ns: u64,
    /// The process recorded.
    pub target_pid: u32,
}

/// A process that samples were taken from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Process {
    pub pid: u32,
    pub ppid: u32,
    /// Target of /proc/PID/exe.
    pub exe: String,
    pub cmdline: Vec<String>,
    /// `(name, inode)` from /proc/PID/ns, e.g. `("mnt", 4026531841)`.
    pub namespaces: Vec<(String, u64)>,
}

/// The name (comm) of a thread, recorded when the thread is first seen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ThreadName {
    pub pid: u32,
    pub tid: u32,
    pub name: String,
}

/// One line of /proc/PID/maps. Mappings are only ever added: a later mapping that
/// overlaps an earlier one replaces it from `time_ns` on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Mapping {
    pub pid: u32,
    /// Monotonic time at which the mapping was read.
    pub time_ns: u64,
    pub start: u64,
    pub end: u64,
    /// File offset of `start`.
    pub offset: u64,
    /// `r-xp` and the like.
    pub perms: String,
    pub dev_major: u32,
    pub dev_minor: u32,
    pub inode: u64,
    /// Path as in /proc/PID/maps (`[vdso]`, `[stack]`, or a file).
    pub path: String,
    /// GNU build-id of the mapped ELF file, when it has one.
    #[serde(with = "serde_bytes")]
    pub build_id: Option<Vec<u8>>,
}

/// A program header of type PT_LOAD.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Segment {
    pub vaddr: u64,
    pub offset: u64,
    pub filesz: u64,
    pub memsz: u64,
    /// PF_X = 1, PF_W = 2, PF_R = 4.
    pub flags: u32,
}

/// One ELF section. `data` is empty when the section was not embedded, and is always
/// stored uncompressed (an SHF_COMPRESSED section is inflated; `size` is then its
/// uncompressed size).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Section {
    pub name: String,
    /// sh_addr: the section's address before relocation (SVMA).
    pub addr: u64,
    pub offset: u64,
    pub size: u64,
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

/// The parts of an ELF file needed to unwind and symbolize without the file.
/// Written once per build-id (or per path for files without one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Binary {
    #[serde(with = "serde_bytes")]
    pub build_id: Option<Vec<u8>>,
    pub path: String,
    pub file_size: u64,
    /// ET_EXEC = 2, ET_DYN = 3.
    pub elf_type: u16,
    pub segments: Vec<Segment>,
    /// Embedded sections (.eh_frame, .eh_frame_hdr, .debug_frame, .symtab, .strtab,
    /// .dynsym, .dynstr, .gnu_debuglink, optionally .debug_*), plus `.text` with empty data
    /// so that its address range is known.
    pub sections: Vec<Section>,
    /// Why nothing was embedded (unreadable file, not ELF, …), if so.
    pub error: Option<String>,
}

impl Binary {
    pub fn section(&self, name: &str) -> Option<&Section> {
        self.sections.iter().find(|s| s.name == name)
    }

    /// A section's bytes, if present and non-empty.
    pub fn data(&self, name: &str) -> Option<&[u8]> {
        Some(self.section(name)?.data.as_slice()).filter(|d| !d.is_empty())
    }
}

/// x86_64 user registers at the sample. `#[repr(C)]` with the layout of `struct lrec_regs`
/// in ebpf/sample.h, so lrec copies it out of BPF records as is (asserted in
/// record/src/raw.rs).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Regs {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    pub ax: u64,
    pub bx: u64,
    pub cx: u64,
    pub dx: u64,
    pub si: u64,
    pub di: u64,
    pub r8: u64,
    pub r9: u64,
    pub r10: u64,
    pub r11: u64,
    pub r12: u64,
    pub r13: u64,
    pub r14: u64,
    pub r15: u64,
    pub flags: u64,
}

/// Flags of [`Sample::flags`].
pub mod sample_flags {
    /// The sample interrupted kernel code; `regs` are the user registers saved on entry.
    pub const KERNEL_MODE: u32 = 1;
    /// The user-stack copy stopped at a fault before `stack_size` bytes.
    pub const STACK_FAULTED: u32 = 2;
    /// The user registers could not be read.
    pub const NO_USER_REGS: u32 = 4;
}

/// One sample: raw registers and stack bytes, as copied by BPF.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Sample {
    /// CLOCK_MONOTONIC, nanoseconds.
    pub time_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub cpu: u32,
    pub flags: u32,
    pub regs: Regs,
    /// User-stack bytes starting at `regs.sp`.
    #[serde(with = "serde_bytes")]
    pub user_stack: Vec<u8>,
    /// Kernel return addresses, innermost first (empty for user-mode samples).
    pub kernel_stack: Vec<u64>,
}

/// A [`Sample`] decoded in place: its stack bytes borrow from the decompressed chunk.
/// Same fields in the same order as `Sample`, so the encoding is the same.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleRef<'a> {
    pub time_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub cpu: u32,
    pub flags: u32,
    pub regs: Regs,
    #[serde(borrow)]
    pub user_stack: &'a [u8],
    pub kernel_stack: Vec<u64>,
}

impl SampleRef<'_> {
    pub fn to_owned(&self) -> Sample {
        Sample {
            time_ns: self.time_ns,
            pid: self.pid,
            tid: self.tid,
            cpu: self.cpu,
            flags: self.flags,
            regs: self.regs,
            user_stack: self.user_stack.to_vec(),
            kernel_stack: self.kernel_stack.clone(),
        }
    }
}

/// A record visited in place by [`crate::Capture::visit_chunk`].
#[derive(Debug)]
pub enum RecordRef<'a> {
    Sample(SampleRef<'a>),
    OffCpu(OffCpuRef<'a>),
    Other(Record),
}

/// Samples the kernel could not hand over (ring buffer full), counted since the last `Lost`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Lost {
    pub time_ns: u64,
    pub count: u64,
}

/// Why the samples counted in `Lost` records were lost: each time the kernel reported
/// more, whether lrec's drain had run late (it waited for a CPU: the machine was
/// saturated) or on time (the ring is too small for the rate). Written at the end of a
/// recording that lost samples.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct LostCauses {
    /// Samples lost while the drain ran late.
    pub starved: u64,
    /// Samples lost although the drain ran on time.
    pub ring_full: u64,
    /// How late the drain ran at worst (ns past its tick).
    pub worst_late_ns: u64,
    /// The ring's size.
    pub ring_bytes: u64,
}

impl LostCauses {
    /// One sentence: why, and what to do, for `lost` samples lost in all.
    pub fn explain(&self, lost: u64) -> String {
        let mut parts = Vec::new();
        if self.starved > 0 {
            parts.push(format!(
                "{} while lrec waited for a CPU (its drain ran up to {} ms late: the \
                 machine was saturated; as root lrec runs at nice -20, as a user it cannot)",
                self.starved,
                self.worst_late_ns / 1_000_000
            ));
        }
        if self.ring_full > 0 {
            parts.push(format!(
                "{} with the {} MiB ring full although drained on time (raise --ring-mib, or \
                 lower -F)",
                self.ring_full,
                self.ring_bytes >> 20
            ));
        }
        match parts.is_empty() {
            true => format!("{lost} lost"),
            false => format!("{lost} lost: {}", parts.join("; ")),
        }
    }
}

/// Kernel symbols covering the kernel addresses seen in samples (from /proc/kallsyms).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct KernelSymbols {
    /// `(start, end, name)` sorted by start; `end` is the next symbol's start.
    pub symbols: Vec<(u64, u64, String)>,
}

/// The last record of a complete capture.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct End {
    pub time_ns: u64,
    pub samples: u64,
    pub lost: u64,
    /// Why recording stopped: `duration`, `signal`, `target exited`.
    pub reason: String,
}

/// A Lua VM implementation found in a process's memory: where its interpreter lies, how
/// its structures are laid out, and how its built-in functions are named.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct LuaRuntime {
    pub pid: u32,
    /// `LuaJIT 2.1`, `Lua 5.4`, …
    pub vm: String,
    /// The layout that validated against the live process (`openresty-gc64`, …); empty
    /// when none did (then `error` says why and samples carry no Lua frames).
    pub layout: String,
    /// The file holding the interpreter.
    pub path: String,
    /// The interpreter's machine code, as mapped in the process: native frames in this
    /// range are the VM's own and are replaced by the Lua frames they ran.
    pub vm_start: u64,
    pub vm_end: u64,
    /// Bytes of the VM's native C frame (LuaJIT: CFRAME_SIZE).
    pub cframe_size: u32,
    /// Names of the built-in (fast) functions by id (LuaJIT: ffid), `""` when unknown.
    pub builtins: Vec<String>,
    pub error: Option<String>,
}

/// Names and lines of one Lua function prototype, written once the first time a sample
/// runs it. `id` is unique per capture and process: a proto freed and another allocated
/// at the same address gets a new id; protos of the same content (the same chunk loaded
/// again, by a VM made per request) may share one.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct LuaProto {
    pub pid: u32,
    pub id: u32,
    /// The chunk name as the VM holds it (`@file.lua`, `=name`, or the source text).
    pub chunkname: String,
    pub firstline: i32,
    pub numline: u32,
    /// Source line of each bytecode position (0 = the function header).
    pub lines: Vec<u32>,
    /// The name each calling position gives its callee, as Lua's debug.getinfo 'n'
    /// derives it (`hot` for `hot()`, `run` for `m.run()` or `m:run()`, `__add` for a
    /// metamethod), sorted by position.
    pub callee_names: Vec<(u32, String)>,
}

/// Flags of [`LuaStack::flags`].
pub mod lua_flags {
    /// More frames than the recorder walks: the outermost ones are missing.
    pub const TRUNCATED: u32 = 1;
    /// A frame or proto could not be read: the stack ends early.
    pub const BROKEN: u32 = 2;
    /// In a LuaJIT trace whose snapshot covering the sampled instruction gave the frames
    /// of the functions inlined into the trace and the current lines.
    pub const JIT_MAPPED: u32 = 4;
    /// In a LuaJIT trace that could not be mapped to a snapshot (unknown, flushed, or
    /// outside its machine code): the trace's base frame is innermost, without a line.
    pub const JIT_UNMAPPED: u32 = 8;
    /// The frames of a suspended coroutine (a Lua wait, [`super::OFF_CPU_LUA_YIELD`]), not
    /// of the state the thread runs: they lie above the native stack, its resumer's.
    pub const SUSPENDED: u32 = 16;
    /// Walked by PUC Lua's walker: the process's PUC Lua runtime ran it, not its LuaJIT
    /// (a process may hold both). Captures before lrec set it have PUC stacks without it.
    pub const PUC: u32 = 32;
}

/// [`LuaFrame::link`] bit (LuaJIT): the frame ran as JIT-compiled code, the start frame of
/// a trace or a function inlined into it. The low bits stay the link's FRAME_* type.
pub const LUA_LINK_JIT: u8 = 0x80;

/// What a [`LuaFrame`] runs.
pub mod lua_frame_kind {
    /// A Lua function: `function` is a [`LuaProto`](super::LuaProto) id.
    pub const LUA: u8 = 0;
    /// A C function (`address` is its entry point).
    pub const C: u8 = 1;
    /// A built-in (fast) function: `builtin` is its id, `address` its C fallback if any.
    pub const BUILTIN: u8 = 2;
}

/// [`LuaFrame::link`] bits of PUC Lua frames.
pub mod puc_link {
    /// A native `luaV_execute` call began at this frame (it was called from C, or by the
    /// VM for a metamethod or an iterator): the Lua frames from here to the next such
    /// frame inward run in one native frame.
    pub const FRESH: u8 = 1;
    /// Reached by a tail call: its caller's frame is gone.
    pub const TAIL: u8 = 2;
}

/// One Lua frame.
#[derive(Debug, Clone, Eq, Serialize, Deserialize, Default)]
pub struct LuaFrame {
    /// [`lua_frame_kind`].
    pub kind: u8,
    pub builtin: u8,
    /// How this frame was called (LuaJIT: the FRAME_* type of its link; PUC Lua:
    /// [`puc_link`] bits).
    pub link: u8,
    /// [`LuaProto::id`] of a Lua frame.
    pub function: u32,
    pub address: u64,
    /// Bytecode position current in the frame, `u32::MAX` when unknown.
    pub pos: u32,
    /// Stack address of the VM's native frame that runs this frame (LuaJIT: its cframe;
    /// PUC Lua: where the frame's coroutine began on the native stack, 0 for the
    /// outermost thread).
    pub cframe: u64,
}

impl PartialEq for LuaFrame {
    /// Every field, without a branch for each: the capture writer compares a deep stack's
    /// frames with its thread's last ones at every sample. (Destructured: a field added
    /// is a field compared.)
    fn eq(&self, o: &Self) -> bool {
        let LuaFrame {
            kind,
            builtin,
            link,
            function,
            address,
            pos,
            cframe,
        } = self;
        ((address ^ o.address)
            | (cframe ^ o.cframe)
            | u64::from(function ^ o.function)
            | u64::from(pos ^ o.pos)
            | u64::from(kind ^ o.kind)
            | u64::from(builtin ^ o.builtin)
            | u64::from(link ^ o.link))
            == 0
    }
}

/// The Lua frames of one sample, innermost first, across the coroutines that resumed
/// one another. Written just before its [`Sample`], in the same chunk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct LuaStack {
    pub pid: u32,
    pub tid: u32,
    pub time_ns: u64,
    /// The VM (LuaJIT: global_State address), telling several VMs of a process apart.
    pub vm: u64,
    /// The running Lua thread (innermost coroutine).
    pub state: u64,
    /// Its innermost C frame (LuaJIT: `L->cframe`), which may run no Lua frame itself
    /// (lua_cpcall, lua_load).
    pub cframe: u64,
    /// The VM's state (LuaJIT: `G->vmstate`: a trace number ≥ 0, or ~LJ_VMST_*).
    pub vmstate: i32,
    /// [`lua_flags`].
    pub flags: u32,
    pub frames: Vec<LuaFrame>,
}

/// The record kinds of this version, one line each: `$then!` is called with the list.
/// Here it generates the [`Record`] variant, its kind number and `From<T> for Record`
/// ([`records`]); in `codec.rs`, its encoding and decoding.
macro_rules! record_kinds {
    ($then:ident) => {
        $then!(
            Header = HEADER,
            Process = PROCESS,
            ThreadName = THREAD_NAME,
            Mapping = MAPPING,
            Binary = BINARY,
            Sample = SAMPLE,
            Lost = LOST,
            End = END,
            KernelSymbols = KERNEL_SYMBOLS,
            LuaStack = LUA_STACK,
            LuaProto = LUA_PROTO,
            LuaRuntime = LUA_RUNTIME,
            ResolvedFrames = RESOLVED_FRAMES,
            ResolvedSample = RESOLVED_SAMPLE,
            ResolvedSummary = RESOLVED_SUMMARY,
            OffCpu = OFF_CPU,
            ThreadStates = THREAD_STATES,
            OffCpuTotals = OFF_CPU_TOTALS,
            Latency = LATENCY,
            LatencyCall = LATENCY_CALL,
            ResolvedDetails = RESOLVED_DETAILS,
            LuaHeap = LUA_HEAP,
            LuaHeapCopy = LUA_HEAP_COPY,
            LuaHeapMemory = LUA_HEAP_MEMORY,
            ResolvedHeap = RESOLVED_HEAP,
            LostCauses = LOST_CAUSES,
            OffCpuWindow = OFF_CPU_WINDOW,
        );
    };
}
pub(crate) use record_kinds;

/// The [`Record`] enum of the kinds [`record_kinds`] lists.
macro_rules! records {
    ($($variant:ident = $kind:ident),* $(,)?) => {
        /// A decoded record.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum Record {
            $($variant($variant),)*
            /// A record kind this reader does not know; its payload is kept undecoded.
            Unknown { kind: u16, payload: Vec<u8> },
        }

        impl Record {
            pub fn kind(&self) -> u16 {
                match self {
                    $(Record::$variant(_) => kind::$kind,)*
                    Record::Unknown { kind, .. } => *kind,
                }
            }
        }

        $(impl From<$variant> for Record {
            fn from(r: $variant) -> Self {
                Record::$variant(r)
            }
        })*
    };
}

record_kinds!(records);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_samples_are_explained_with_what_to_do() {
        let starved = LostCauses {
            starved: 900,
            ring_full: 0,
            worst_late_ns: 850_000_000,
            ring_bytes: 16 << 20,
        };
        let text = starved.explain(900);
        assert!(
            text.starts_with("900 lost: 900 while lrec waited for a CPU"),
            "{text}"
        );
        assert!(text.contains("850 ms late"), "{text}");
        let full = LostCauses {
            ring_full: 12,
            ..starved.clone()
        };
        let text = full.explain(912);
        assert!(text.contains("12 with the 16 MiB ring full"), "{text}");
        assert!(text.contains("--ring-mib"), "{text}");
        assert_eq!(LostCauses::default().explain(3), "3 lost");
    }
}
