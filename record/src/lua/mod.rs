//! The Lua VMs of the recorded processes, LuaJIT's and PUC Lua's: where each process's
//! interpreter is, which layout it has (learned from its binary and proved on the live
//! process: [`luajit`], [`puc`]), the BPF walker's configuration per process, and the capture records of the frames it walks,
//! each function prototype's names and lines written once. One design of Lua frames,
//! protos and runtimes serves both VMs.

pub mod heap;
pub mod luajit;
pub mod luajit_builtins;
pub mod luajit_bytecode;
pub mod puc;
pub mod puc_names;
mod puc_proof;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use lrec_format::{lua_flags, LuaFrame, LuaProto, LuaRuntime, LuaStack, Record, Sample};
use rustc_hash::FxHashMap;

use lrec_inspect::lua::frees;
use lrec_inspect::lua::named::ABSENT;

use crate::raw::{
    LuaWalk, RawLuaConfig, RawLuaFrame, RawLuaProto, RawPucConfig, FRAME_FROM_SITE, MAX_LUA_RANGES,
};
use generations::TwoGen;
use lrec_inspect::lua::luajit::learn::Learned;
use lrec_inspect::lua::luajit::Layout;
use lrec_inspect::lua::puc::learn::Learned as PucLearned;
use lrec_inspect::lua::puc::Layout as PucLayout;

/// The interpreter's code in one mapped binary: LuaJIT's, as found in its .eh_frame, or
/// PUC Lua's luaV_execute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VmCode {
    pub start: u64,
    pub end: u64,
    /// CFRAME_SIZE: the CFA offset of the VM's frame (LuaJIT).
    pub cframe_size: u32,
    /// PUC Lua: the release (minor, patch) named by the binary's version string.
    pub release: Option<(u32, u32)>,
    /// PUC Lua: how luaV_execute was found (see [`puc::find_execute`]).
    pub found_by: &'static str,
}

enum Detection {
    /// LuaJIT: the layout learned from the binary, being proved on samples: those that
    /// found its global state, those whose running prototype read as one (and not), and
    /// the samples that could have.
    Pending {
        layout: Box<Learned>,
        votes: u32,
        protos: (u32, u32),
        tries: u32,
    },
    /// LuaJIT: the layout proved, and its VM's trace array.
    Ready(Arc<Layout>, TraceArray),
    Failed,
    /// PUC Lua: the layout learned from the binary, being proved on samples: those whose
    /// running state read as it says and not, and the samples in its interpreter.
    PucPending {
        layout: Box<PucLearned>,
        proofs: (u32, u32),
        tries: u32,
    },
    /// PUC Lua: the layout proved.
    Puc(Arc<PucLayout>),
}

/// Where a LuaJIT VM's trace array lies from G, once known (from the binary, or found by
/// [`luajit::find_trace_array`]), and the samples in traces that looked for it.
#[derive(Default)]
struct TraceArray {
    offset: Option<u32>,
    tries: u32,
}

impl TraceArray {
    /// Whether it is still looked for, from the next sample in a trace.
    fn searching(&self) -> bool {
        self.offset.is_none() && self.tries < luajit::TRACE_TRIES
    }
}

struct ProcessVm {
    path: String,
    /// When the interpreter was found, or sampling started if that was later.
    found: std::time::Instant,
    /// lrec's time spent telling the layout (reading the target's memory).
    voting: std::time::Duration,
    code: Vec<VmCode>,
    detection: Detection,
    mem: Option<File>,
    /// The process maps this VM from another binary too (its frees are not all counted at
    /// `path`'s free function).
    others: bool,
    /// The process's samples before the VM was met: they carry no Lua frames.
    before: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
struct ProtoKey {
    pid: u32,
    ptr: u64,
    chunkname: u64,
    firstline: i32,
    numline: u32,
    sizebc: u32,
    name_id: u32,
}

/// Hashed by process and address alone: looked up for every Lua frame of every sample,
/// and protos at one address differ in their other fields only
/// after a collection (equality compares them all).
impl std::hash::Hash for ProtoKey {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        h.write_u64(self.ptr ^ (u64::from(self.pid) << 48));
    }
}

