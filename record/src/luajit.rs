//! LuaJIT 2.1 in the target: finds the interpreter in mapped binaries, tells the build's
//! layout by validating candidates against the live process, configures the BPF walker
//! (ebpf/luajit.h) per process, and turns the frames it walks into capture records,
//! writing each function prototype's names and lines once. The same tracker ([`LuaJit`])
//! carries the processes that run PUC Lua, whose layout follows from their release
//! ([`crate::puc`]): one design of Lua frames, protos and runtimes for both VMs.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;

use lrec_format::{lua_frame_kind, LuaFrame, LuaProto, LuaRuntime, LuaStack, Record, Sample};

use crate::puc;
use crate::raw::{LuaWalk, RawLuaConfig, RawLuaFrame, RawLuaProto, RawPucConfig, MAX_LUA_RANGES};

/// Samples in the interpreter that must agree on a layout before it is used.
const VOTES_NEEDED: u32 = 3;
/// Samples in the interpreter after which an unidentified layout is given up.
const TRIES_BEFORE_GIVING_UP: u32 = 200;
/// Longest chunk name read.
const MAX_CHUNKNAME: usize = 4096;
/// Most bytecode positions of a proto whose lines are read.
const MAX_SIZEBC: u32 = 1 << 20;

/// One LuaJIT build's layout, from its headers: the offsets the BPF walker reads (its
/// configuration, without the interpreter's ranges), and those only lrec reads.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    pub name: &'static str,
    pub abi: RawLuaConfig,
    /// GCproto: the constants, the size of the proto's block, upvalue and variable names.
    pub pt_k: u32,
    pub pt_sizept: u32,
    pub pt_uvinfo: u32,
    pub pt_varinfo: u32,
    /// Names of built-in functions by ffid.
    pub builtins: fn() -> Vec<&'static str>,
}

impl Layout {
    pub fn gc64(&self) -> bool {
        self.abi.gc64 != 0
    }
}

const GC64: Layout = Layout {
    name: "upstream-gc64",
    abi: RawLuaConfig {
        vm_start: [0; MAX_LUA_RANGES],
        vm_end: [0; MAX_LUA_RANGES],
        gc64: 1,
        g2disp: 4000,
        g_vmstate: 184,
        g_cur_l: 376,
        g_jit_base: 384,
        l_glref: 16,
        l_base: 32,
        l_stack: 56,
        l_cframe: 80,
        l_maxstack: 48,
        // CFRAME_SIZE (80, 96 with LUAJIT_NO_UNWIND: taken from the binary's unwind info)
        // and CFRAME_OFS_* for x64 System V (lj_frame.h).
        cf_size: 80,
        cf_l: 16,
        cf_pc: 24,
        cf_prev: 32,
        cf_nres: 8,
        fn_ffid: 10,
        fn_pc: 32,
        fn_f: 40,
        pt_size: 104,
        pt_sizebc: 12,
        pt_chunkname: 64,
        pt_firstline: 72,
        pt_lineinfo: 80,
        str_len: 20,
        str_data: 24,
        pad: 0,
    },
    pt_k: 32,
    pt_sizept: 56,
    pt_uvinfo: 88,
    pt_varinfo: 96,
    builtins: upstream_builtins,
};

const GC32: Layout = Layout {
    name: "upstream-gc32",
    abi: RawLuaConfig {
        vm_start: [0; MAX_LUA_RANGES],
        vm_end: [0; MAX_LUA_RANGES],
        gc64: 0,
        g2disp: 3208,
        g_vmstate: 136,
        g_cur_l: 296,
        g_jit_base: 300,
        l_glref: 8,
        l_base: 16,
        l_stack: 36,
        l_cframe: 48,
        l_maxstack: 32,
        cf_size: 80,
        cf_l: 24,
        cf_pc: 28,
        cf_prev: 32,
        cf_nres: 16,
        fn_ffid: 6,
        fn_pc: 16,
        fn_f: 24,
        pt_size: 64,
        pt_sizebc: 8,
        pt_chunkname: 40,
        pt_firstline: 44,
        pt_lineinfo: 52,
        str_len: 16,
        str_data: 20,
        pad: 0,
    },
    pt_k: 16,
    pt_sizept: 32,
    pt_uvinfo: 56,
    pt_varinfo: 60,
    builtins: upstream_builtins,
};

