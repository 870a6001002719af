//! What the stages of the analysis hand each other: located frames, unwound samples and
//! chunks, the distinct frames, names per image, warnings. The stages (analysis's
//! unwinding, waits, assemble, strip) import these and nothing of each other's.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::Arc;

use lrec_format::LostCauses;
use rustc_hash::FxHashMap;

use crate::address_space::AddressSpace;
use crate::lua::luajit;
use crate::profile::{ProfileSample, SampleKind, Stats, Thread, Warning};
use crate::symbolize::FunctionAt;
use crate::unwind::{CodeAddress, StackEnd};

/// A user frame located in the process's memory map.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum UserFrame {
    /// In a mapped image: named by its symbols at `lookup_svma`.
    Image {
        image: usize,
        lookup_svma: u64,
        file_offset: u64,
    },
    /// In a mapping without a usable image (`[vdso]`, a file lrec could not read).
    Mapped { module: Arc<str>, file_offset: u64 },
    /// In no mapping, or in anonymous memory.
    Unmapped,
    /// A Lua function of process `pid` (a [`lrec_format::LuaProto`] id), at `line` (0:
    /// unknown), called from (proto, position) when a Lua call names it.
    Lua {
        pid: u32,
        proto: u32,
        line: u32,
        called_from: Option<(u32, u32)>,
        /// Running as JIT-compiled code.
        jit: bool,
    },
    /// A Lua VM's built-in function.
    LuaBuiltin { pid: u32, id: u8 },
    /// A Lua VM state that runs no Lua code (`[GC]`).
    LuaState(&'static str),
}

/// A region that unwinding had to cross without unwind info.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum WithoutUnwindInfo {
    Image(usize),
    Region(Arc<str>),
}

#[derive(Clone)]
pub(crate) struct UnwoundSample {
    pub(crate) time_ns: u64,
    pub(crate) pid: u32,
    pub(crate) tid: u32,
    /// Leaf first, as indices into the chunk's [`ChunkFrames`].
    pub(crate) user: Vec<u32>,
    /// Innermost first, as recorded.
    pub(crate) kernel: Vec<u64>,
    pub(crate) end: StackEnd,
    pub(crate) kernel_mode: bool,
    pub(crate) no_mappings: bool,
    pub(crate) without_unwind_info: Vec<WithoutUnwindInfo>,
    /// The Lua VM's state (`G->vmstate`), when the sample ran in a Lua VM.
    pub(crate) vm_state: Option<i32>,
    /// In a LuaJIT trace: whether its snapshot gave the inlined frames (`Some(true)`) or
    /// the sample could not be mapped (`Some(false)`).
    pub(crate) jit_mapped: Option<bool>,
    /// A CPU sample, time off CPU or a thread's state.
    pub(crate) kind: SampleKind,
    /// The sample's Lua frames had no interpreter frame to replace in a complete native
    /// stack, and were left out.
    pub(crate) lua_unplaced: bool,
    /// The Lua VM the sample ran in: its global state's address, and whether it is PUC
    /// Lua's (not LuaJIT's).
    pub(crate) lua_vm: Option<(u64, bool)>,
}

impl UnwoundSample {
    /// A sample of `kind` with only the frames given (no unwinding: a user leaf, if any,
    /// and a kernel stack).
    pub(crate) fn unwalked(
        time_ns: u64,
        pid: u32,
        tid: u32,
        user: Vec<u32>,
        kernel: Vec<u64>,
        kind: SampleKind,
    ) -> UnwoundSample {
        UnwoundSample {
            time_ns,
            pid,
            tid,
            user,
            kernel_mode: !kernel.is_empty(),
            kernel,
            end: StackEnd::Complete,
            no_mappings: false,
            without_unwind_info: Vec::new(),
            vm_state: None,
            jit_mapped: None,
            kind,
            lua_unplaced: false,
            lua_vm: None,
        }
    }
}

/// Gives each distinct value a dense 4-byte index, in first-seen order: samples hold
/// indices, so each frame is hashed once and stored once.
pub(crate) struct Interner<T> {
    pub(crate) ids: FxHashMap<T, u32>,
    pub(crate) list: Vec<T>,
}

impl<T> Default for Interner<T> {
    fn default() -> Self {
        Interner {
            ids: FxHashMap::default(),
            list: Vec::new(),
        }
    }
}

impl<T: Hash + Eq + Clone> Interner<T> {
    pub(crate) fn id(&mut self, value: T) -> u32 {
        if let Some(&id) = self.ids.get(&value) {
            return id;
        }
        let id = self.list.len() as u32;
        self.list.push(value.clone());
        self.ids.insert(value, id);
        id
    }
}

/// The distinct user frames of one chunk.
pub(crate) type ChunkFrames = Interner<UserFrame>;