/// The key of a proto, from a frame that runs it ([`RawLuaFrame`]) or from BPF's copy of it
/// ([`RawLuaProto`]): both carry the fields that tell a proto from another at its address,
/// as BPF keys its copies (ebpf/luajit.h, lua_proto_key).
macro_rules! proto_key {
    ($pid:expr, $f:expr) => {
        ProtoKey {
            pid: $pid,
            ptr: $f.ptr,
            chunkname: $f.chunkname,
            firstline: $f.firstline,
            numline: $f.numline,
            sizebc: $f.sizebc,
            name_id: $f.name_id,
        }
    };
}

mod detect;
mod generations;
mod memo;
mod protos;
mod puc_detect;
mod reuse;

/// A sample's Lua stack, converted: its record without its frames, which are
/// [`LuaVms::frames_of`] its thread (until the thread's next sample), and how many of the
/// outermost are those of the thread's stack converted before (for
/// `CaptureWriter::push_lua_stack`: every stack converted is written, but while warming up).
pub struct Converted {
    pub stack: LuaStack,
    pub shared: usize,
}

/// The Lua VMs of every recorded process.
#[derive(Default)]
pub struct LuaVms {
    /// The LuaJIT and the PUC Lua interpreter of each process (a process may hold both).
    luajit: FxHashMap<u32, ProcessVm>,
    puc: FxHashMap<u32, ProcessVm>,
    /// Looked up for every Lua frame of every sample: a fast hash, not SipHash. Kept for
    /// two generations of BPF's copies ([`generations`]), as the two below.
    protos: TwoGen<ProtoKey, Option<u32>>,
    /// Chunk names and line tables BPF copied when a sample first ran a proto.
    copied: TwoGen<ProtoKey, RawLuaProto>,
    /// Protos frames named before BPF's copy of them came: their reserved id, and whether
    /// PUC Lua's.
    late: TwoGen<ProtoKey, (u32, bool)>,
    /// When the generations turn.
    generations: generations::Clock,
    /// The id of each proto record written, by its content (its id 0): protos of the
    /// same code at other addresses (a VM per request loads the same chunks again) share
    /// it, and the capture holds each once.
    by_content: FxHashMap<LuaProto, u32>,
    /// Each thread's last stack, whose outer frames the next one shares.
    last: reuse::LastStacks,
    /// Lua frames BPF walked, those it named from remembered call sites, and the sites
    /// whose proto was no longer the one remembered (read in full).
    frames: (u64, u64, u64),
    /// Each CPU's memo of its last full LuaJIT walk.
    memos: memo::Memos,
    next_proto: u32,
    /// BPF configurations to install: (pid, config).
    configs: Vec<(u32, RawLuaConfig)>,
    puc_configs: Vec<(u32, RawPucConfig)>,
    /// Records to write before the next sample.
    records: Vec<Record>,
    /// One-line messages for the user.
    pub messages: Vec<String>,
    /// The binaries holding a LuaJIT VM, in the order found; `new_luajit` is how many
    /// of them [`LuaVms::take_luajit_binaries`] has not handed out yet.
    luajit_binaries: Vec<String>,
    new_luajit: usize,
    /// Processes whose provisional BPF configuration is to be removed (their layout was
    /// not proved): (pid, PUC Lua's).
    removed: Vec<(u32, bool)>,
    /// Samples seen per process, and of each VM, how many came before it was met.
    sampled: FxHashMap<u32, u64>,
    /// Processes told that a binary they map holds a Lua VM lrec cannot locate.
    unlocated: std::collections::HashSet<(u32, String)>,
    /// The LuaJIT layout learned from each binary holding a VM (by path), or why none was.
    learned: FxHashMap<String, Result<Learned, String>>,
    /// The same for PUC Lua.
    learned_puc: FxHashMap<String, Result<PucLearned, String>>,
    /// Prototypes whose chunk name did not read as a name (left unnamed).
    unnamed: u64,
}

impl LuaVms {
    /// Notes the LuaJIT layout learned from binary `path` (or why none was), before the
    /// processes mapping it are told of ([`Self::add_vm`]).
    pub fn learned(&mut self, path: &str, learned: Result<Learned, String>) {
        self.learned.insert(path.to_string(), learned);
    }