/// A layout that differs from `base` in where G, the current state and the JIT base are.
const fn variant(
    base: Layout,
    name: &'static str,
    g2disp: u32,
    g_cur_l: u32,
    g_jit_base: u32,
    builtins: fn() -> Vec<&'static str>,
) -> Layout {
    let mut l = base;
    l.name = name;
    l.abi.g2disp = g2disp;
    l.abi.g_cur_l = g_cur_l;
    l.abi.g_jit_base = g_jit_base;
    l.builtins = builtins;
    l
}

use crate::luajit_builtins::openresty;

fn upstream_builtins() -> Vec<&'static str> {
    crate::luajit_builtins::UPSTREAM.to_vec()
}

/// The layouts known, tried in order against the live process.
pub const LAYOUTS: &[Layout] = &[
    GC64,
    variant(GC64, "openresty-gc64", 4008, 368, 376, openresty),
    GC32,
    variant(
        GC64,
        "upstream-2022-gc64",
        3968,
        368,
        376,
        upstream_builtins,
    ),
    variant(
        GC32,
        "upstream-2022-gc32",
        3176,
        288,
        292,
        upstream_builtins,
    ),
    variant(GC32, "openresty-gc32", 3216, 288, 292, openresty),
];

/// The interpreter's code in one mapped binary: LuaJIT's, as found in its .eh_frame, or
/// PUC Lua's luaV_execute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// Votes per layout index.
    Pending {
        votes: Vec<u32>,
        tries: u32,
    },
    Ready(usize),
    Failed,
    /// PUC Lua, whose layout follows from its release.
    Puc(puc::Release),
}

struct ProcessVm {
    path: String,
    /// When the interpreter was found.
    found: std::time::Instant,
    code: Vec<VmCode>,
    detection: Detection,
    mem: Option<File>,
}

#[derive(Hash, PartialEq, Eq)]
struct ProtoKey {
    pid: u32,
    ptr: u64,
    chunkname: u64,
    firstline: i32,
    numline: u32,
    sizebc: u32,
}

impl ProtoKey {
    fn of(pid: u32, f: &RawLuaFrame) -> ProtoKey {
        ProtoKey {
            pid,
            ptr: f.ptr,
            chunkname: f.chunkname,
            firstline: f.firstline,
            numline: f.numline,
            sizebc: f.sizebc,
        }
    }
}

/// LuaJIT state of every recorded process.
#[derive(Default)]
pub struct LuaJit {
    procs: HashMap<u32, ProcessVm>,
    protos: HashMap<ProtoKey, Option<u32>>,
    /// Chunk names and line tables BPF copied when a sample first ran a proto.
    copied: HashMap<ProtoKey, RawLuaProto>,
    next_proto: u32,
    /// BPF configurations to install: (pid, config).
    configs: Vec<(u32, RawLuaConfig)>,
    puc_configs: Vec<(u32, RawPucConfig)>,
    /// Records to write before the next sample.
    records: Vec<Record>,
    /// One-line messages for the user.
    pub messages: Vec<String>,
}

impl LuaJit {
    /// Notes an interpreter mapped in `pid` (from `path`).
    pub fn add_vm(&mut self, pid: u32, path: &str, code: VmCode) {
        if let Some((minor, patch)) = code.release {
            return self.add_puc(pid, path, code, minor, patch);
        }
        let p = self.procs.entry(pid).or_insert_with(|| ProcessVm {
            path: path.to_string(),
            found: std::time::Instant::now(),
            code: Vec::new(),
            detection: Detection::Pending {
                votes: vec![0; LAYOUTS.len()],
                tries: 0,
            },
            mem: File::open(format!("/proc/{pid}/mem")).ok(),
        });
        if p.code.contains(&code) || p.code.len() >= MAX_LUA_RANGES {
            return;
        }
        p.code.push(code);
        if let Detection::Ready(i) = p.detection {
            // A second copy of the VM (another library): the walker must know it too.
            let cfg = config(&LAYOUTS[i], &p.code);
            self.configs.push((pid, cfg));
        }
    }