/// The unwound samples of one chunk.
pub(crate) struct UnwoundChunk {
    pub(crate) frames: Vec<UserFrame>,
    pub(crate) samples: Vec<UnwoundSample>,
}

/// The distinct frames of all samples, sorted (so that frame ids do not depend on thread
/// scheduling), with each chunk's local frame indices mapped to indices into `user`.
/// Kernel addresses come with whether they are the leaf (looked up as is).
pub(crate) struct DistinctFrames {
    pub(crate) user: Vec<UserFrame>,
    /// Per chunk: local frame index → index into `user`.
    pub(crate) remap: Vec<Vec<u32>>,
    pub(crate) kernel: Vec<(u64, bool)>,
}

/// The frame `address` is in `space`: an image's address to name, a mapping without an
/// image, or unmapped.
pub(crate) fn locate(space: &AddressSpace, address: &CodeAddress) -> UserFrame {
    let Some(r) = address.region.map(|i| space.region_at(i)) else {
        return UserFrame::Unmapped;
    };
    if r.name.is_empty() {
        return UserFrame::Unmapped;
    }
    let file_offset = r.file_offset(address.avma);
    match (r.image, r.bias) {
        (Some(image), Some(bias)) => UserFrame::Image {
            image,
            lookup_svma: address.lookup_avma().wrapping_sub(bias),
            file_offset,
        },
        _ => UserFrame::Mapped {
            module: r.name.clone(),
            file_offset,
        },
    }
}

/// Per image: the functions at each looked-up address.
pub(crate) type ImageNames = HashMap<u64, Vec<FunctionAt>>;
pub(crate) type Names = Vec<ImageNames>;

/// Warnings, each kept once with how often it happened, in order of first occurrence
/// (capture order, which is deterministic).
#[derive(Default)]
pub(crate) struct WarningCounter {
    pub(crate) messages: Interner<String>,
    pub(crate) counts: Vec<u64>,
}

impl WarningCounter {
    pub(crate) fn add(&mut self, message: String) {
        self.add_n(message, 1);
    }

    pub(crate) fn add_n(&mut self, message: String, n: u64) {
        let i = self.messages.id(message) as usize;
        if i == self.counts.len() {
            self.counts.push(0);
        }
        self.counts[i] += n;
    }

    pub(crate) fn into_sorted(self) -> Vec<Warning> {
        let counts = self.counts.into_iter();
        let messages = self.messages.list.into_iter();
        messages
            .zip(counts)
            .map(|(message, count)| Warning { message, count })
            .collect()
    }
}

/// The threads of `samples`, by (pid, tid), named by `name`; sets each sample's
/// [`ProfileSample::thread`].
pub(crate) fn index_threads(
    samples: &mut [ProfileSample],
    name: impl Fn(u32, u32) -> String,
) -> Vec<Thread> {
    // Threads sorted by (pid, tid), each with its index.
    let mut index: BTreeMap<(u32, u32), usize> =
        samples.iter().map(|s| ((s.pid, s.tid), 0)).collect();
    for (i, slot) in index.values_mut().enumerate() {
        *slot = i;
    }
    let mut threads: Vec<Thread> = index
        .keys()
        .map(|&(pid, tid)| Thread {
            pid,
            tid,
            name: name(pid, tid),
            samples: 0,
        })
        .collect();
    for s in samples.iter_mut() {
        s.thread = index[&(s.pid, s.tid)];
        threads[s.thread].samples += 1;
    }
    threads
}

/// The counters of a profile's samples; `lost` is what the kernel reported dropped, and
/// `lost_causes` why, when lrec said.
pub(crate) fn sample_stats(
    samples: &[ProfileSample],
    lost: u64,
    lost_causes: Option<LostCauses>,
) -> Stats {
    let mut stats = Stats {
        lost,
        lost_causes,
        ..Stats::default()
    };
    for s in samples {
        stats.samples += 1;
        stats.first_time_ns = Some(stats.first_time_ns.map_or(s.time_ns, |t| t.min(s.time_ns)));
        stats.last_time_ns = Some(stats.last_time_ns.map_or(s.time_ns, |t| t.max(s.time_ns)));
        match s.end {
            StackEnd::Complete => {}
            StackEnd::Truncated => stats.truncated += 1,
            StackEnd::Failed => stats.failed_unwinds += 1,
        }
        stats.kernel_samples += u64::from(s.kernel_mode);
        if let Some(state) = s.vm_state {
            *stats
                .vm_states
                .entry(luajit::state_name(state))
                .or_default() += 1;
        }
        match s.jit_mapped {
            Some(true) => stats.jit_mapped += 1,
            Some(false) => stats.jit_unmapped += 1,
            None => {}
        }
    }
    stats
}