    /// Notes the PUC Lua layout learned from binary `path` (or why none was).
    pub fn learned_puc(&mut self, path: &str, learned: Result<PucLearned, String>) {
        self.learned_puc.insert(path.to_string(), learned);
    }

    /// Notes an interpreter mapped in `pid` (from `path`).
    pub fn add_vm(&mut self, pid: u32, path: &str, code: VmCode) {
        if let Some((minor, patch)) = code.release {
            return self.add_puc(pid, path, code, minor, patch);
        }
        let new = !self.luajit.contains_key(&pid);
        let learned = self.learned.get(path).cloned();
        if let Some(first) = self.luajit.get(&pid).filter(|p| p.path != path) {
            // Another binary's LuaJIT in the same process: its code joins the walker's only
            // when it has the very layout the walker reads this process with.
            let read_with = match &first.detection {
                Detection::Pending { layout, .. } => Some(&layout.layout.offsets),
                Detection::Ready(layout, _) => Some(&layout.offsets),
                _ => None,
            };
            let same =
                matches!((&learned, read_with), (Some(Ok(l)), Some(o)) if l.layout.offsets == *o);
            if !same {
                let why = format!(
                    "found a second LuaJIT VM in {path}, but lrec reads one LuaJIT layout per \
                     process (here {}'s) and this one's differs or is unknown; recording native \
                     stacks only for this one",
                    file_name(&first.path)
                );
                return self.add_unlocated(pid, path, &why);
            }
        }
        let before = self.before(pid);
        let p = self.luajit.entry(pid).or_insert_with(|| {
            let readable = |l: &Learned| RawLuaConfig::new(&l.layout.offsets, &[], 0).readable();
            let detection = match &learned {
                Some(Ok(l)) if l.missing.is_empty() && readable(l) => Detection::Pending {
                    layout: Box::new(l.clone()),
                    votes: 0,
                    protos: (0, 0),
                    tries: 0,
                },
                _ => Detection::Failed,
            };
            let mut p = ProcessVm::new(pid, path, Vec::new(), detection);
            p.before = before;
            p
        });
        p.others |= p.path != path;
        if new && matches!(p.detection, Detection::Failed) {
            let why = match learned {
                Some(Ok(l)) if l.missing.is_empty() => format!(
                    "its prototypes' fields lie too far apart for lrec's walker ({})",
                    l.summary()
                ),
                Some(Ok(l)) => format!(
                    "nothing in the binary gives where its build keeps {} (learned: {})",
                    l.missing.join(", "),
                    l.summary()
                ),
                Some(Err(e)) => format!("its layout could not be learned from the binary: {e}"),
                None => "its binary could not be read to learn its layout".to_string(),
            };
            p.code.push(code);
            self.fail(pid, why);
            return;
        }
        if !self.luajit_binaries.iter().any(|b| b == path) {
            self.luajit_binaries.push(path.to_string());
            self.new_luajit += 1;
        }
        if p.code.contains(&code) || p.code.len() >= MAX_LUA_RANGES {
            return;
        }
        p.code.push(code);
        let pending = matches!(p.detection, Detection::Pending { .. });
        match self.layout_of(path) {
            // Proved in another process running the same binary.
            Some(layout) if pending => self.ready(pid, layout),
            // Ready: a second copy of the VM (another library), which the walker must know
            // too; pending: walked with the layout being proved.
            _ => self
                .configs
                .extend(self.luajit[&pid].config().map(|c| (pid, c))),
        }
    }

    /// The processes running a `vm` VM, each with the binary holding it when that is the
    /// only one of the process's binaries to hold one (else `None`).
    pub fn vm_binaries(&self, vm: frees::Vm) -> impl Iterator<Item = (u32, Option<&str>)> {
        let procs = match vm {
            frees::Vm::LuaJit => &self.luajit,
            frees::Vm::Puc => &self.puc,
        };
        procs
            .iter()
            .map(|(&pid, p)| (pid, (!p.others).then_some(p.path.as_str())))
    }