    /// A PUC Lua interpreter: its release gives its layout at once (or none is known).
    fn add_puc(&mut self, pid: u32, path: &str, code: VmCode, minor: u32, patch: u32) {
        if self.procs.contains_key(&pid) {
            // One VM implementation per process: the first found.
            return;
        }
        let release = puc::release(minor, patch);
        let p = ProcessVm {
            path: path.to_string(),
            found: std::time::Instant::now(),
            code: vec![code],
            detection: release.map_or(Detection::Failed, Detection::Puc),
            mem: File::open(format!("/proc/{pid}/mem")).ok(),
        };
        let mut r = runtime(pid, &p, None);
        r.vm = format!("Lua 5.{minor}.{patch}");
        match release {
            Some(rel) => {
                r.layout = format!("{} (luaV_execute by {})", rel.name(), code.found_by);
                self.puc_configs.push((pid, rel.abi));
            }
            None => {
                let msg = format!(
                    "pid {pid}: found Lua 5.{minor}.{patch} in {path}, a release whose memory \
                     layout lrec does not know; recording native stacks only"
                );
                r.error = Some(msg.clone());
                self.messages.push(msg);
            }
        }
        self.records.push(Record::LuaRuntime(r));
        self.procs.insert(pid, p);
    }

    /// Keeps a proto BPF copied (from the `lua_protos` ring).
    pub fn on_proto(&mut self, bytes: &[u8]) {
        let Some(p) = RawLuaProto::decode(bytes) else {
            return;
        };
        let key = ProtoKey {
            pid: p.tgid,
            ptr: p.ptr,
            chunkname: p.chunkname,
            firstline: p.firstline,
            numline: p.numline,
            sizebc: p.sizebc,
        };
        if !self.protos.contains_key(&key) {
            self.copied.insert(key, p);
        }
    }

    /// Whether some process's layout is still being told, in the first seconds after its
    /// interpreter was found (a VM that does not run keeps its layout untold).
    pub fn detecting(&self) -> bool {
        self.procs.values().any(|p| {
            matches!(p.detection, Detection::Pending { .. })
                && p.found.elapsed() < std::time::Duration::from_secs(2)
        })
    }

    /// BPF configurations that became known since the last call.
    pub fn take_configs(&mut self) -> Vec<(u32, RawLuaConfig)> {
        std::mem::take(&mut self.configs)
    }

    /// PUC Lua configurations that became known since the last call.
    pub fn take_puc_configs(&mut self) -> Vec<(u32, RawPucConfig)> {
        std::mem::take(&mut self.puc_configs)
    }

    /// Records (runtimes, protos) to write before the sample at hand.
    pub fn take_records(&mut self) -> Vec<Record> {
        std::mem::take(&mut self.records)
    }

    /// Looks at a sample: votes on the layout while it is unknown, and converts the Lua
    /// frames BPF walked into a capture record.
    pub fn on_sample(&mut self, sample: &Sample, walk: Option<LuaWalk>) -> Option<LuaStack> {
        let p = self.procs.get_mut(&sample.pid)?;
        if let Detection::Pending { .. } = p.detection {
            self.vote(sample);
            return None;
        }
        let walk = walk?;
        let frames = match p.detection {
            Detection::Ready(layout) => {
                let layout = &LAYOUTS[layout];
                walk.frames
                    .iter()
                    .map(|f| self.frame(f, |t, f| t.proto(sample.pid, layout, f)))
                    .collect()
            }
            Detection::Puc(rel) => walk
                .frames
                .iter()
                .map(|f| self.frame(f, |t, f| t.puc_proto(sample.pid, &rel, f)))
                .collect(),
            _ => return None,
        };
        Some(LuaStack {
            pid: sample.pid,
            tid: sample.tid,
            time_ns: sample.time_ns,
            vm: walk.header.g,
            state: walk.header.l,
            cframe: walk.header.cframe,
            vmstate: walk.header.vmstate,
            flags: u32::from(walk.header.flags),
            frames,
        })
    }