    /// Notes that process `pid` maps `path`, a binary whose version string shows a Lua VM
    /// that could not be located (`why`): said once, and recorded as a runtime in error.
    pub fn add_unlocated(&mut self, pid: u32, path: &str, why: &str) {
        if !self.unlocated.insert((pid, path.to_string())) {
            return;
        }
        let msg = format!("pid {pid}: {why}");
        self.messages.push(msg.clone());
        self.records.push(Record::LuaRuntime(LuaRuntime {
            pid,
            vm: "Lua".into(),
            path: path.to_string(),
            error: Some(msg),
            ..LuaRuntime::default()
        }));
    }

    /// The layout proved for a process running the VM in binary `path`: the same for
    /// every process running it (a pre-fork server's workers, whose VMs may run too
    /// seldom to be proved by their own samples).
    fn layout_of(&self, path: &str) -> Option<Layout> {
        self.luajit.values().find_map(|p| match &p.detection {
            Detection::Ready(layout, _) if p.path == path => Some((**layout).clone()),
            _ => None,
        })
    }

    /// Process pid's LuaJIT layout is proved: configures its walker and records its
    /// runtime.
    fn ready(&mut self, pid: u32, layout: Layout) {
        let Some(p) = self.luajit.get_mut(&pid) else {
            return;
        };
        let offset = (layout.offsets.j_trace != ABSENT).then_some(layout.offsets.j_trace);
        let traces = TraceArray {
            offset,
            ..TraceArray::default()
        };
        let r = luajit_runtime(pid, p, Some(&layout));
        p.detection = Detection::Ready(Arc::new(layout), traces);
        self.configs.extend(p.config().map(|c| (pid, c)));
        self.records.push(Record::LuaRuntime(r));
        self.joined(pid, false);
    }

    /// Process `pid`'s VM (PUC Lua's or LuaJIT's) is read from now on, and its samples
    /// held while its layout was proved with their Lua frames: the samples before it was
    /// met, if any, are said.
    fn joined(&mut self, pid: u32, puc: bool) {
        let vms = if puc { &self.puc } else { &self.luajit };
        let Some(p) = vms.get(&pid) else {
            return;
        };
        if p.before > 0 {
            self.messages.push(format!(
                "pid {pid}: Lua frames from its sample {} on: the VM in {} was met after its \
                 first {} (they have native frames only)",
                p.before + 1,
                p.path,
                p.before
            ));
        }
    }

    /// Keeps a proto BPF copied (from the `lua_protos` ring).
    pub fn on_proto(&mut self, bytes: &[u8]) {
        let Some(p) = RawLuaProto::decode(bytes) else {
            return;
        };
        let key = proto_key!(p.tgid, p);
        if !self.protos.contains(&key) {
            self.copied.insert(key, p);
        } else {
            self.late_copy(&key, &p);
        }
    }

    /// A new generation of the protos BPF copies out, when the newer one holds enough
    /// keys: lrec forgets the keys it has not seen since the one before
    /// ([`generations`]). Returns the generation BPF must count from now on.
    pub fn turn_generation(&mut self) -> Option<u32> {
        if !self.generations.turn(self.protos.len()) {
            return None;
        }
        self.protos.rotate();
        self.copied.rotate();
        self.late.rotate();
        Some(self.generations.gen)
    }

    /// Sampling starts now: the interpreters found before (an attached target's) have
    /// their first seconds of samples to be told from now on.
    pub fn sampling_started(&mut self) {
        let now = std::time::Instant::now();
        for p in self.luajit.values_mut().chain(self.puc.values_mut()) {
            p.found = now;
        }
    }

    /// Whether some process's layout is still being told, in the first seconds after its
    /// interpreter was found (a VM that does not run keeps its layout untold).
    pub fn detecting(&self) -> bool {
        self.luajit.values().any(|p| {
            let telling = match p.detection {
                Detection::Pending { .. } => true,
                // The trace array, looked for from the first samples in traces.
                Detection::Ready(_, ref traces) => traces.searching(),
                _ => false,
            };
            telling && p.young()
        })
    }

    /// Processes whose BPF configurations are to be removed since the last call: (pid,
    /// whether PUC Lua's).
    pub fn take_removed(&mut self) -> Vec<(u32, bool)> {
        std::mem::take(&mut self.removed)
    }

    /// How many samples of process `pid` came before its VM was met.
    fn before(&self, pid: u32) -> u64 {
        self.sampled.get(&pid).copied().unwrap_or(0)
    }

    /// BPF configurations that became known since the last call.
    pub fn take_configs(&mut self) -> Vec<(u32, RawLuaConfig)> {
        std::mem::take(&mut self.configs)
    }

    /// PUC Lua configurations that became known since the last call.
    pub fn take_puc_configs(&mut self) -> Vec<(u32, RawPucConfig)> {
        std::mem::take(&mut self.puc_configs)
    }

    /// The binaries holding a LuaJIT VM found since the last call (where lua_yield and
    /// lua_resume are, for Lua coroutine waits).
    pub fn take_luajit_binaries(&mut self) -> &[String] {
        let n = std::mem::take(&mut self.new_luajit);
        &self.luajit_binaries[self.luajit_binaries.len() - n..]
    }

    /// The binary holding `pid`'s PUC Lua interpreter, with its layout: the proved one,
    /// else the one learned from the binary (a heap snapshot checks it on the copy).
    pub fn puc_layout(&self, pid: u32) -> Option<(String, PucLayout)> {
        let p = self.puc.get(&pid)?;
        match &p.detection {
            Detection::Puc(l) => Some((p.path.clone(), (**l).clone())),
            Detection::PucPending { layout, .. } => Some((p.path.clone(), layout.layout.clone())),
            _ => None,
        }
    }

    /// `pid`'s LuaJIT interpreter and the layout to find its VMs in a heap snapshot with:
    /// the proved one, else the one learned from the binary (the snapshot checks it), or
    /// why there is none.
    pub fn luajit_heap_layout(&self, pid: u32) -> Option<(Vec<VmCode>, Result<Layout, String>)> {
        let p = self.luajit.get(&pid)?;
        let layout = match &p.detection {
            Detection::Ready(l, _) => Ok((**l).clone()),
            Detection::Pending { layout, .. } => Ok(layout.layout.clone()),
            _ => match self.learned.get(&p.path) {
                Some(Ok(l)) if l.missing.is_empty() => Ok(l.layout.clone()),
                Some(Ok(l)) => Err(format!("its layout lacks {}", l.missing.join(", "))),
                Some(Err(e)) => Err(e.clone()),
                None => Err("its layout was not learned".into()),
            },
        };
        Some((p.code.clone(), layout))
    }

    /// Records (runtimes, protos) to write before the sample at hand.
    pub fn take_records(&mut self) -> Vec<Record> {
        std::mem::take(&mut self.records)
    }

    /// The frames of thread `tid`'s Lua stack that [`Self::on_sample`] converted last,
    /// innermost first.
    pub fn frames_of(&self, tid: u32) -> &[LuaFrame] {
        self.last.frames(tid)
    }

    /// Lua frames BPF walked, those it named from call sites remembered in earlier
    /// samples (each proved in its sample), and the sites it found stale (read in full).
    pub fn frames_named_from_sites(&self) -> (u64, u64, u64) {
        self.frames
    }