    fn frame(
        &mut self,
        f: &RawLuaFrame,
        proto: impl FnOnce(&mut Self, &RawLuaFrame) -> u32,
    ) -> LuaFrame {
        let (kind, function, address) = match f.ffid {
            0 => (lua_frame_kind::LUA, proto(self, f), 0),
            1 => (lua_frame_kind::C, u32::MAX, f.ptr),
            _ => (lua_frame_kind::BUILTIN, u32::MAX, f.ptr),
        };
        LuaFrame {
            kind,
            builtin: f.ffid,
            link: f.link,
            function,
            address,
            pos: f.pos,
            cframe: f.cframe,
        }
    }

    /// The id of a frame's proto, reading and writing it the first time. A proto freed
    /// and replaced at the same address differs in its chunk name, lines or size, and
    /// gets a new id; one that cannot be read gets `u32::MAX`.
    fn proto(&mut self, pid: u32, layout: &Layout, f: &RawLuaFrame) -> u32 {
        let key = ProtoKey::of(pid, f);
        if let Some(id) = self.protos.get(&key) {
            return id.unwrap_or(u32::MAX);
        }
        // BPF's copy was taken when the sample ran the proto: it names it. The live
        // proto adds the names of callees, if it still is the same code (its chunk name
        // and lines may since belong to another: memory is reused after GC).
        let mem = self.procs.get(&pid).and_then(|p| p.mem.as_ref());
        let live = mem.and_then(|m| read_proto(m, layout, f));
        let read = match self.copied.remove(&key).map(|c| copied_proto(&c)) {
            Some(copy) => Some(match live {
                Some(l) if l.chunkname == copy.chunkname && l.lines == copy.lines => l,
                _ => copy,
            }),
            None => live,
        };
        self.new_proto(key, read)
    }

    /// The id of a PUC Lua frame's proto, from BPF's copy (see [`Self::proto`]).
    fn puc_proto(&mut self, pid: u32, rel: &puc::Release, f: &RawLuaFrame) -> u32 {
        let key = ProtoKey::of(pid, f);
        if let Some(id) = self.protos.get(&key) {
            return id.unwrap_or(u32::MAX);
        }
        let mem = self.procs.get(&pid).and_then(|p| p.mem.as_ref());
        let read = self.copied.remove(&key).map(|c| {
            let mut p = copied_proto(&c);
            p.lines = puc::lines(&c, &rel.abi);
            p.numline = (c.numline as i32 - c.firstline).max(0) as u32;
            // The callees' names, from the live proto if it still is this one.
            if let Some(code) = mem.and_then(|m| {
                puc::read_code(m, &rel.abi, f.ptr, f.chunkname, f.firstline, f.sizebc)
            }) {
                p.callee_names = crate::puc_names::callee_names(&code);
            }
            p
        });
        self.new_proto(key, read)
    }

    /// Gives a proto read for `key` its id and queues its record.
    fn new_proto(&mut self, key: ProtoKey, read: Option<LuaProto>) -> u32 {
        let id = read.map(|mut proto| {
            let id = self.next_proto;
            self.next_proto += 1;
            proto.pid = key.pid;
            proto.id = id;
            self.records.push(Record::LuaProto(proto));
            id
        });
        self.protos.insert(key, id);
        id.unwrap_or(u32::MAX)
    }