    /// Looks at a sample as it arrives: votes on its process's layouts while they are
    /// being proved, and puts in place a run of frames its walk took from the CPU's memo
    /// (a memo made is kept, whatever becomes of the walk): the walk, whole.
    pub fn observe<'a>(
        &mut self,
        sample: &Sample,
        walk: Option<LuaWalk<'a>>,
    ) -> Option<LuaWalk<'a>> {
        *self.sampled.entry(sample.pid).or_default() += 1;
        let pending = |p: &ProcessVm| matches!(p.detection, Detection::Pending { .. });
        if self.luajit.get(&sample.pid).is_some_and(pending) {
            self.vote(sample);
        }
        let puc_pending = |p: &ProcessVm| matches!(p.detection, Detection::PucPending { .. });
        if self.puc.get(&sample.pid).is_some_and(puc_pending) {
            self.vote_puc(sample);
        }
        Some(self.memos.resolve(sample.cpu, walk?))
    }

    /// Whether a sample of process `pid` whose walk is `walk` is held back: BPF walked its
    /// Lua frames with a layout still being proved, and it is written once that is
    /// decided (with its Lua frames if it is proved, without if not). A sample without a
    /// walk, or walked with a layout proved, is written at once.
    pub fn holding(&self, pid: u32, walk: Option<&LuaWalk>) -> bool {
        let Some(w) = walk else {
            return false;
        };
        let by_puc = u32::from(w.header.flags) & lua_flags::PUC != 0;
        let vms = if by_puc { &self.puc } else { &self.luajit };
        vms.get(&pid).is_some_and(|p| {
            matches!(
                p.detection,
                Detection::Pending { .. } | Detection::PucPending { .. }
            )
        })
    }

    /// Converts the Lua frames BPF walked (as [`Self::observe`] returned them) into a
    /// capture record (its frames: [`Self::frames_of`]), if the walk's layout is proved.
    pub fn convert(&mut self, sample: &Sample, walk: LuaWalk) -> Option<Converted> {
        let by_puc = u32::from(walk.header.flags) & lua_flags::PUC != 0;
        let p = match by_puc {
            true => self.puc.get(&sample.pid)?,
            false => self.luajit.get(&sample.pid)?,
        };
        // Only walks whose layout is proved become frames (a walk made while it was
        // being proved, and it was not, is dropped whole).
        enum Proved {
            LuaJit(Arc<Layout>, bool),
            Puc(Arc<PucLayout>),
        }
        let proved = match &p.detection {
            // Shared, not copied: a layout's tables are cloned once, not per sample.
            Detection::Ready(layout, traces) => {
                Proved::LuaJit(Arc::clone(layout), traces.searching())
            }
            Detection::Puc(rel) => Proved::Puc(Arc::clone(rel)),
            _ => return None,
        };
        let (pid, tid) = (sample.pid, sample.tid);
        // The outer frames shared with the thread's last stack are converted already.
        let mut last = self.last.take(tid, pid, by_puc);
        let raw: &[RawLuaFrame] = &walk.frames;
        self.frames.0 += raw.len() as u64;
        self.frames.1 += raw
            .iter()
            .filter(|f| f.check & FRAME_FROM_SITE != 0)
            .count() as u64;
        self.frames.2 += u64::from(walk.header.stale);
        let shared = last.shared(raw);
        match proved {
            Proved::LuaJit(layout, searching) => {
                if walk.header.vmstate > 0 && searching {
                    self.find_traces(pid, &layout.offsets, &walk);
                }
                let convert =
                    |f: &RawLuaFrame| self.frame(f, |t, f| t.proto(pid, &layout.offsets, f));
                last.update(raw, shared, convert);
            }
            Proved::Puc(rel) => {
                let convert = |f: &RawLuaFrame| self.frame(f, |t, f| t.puc_proto(pid, &rel, f));
                last.update(raw, shared, convert);
            }
        }
        self.last.keep(tid, last);
        let header = walk.header;
        Some(Converted {
            shared,
            stack: LuaStack {
                pid,
                tid,
                time_ns: sample.time_ns,
                vm: header.g,
                state: header.l,
                cframe: header.cframe,
                vmstate: header.vmstate,
                flags: u32::from(header.flags),
                frames: Vec::new(),
            },
        })
    }
}

impl LuaVms {
    /// The recording ends: a LuaJIT layout still being told is not known, and the capture
    /// says why its samples have no Lua frames.
    pub fn finish(&mut self) {
        if self.unnamed > 0 {
            self.messages.push(format!(
                "{} Lua functions' chunk names did not read as names (memory freed or reused \
                 before lrec read it); their frames are left unnamed",
                self.unnamed
            ));
        }
        // Layouts still being proved: a VM that never ran is listed as idle, one that ran
        // gives up with its count of samples.
        let pending: Vec<(u32, bool, u32)> = (self.luajit.iter().map(|(&pid, p)| (pid, false, p)))
            .chain(self.puc.iter().map(|(&pid, p)| (pid, true, p)))
            .filter_map(|(pid, puc, p)| match p.detection {
                Detection::Pending { tries, .. } | Detection::PucPending { tries, .. } => {
                    Some((pid, puc, tries))
                }
                _ => None,
            })
            .collect();
        for (pid, puc, tries) in pending {
            let why = format!(
                "the layout learned from it was not proved before the recording ended ({tries} \
                 samples in it)"
            );
            match (tries, puc) {
                (0, _) => self.idle(pid, puc),
                (_, false) => self.fail(pid, why),
                (_, true) => self.fail_puc(pid, why),
            }
        }
    }