    fn vote(&mut self, sample: &Sample) {
        let Some(p) = self.procs.get_mut(&sample.pid) else {
            return;
        };
        let ip = sample.regs.ip;
        let in_vm = p.code.iter().any(|c| ip >= c.start && ip < c.end);
        let Detection::Pending { votes, tries } = &mut p.detection else {
            return;
        };
        let Some(mem) = &p.mem else {
            return;
        };
        // Only samples in the interpreter count against a layout: a VM that never runs
        // during the recording is not an unknown one.
        *tries += u32::from(in_vm);
        for (i, layout) in LAYOUTS.iter().enumerate() {
            let by_register = validates(mem, layout, sample.regs.r14, &p.code);
            if by_register || on_stack(mem, layout, sample, &p.code) {
                votes[i] += 1;
            }
        }
        let best = (0..votes.len()).max_by_key(|&i| votes[i]).unwrap_or(0);
        let total: u32 = votes.iter().sum();
        // Unanimous, or (should a stray value ever validate another layout) a 95 % majority.
        let decided = (votes[best] >= VOTES_NEEDED && votes[best] == total)
            || (votes[best] >= 20 * VOTES_NEEDED && votes[best] * 20 >= total * 19);
        if decided {
            p.detection = Detection::Ready(best);
            let layout = &LAYOUTS[best];
            self.configs.push((sample.pid, config(layout, &p.code)));
            self.records
                .push(Record::LuaRuntime(runtime(sample.pid, p, Some(layout))));
        } else if *tries >= TRIES_BEFORE_GIVING_UP {
            p.detection = Detection::Failed;
            let mut r = runtime(sample.pid, p, None);
            let msg = format!(
                "pid {}: found a LuaJIT interpreter in {}, but its memory layout matches none \
                 of the known ones ({}); recording native stacks only",
                sample.pid,
                p.path,
                LAYOUTS
                    .iter()
                    .map(|l| l.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            r.error = Some(msg.clone());
            self.messages.push(msg);
            self.records.push(Record::LuaRuntime(r));
        }
    }
}

fn runtime(pid: u32, p: &ProcessVm, layout: Option<&Layout>) -> LuaRuntime {
    let code = p.code.first().copied().unwrap_or(VmCode {
        start: 0,
        end: 0,
        cframe_size: 0,
        release: None,
        found_by: "",
    });
    LuaRuntime {
        pid,
        vm: "LuaJIT 2.1".into(),
        layout: layout.map(|l| l.name.to_string()).unwrap_or_default(),
        path: p.path.clone(),
        vm_start: code.start,
        vm_end: code.end,
        cframe_size: code.cframe_size,
        builtins: layout
            .map(|l| (l.builtins)().into_iter().map(str::to_string).collect())
            .unwrap_or_default(),
        error: None,
    }
}

/// The BPF walker's configuration for a layout and the interpreter ranges of a process.
pub fn config(l: &Layout, code: &[VmCode]) -> RawLuaConfig {
    let mut c = l.abi;
    if let Some(first) = code.first() {
        c.cf_size = first.cframe_size;
    }
    for (i, r) in code.iter().take(MAX_LUA_RANGES).enumerate() {
        c.vm_start[i] = r.start;
        c.vm_end[i] = r.end;
    }
    c
}

/// A little-endian u64 of the target's memory.
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

fn read_ref(mem: &File, l: &Layout, addr: u64) -> Option<u64> {
    if l.gc64() {
        read_u64(mem, addr)
    } else {
        read_u32(mem, addr).map(u64::from)
    }
}

/// Whether `r14` (DISPATCH while the interpreter runs) points into a VM of this layout:
/// the dispatch table's first entry must be interpreter code, G = DISPATCH - GG_G2DISP,
/// its current state's `glref` must lead back to G, and its `vmstate` must be a trace
/// number or one of the LJ_VMST_* states.
fn validates(mem: &File, l: &Layout, r14: u64, code: &[VmCode]) -> bool {
    let disp = if l.gc64() { r14 } else { r14 & 0xffff_ffff };
    let Some(g) = disp
        .checked_sub(u64::from(l.abi.g2disp))
        .filter(|&g| g != 0)
    else {
        return false;
    };
    let check = || -> Option<bool> {
        let first = read_u64(mem, disp)?;
        if !code.iter().any(|c| first >= c.start && first < c.end) {
            return Some(false);
        }
        let cur_l = read_ref(mem, l, g + u64::from(l.abi.g_cur_l))?;
        let glref = read_ref(mem, l, cur_l + u64::from(l.abi.l_glref))?;
        let vmstate = read_u32(mem, g + u64::from(l.abi.g_vmstate))? as i32;
        Some(cur_l != 0 && glref == g && (-8..1 << 20).contains(&vmstate))
    };
    check().unwrap_or(false)
}

/// Whether the sample's stack holds a C frame of a VM of this layout (JIT-compiled code
/// of GC32 builds keeps no DISPATCH in r14): a slot whose SAVE_L names a state whose
/// `cframe` is that very slot, and whose `glref` is a VM whose current state is valid.
fn on_stack(mem: &File, l: &Layout, sample: &Sample, code: &[VmCode]) -> bool {
    let cf_l = l.abi.cf_l as usize;
    let width = if l.gc64() { 8 } else { 4 };
    let stack = &sample.user_stack;
    (0..stack.len().saturating_sub(cf_l + width))
        .step_by(16)
        .any(|off| {
            let raw = &stack[off + cf_l..off + cf_l + width];
            let state = match l.gc64() {
                true => u64::from_le_bytes(raw.try_into().unwrap()),
                false => u64::from(u32::from_le_bytes(raw.try_into().unwrap())),
            };
            if state == 0 || state & 7 != 0 || state >> 47 != 0 {
                return false;
            }
            let cf = sample.regs.sp + off as u64;
            read_u64(mem, state + u64::from(l.abi.l_cframe)).is_some_and(|c| c & !3 == cf)
                && read_ref(mem, l, state + u64::from(l.abi.l_glref))
                    .is_some_and(|g| validates(mem, l, g + u64::from(l.abi.g2disp), code))
        })
}

/// Reads a proto's chunk name and line table, checking that it still is the proto BPF
/// saw (the same chunk name, first line, line count and size).
fn read_proto(mem: &File, l: &Layout, f: &RawLuaFrame) -> Option<LuaProto> {
    let pt = f.ptr;
    let chunkname = read_ref(mem, l, pt + u64::from(l.abi.pt_chunkname))?;
    let firstline = read_u32(mem, pt + u64::from(l.abi.pt_firstline))? as i32;
    let numline = read_u32(mem, pt + u64::from(l.abi.pt_firstline) + 4)?;
    let sizebc = read_u32(mem, pt + u64::from(l.abi.pt_sizebc))?;
    if (chunkname, firstline, numline, sizebc) != (f.chunkname, f.firstline, f.numline, f.sizebc)
        || sizebc > MAX_SIZEBC
    {
        return None;
    }
    let len = read_u32(mem, chunkname + u64::from(l.abi.str_len))? as usize;
    let mut text = vec![0u8; len.min(MAX_CHUNKNAME)];
    mem.read_exact_at(&mut text, chunkname + u64::from(l.abi.str_data))
        .ok()?;
    let lineinfo = read_ref(mem, l, pt + u64::from(l.abi.pt_lineinfo))?;
    Some(LuaProto {
        pid: 0,
        id: 0,
        chunkname: String::from_utf8_lossy(&text).into_owned(),
        firstline,
        numline,
        lines: read_lines(mem, lineinfo, firstline, numline, sizebc),
        callee_names: callee_names(mem, l, pt, sizebc).unwrap_or_default(),
    })
}

/// The names the proto's calls give their callees (see [`crate::luajit_bytecode`]),
/// read from the proto's block (bytecode, uvinfo and varinfo live in it) and its string
/// constants.
fn callee_names(mem: &File, l: &Layout, pt: u64, sizebc: u32) -> Option<Vec<(u32, String)>> {
    let sizept = read_u32(mem, pt + u64::from(l.pt_sizept))? as usize;
    let bc_end = l.abi.pt_size as usize + sizebc as usize * 4;
    if sizept < bc_end || sizept > 16 << 20 {
        return None;
    }
    let mut block = vec![0u8; sizept];
    mem.read_exact_at(&mut block, pt).ok()?;
    let bc: Vec<u32> = block[l.abi.pt_size as usize..bc_end]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    // uvinfo and varinfo point into the block (or are 0 in stripped bytecode).
    let inside = |field: u32| -> &[u8] {
        let at = read_ref(mem, l, pt + u64::from(field)).unwrap_or(0);
        match at.checked_sub(pt) {
            Some(off) if at != 0 && (off as usize) < sizept => &block[off as usize..],
            _ => &[],
        }
    };
    let k = read_ref(mem, l, pt + u64::from(l.pt_k))?;
    let refsize: u64 = if l.gc64() { 8 } else { 4 };
    let kstr = |idx: u32| -> Option<String> {
        let s = read_ref(mem, l, k.checked_sub((u64::from(idx) + 1) * refsize)?)?;
        let len = read_u32(mem, s + u64::from(l.abi.str_len))? as usize;
        if len > 256 {
            return None;
        }
        let mut text = vec![0u8; len];
        mem.read_exact_at(&mut text, s + u64::from(l.abi.str_data))
            .ok()?;
        Some(String::from_utf8_lossy(&text).into_owned())
    };
    let proto = crate::luajit_bytecode::Proto {
        bc: &bc,
        kstr: &kstr,
        uvinfo: inside(l.pt_uvinfo),
        varinfo: inside(l.pt_varinfo),
        fr2: l.gc64(),
    };
    Some(crate::luajit_bytecode::callee_names(&proto))
}

/// A proto from BPF's copy: chunk name and lines (no callee names).
fn copied_proto(c: &RawLuaProto) -> LuaProto {
    let name_len = (c.chunkname_len as usize).min(c.name.len());
    let raw = &c.lineinfo[..(c.lineinfo_len as usize).min(c.lineinfo.len())];
    LuaProto {
        pid: 0,
        id: 0,
        chunkname: String::from_utf8_lossy(&c.name[..name_len]).into_owned(),
        firstline: c.firstline,
        numline: c.numline,
        lines: lines(raw, c.firstline, c.numline, c.sizebc),
        callee_names: Vec::new(),
    }
}

/// Bytes per lineinfo entry, and entries: a byte, halfword or word per bytecode
/// position after the header, by the proto's line count.
fn lineinfo_shape(numline: u32, sizebc: u32) -> (usize, usize) {
    let width = match numline {
        0..=255 => 1,
        256..=65535 => 2,
        _ => 4,
    };
    (width, sizebc.saturating_sub(1) as usize)
}

fn read_lines(mem: &File, lineinfo: u64, firstline: i32, numline: u32, sizebc: u32) -> Vec<u32> {
    let (width, n) = lineinfo_shape(numline, sizebc);
    let mut raw = vec![0u8; n * width];
    if lineinfo == 0 || mem.read_exact_at(&mut raw, lineinfo).is_err() {
        return Vec::new();
    }
    lines(&raw, firstline, numline, sizebc)
}

/// The line of each bytecode position, as lj_debug_line computes it: the header is the
/// first line, `sizebc` the last, and the lineinfo array `raw` holds offsets from the
/// first line of the others. Empty when `raw` is not the whole array.
fn lines(raw: &[u8], firstline: i32, numline: u32, sizebc: u32) -> Vec<u32> {
    let (width, n) = lineinfo_shape(numline, sizebc);
    if raw.len() != n * width {
        return Vec::new();
    }
    let first = firstline.max(0) as u32;
    let mut lines = Vec::with_capacity(n + 2);
    lines.push(first);
    lines.extend(raw.chunks_exact(width).map(|c| {
        first
            + match width {
                1 => u32::from(c[0]),
                2 => u32::from(u16::from_le_bytes([c[0], c[1]])),
                _ => u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
            }
    }));
    lines.push(first + numline);
    lines
}