    /// Process `pid`'s VM never ran its interpreter loop while lrec recorded: its layout
    /// is not proved, and the capture lists it as such (no layout, no error: none of its
    /// samples was in Lua code lrec could have read).
    fn idle(&mut self, pid: u32, puc: bool) {
        let vms = if puc { &self.puc } else { &self.luajit };
        let Some(p) = vms.get(&pid) else {
            return;
        };
        let vm = match (puc, p.code.first().and_then(|c| c.release)) {
            (false, _) => "LuaJIT 2.1".to_string(),
            (true, Some((minor, patch))) => format!("Lua 5.{minor}.{patch}"),
            (true, None) => "Lua".to_string(),
        };
        let r = runtime(pid, p, vm);
        self.records.push(Record::LuaRuntime(r));
    }
}

impl ProcessVm {
    fn new(pid: u32, path: &str, code: Vec<VmCode>, detection: Detection) -> ProcessVm {
        ProcessVm {
            path: path.to_string(),
            found: std::time::Instant::now(),
            voting: std::time::Duration::ZERO,
            code,
            detection,
            mem: File::open(format!("/proc/{pid}/mem")).ok(),
            others: false,
            before: 0,
        }
    }

    /// Found less than 2 s ago: still in the time its layout and traces are told in.
    fn young(&self) -> bool {
        self.found.elapsed() < std::time::Duration::from_secs(2)
    }

    /// The BPF walker's configuration, once the LuaJIT VM's layout is known, or while it
    /// is being proved (its walks are held until it is decided: [`LuaVms::holding`]).
    fn config(&self) -> Option<RawLuaConfig> {
        match &self.detection {
            Detection::Ready(layout, traces) => Some(luajit::config(
                &layout.offsets,
                &self.code,
                traces.offset.unwrap_or(0),
            )),
            Detection::Pending { layout, .. } if !self.code.is_empty() => {
                Some(luajit::config(&layout.layout.offsets, &self.code, 0))
            }
            _ => None,
        }
    }
}

/// The runtime record of a process's VM (`vm`: `LuaJIT 2.1`, `Lua 5.4.6`), its layout and
/// names left to the caller.
fn runtime(pid: u32, p: &ProcessVm, vm: String) -> LuaRuntime {
    let code = p.code.first().copied().unwrap_or_default();
    LuaRuntime {
        pid,
        vm,
        path: p.path.clone(),
        vm_start: code.start,
        vm_end: code.end,
        cframe_size: code.cframe_size,
        ..LuaRuntime::default()
    }
}

/// A LuaJIT runtime record, with its layout and built-in names when one validated.
fn luajit_runtime(pid: u32, p: &ProcessVm, layout: Option<&Layout>) -> LuaRuntime {
    let mut r = runtime(pid, p, "LuaJIT 2.1".into());
    if let Some(l) = layout {
        r.layout = l.name.to_string();
        r.builtins = luajit::builtins(l)
            .into_iter()
            .map(str::to_string)
            .collect();
    }
    r
}

/// A little-endian u64 of the target's memory.
/// The last part of a binary's path, naming it in a line that names another by its path.
fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

pub(crate) fn read_u64(mem: &File, addr: u64) -> Option<u64> {
    let mut b = [0u8; 8];
    mem.read_exact_at(&mut b, addr).ok()?;
    Some(u64::from_le_bytes(b))
}

/// A little-endian u32 of the target's memory.
pub(crate) fn read_u32(mem: &File, addr: u64) -> Option<u32> {
    let mut b = [0u8; 4];
    mem.read_exact_at(&mut b, addr).ok()?;
    Some(u32::from_le_bytes(b))
}

/// An empty, unlinked scratch file standing for a process's memory in unit tests (its
/// offsets are addresses; what a test writes is all there is).
#[cfg(test)]
pub(crate) fn test_memory(tag: &str) -> File {
    let path = std::env::temp_dir().join(format!("lrec-{tag}-{}", std::process::id()));
    let f = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    f
}
