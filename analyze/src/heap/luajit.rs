//! LuaJIT 2.1's heap (lj_obj.h, lj_gc.c), GC64 and GC32: the objects of the collector's
//! lists with their sizes as lj_gc.c frees them, and what each references. The offsets
//! that differ between builds come with the snapshot (lrec found the layout); those of
//! the objects themselves are the same in every 2.1 release and fork, GC64 or not.

use std::cell::RefCell;

use anyhow::{bail, Result};
use lrec_format::LuaHeap;
use lrec_inspect::lua::luajit::GCVMASK;
use rustc_hash::{FxHashMap, FxHashSet};

use super::luajit_objects::Objects;

mod vm;
use super::{Detail, Kind, Memory, Object, Via, VmHeap};

/// `~LJ_T*` (GCHeader.gct) of each collectable type.
const GCT_STR: u8 = 4;
const GCT_UPVAL: u8 = 5;
const GCT_THREAD: u8 = 6;
const GCT_PROTO: u8 = 7;
const GCT_FUNC: u8 = 8;
const GCT_TRACE: u8 = 9;
const GCT_CDATA: u8 = 10;
const GCT_TAB: u8 = 11;
const GCT_UDATA: u8 = 12;
/// A TValue's type tag (itype) of a string, and the range of collectable ones.
const ITYPE_STR: u32 = !4;
const ITYPE_GC: std::ops::RangeInclusive<u32> = !12u32..=!4u32;
/// Most objects followed along one list, and most table slots read.
const MAX_LIST: usize = 100_000_000;
/// A table with more string keys than this has its fields named `[*]`, not by key: a
/// map of sessions or cache entries, not a record.
const MAX_NAMED_FIELDS: u32 = 64;
/// Longest string read for a name.
const MAX_NAME: usize = 200;

/// The build's offsets lrec recorded with the snapshot (by name), in bytes.
struct Offsets {
    vmstate: u64,
    mainthref: u64,
    cur_l: u64,
    jit_base: u64,
    /// Absent from captures of lrec before 2026-11: then just after jit_base.
    ctype_state: Option<u64>,
    l_stack: u64,
    l_maxstack: u64,
    l_top: u64,
    fn_ffid: u64,
    fn_pc: u64,
    pt_size: u64,
    pt_k: u64,
    pt_sizept: u64,
    pt_chunkname: u64,
    pt_uvinfo: u64,
    pt_firstline: u64,
    str_len: u64,
    str_data: u64,
    g2disp: u64,
    l_size: u64,
}

impl Offsets {
    /// The offsets of the snapshot's layout, or which it lacks.
    fn from(vm: &LuaHeap) -> Result<Offsets> {
        let mut o = lrec_inspect::lua::luajit::Offsets::from_named(&vm.offsets);
        // Captures of lrec before 2026-11 named fewer fields: where the state's stack
        // size and top are was then the upstream layout's, relative to cframe.
        if !vm.offsets.iter().any(|(k, _)| k == "L.top") {
            o.l_top = o.l_base + 8;
        }
        let mut missing = Vec::new();
        let mut get = |name: &'static str, v: u32| {
            if v == lrec_inspect::lua::named::ABSENT {
                missing.push(name);
            }
            u64::from(v)
        };
        let f = Offsets {
            vmstate: get("g.vmstate", o.g_vmstate),
            mainthref: get("g.mainthref", o.g_mainthref),
            cur_l: get("g.cur_L", o.g_cur_l),
            jit_base: get("g.jit_base", o.g_jit_base),
            ctype_state: (o.g_ctype_state != lrec_inspect::lua::named::ABSENT)
                .then_some(u64::from(o.g_ctype_state)),
            l_stack: get("L.stack", o.l_stack),
            l_maxstack: get("L.maxstack", o.l_maxstack),
            l_top: get("L.top", o.l_top),
            fn_ffid: get("fn.ffid", o.fn_ffid),
            fn_pc: get("fn.pc", o.fn_pc),
            pt_size: get("pt.size", o.pt_size),
            pt_k: get("pt.k", o.pt_k),
            pt_sizept: get("pt.sizept", o.pt_sizept),
            pt_chunkname: get("pt.chunkname", o.pt_chunkname),
            pt_uvinfo: get("pt.uvinfo", o.pt_uvinfo),
            pt_firstline: get("pt.firstline", o.pt_firstline),
            str_len: get("str.len", o.str_len),
            str_data: get("str.data", o.str_data),
            g2disp: get("g2disp", o.g2disp),
            l_size: get("L.size", o.l_size),
        };
        if !missing.is_empty() {
            bail!("the snapshot's LuaJIT layout lacks {}", missing.join(", "));
        }
        Ok(f)
    }
}

/// One LuaJIT VM's heap in a snapshot's memory.
pub struct Heap<'a> {
    mem: &'a Memory,
    g: u64,
    o: Objects,
    f: Offsets,
    main: u64,
    registry: Option<u64>,
    warnings: RefCell<Vec<String>>,
    /// Metatables read for `__mode`: (weak keys, weak values).
    modes: RefCell<FxHashMap<u64, (bool, bool)>>,
}

impl<'a> Heap<'a> {
    pub fn new(mem: &'a Memory, vm: &LuaHeap) -> Result<Heap<'a>> {
        let gc64 = vm.offsets.iter().any(|(k, v)| k == "gc64" && *v != 0);
        let f = Offsets::from(vm)?;
        let mut heap = Heap {
            mem,
            g: vm.g,
            o: Objects::new(&vm.offsets, gc64),
            f,
            main: 0,
            registry: None,
            warnings: RefCell::new(Vec::new()),
            modes: RefCell::new(FxHashMap::default()),
        };
        heap.main = heap.gcref(vm.g + heap.f.mainthref).unwrap_or(0);
        if heap.main == 0 {
            bail!(
                "the LuaJIT state at {:#x} of process {} is not in the snapshot's memory",
                vm.g,
                vm.pid
            );
        }
        heap.registry = heap.find_registry();
        if heap.registry.is_none() {
            heap.warn("the registry (and so package.loaded) was not found in global_State");
        }
        Ok(heap)
    }

    fn warn(&self, what: impl Into<String>) {
        let what = what.into();
        let mut w = self.warnings.borrow_mut();
        if !w.contains(&what) {
            w.push(what);
        }
    }

    /// A GCRef or MRef (64 or 32 bits).
    /// lua_State.stacksize of thread `l`, from its stack and maxstack (both proved by the
    /// VM's code): `maxstack = stack + stacksize - LJ_STACK_EXTRA - 1` (lj_state.c), with
    /// LJ_STACK_EXTRA = 5 + 2 * LJ_FR2.
    fn stack_slots(&self, l: u64) -> Option<u64> {
        let stack = self.gcref(l + self.f.l_stack)?;
        let max = self.gcref(l + self.f.l_maxstack)?;
        let extra = if self.o.refsize == 8 { 7 } else { 5 };
        Some(max.checked_sub(stack)? / 8 + extra + 1)
    }

    fn gcref(&self, addr: u64) -> Option<u64> {
        match self.o.refsize {
            8 => self.mem.u64(addr),
            _ => self.mem.u32(addr).map(u64::from),
        }
    }

    /// The object a TValue at `addr` holds, with its type tag, if it is collectable.
    fn tv_gc(&self, addr: u64) -> Option<(u32, u64)> {
        let (itype, ptr) = match self.o.refsize {
            8 => {
                let v = self.mem.u64(addr)?;
                (((v as i64) >> 47) as u32, v & GCVMASK)
            }
            _ => (self.mem.u32(addr + 4)?, self.mem.u32(addr)? as u64),
        };
        (ITYPE_GC.contains(&itype) && ptr != 0).then_some((itype, ptr))
    }

    fn gct(&self, obj: u64) -> Option<u8> {
        self.mem.u8(obj + self.o.gct)
    }

    /// A string's bytes, at most `max`.
    fn str_bytes(&self, s: u64, max: usize) -> Option<&[u8]> {
        let len = self.mem.u32(s + self.f.str_len)? as usize;
        self.mem.bytes(s + self.f.str_data, len.min(max))
    }

    fn string(&self, s: u64) -> Option<String> {
        self.str_bytes(s, MAX_NAME)
            .map(|b| String::from_utf8_lossy(b).into_owned())
    }

    /// The registry: the table TValue between mainthref and cur_L whose table holds
    /// `_LOADED` (forks add and remove fields there).
    fn find_registry(&self) -> Option<u64> {
        let from = self.g + self.f.mainthref + self.o.refsize;
        (from..self.g + self.f.cur_l).step_by(8).find_map(|at| {
            let (itype, t) = self.tv_gc(at)?;
            (itype == !(GCT_TAB as u32) && self.field(t, "_LOADED").is_some()).then_some(t)
        })
    }

    /// The node array and its length of table `t`, and its array part.
    fn table_parts(&self, t: u64) -> Option<((u64, u64), (u64, u64))> {
        let o = self.o;
        let asize = self.mem.u32(t + o.tab_asize)? as u64;
        let hmask = self.mem.u32(t + o.tab_hmask)? as u64;
        let array = self.gcref(t + o.tab_array)?;
        let node = self.gcref(t + o.tab_node)?;
        let nodes = if hmask > 0 { hmask + 1 } else { 0 };
        // Parts the copy does not hold (a damaged or changing heap) are not read.
        let held = |at: u64, len: u64| {
            len == 0 || (len <= 8 * MAX_LIST as u64 && self.mem.bytes(at, len as usize).is_some())
        };
        if !held(array, 8 * asize) || !held(node, self.o.node_size * nodes) {
            return None;
        }
        Some(((node, nodes), (array, asize)))
    }

    /// The collectable value of table `t` under string key `key`.
    fn field(&self, t: u64, key: &str) -> Option<u64> {
        let ((node, nodes), _) = self.table_parts(t)?;
        (0..nodes).find_map(|i| {
            let n = node + i * self.o.node_size;
            let (kt, k) = self.tv_gc(n + 8)?;
            if kt != ITYPE_STR || self.str_bytes(k, key.len() + 1)? != key.as_bytes() {
                return None;
            }
            self.tv_gc(n).map(|(_, v)| v)
        })
    }

    /// Whether table `t` holds its keys and values weakly (its metatable's `__mode`).
    fn weakness(&self, t: u64) -> (bool, bool) {
        let Some(mt) = self.gcref(t + self.o.tab_meta).filter(|&m| m != 0) else {
            return (false, false);
        };
        if let Some(&m) = self.modes.borrow().get(&mt) {
            return m;
        }
        let mode = self
            .field(mt, "__mode")
            .and_then(|s| self.str_bytes(s, 8).map(<[u8]>::to_vec))
            .unwrap_or_default();
        let m = (mode.contains(&b'k'), mode.contains(&b'v'));
        self.modes.borrow_mut().insert(mt, m);
        m
    }

    /// Follows a list linked by `nextgc` from `first`, each object once.
    fn list(&self, first: u64, seen: &mut FxHashSet<u64>, out: &mut Vec<Object>) {
        let mut o = first;
        while o != 0 && out.len() < MAX_LIST && seen.insert(o) {
            match self.object_at(o) {
                Some(obj) => out.push(obj),
                None => {
                    self.warn(format!(
                        "an object list ends at {o:#x}, which the copy does not hold as an \
                         object (a live snapshot changed under the copy?)"
                    ));
                    return;
                }
            }
            o = self.gcref(o).unwrap_or(0);
        }
    }
}

impl VmHeap for Heap<'_> {
    fn census(&self) -> Vec<Object> {
        let mut seen = FxHashSet::default();
        let mut out = Vec::new();
        let g = self.g;
        // gc.root: every object but strings, open upvalues and traces; gc.mmudata: userdata
        // waiting for their finalizer (a ring).
        let root = self.gcref(g + 16 + 2 * self.o.refsize + 8).unwrap_or(0);
        self.list(root, &mut seen, &mut out);
        let mmudata = self.gcref(g + 16 + 7 * self.o.refsize + 8).unwrap_or(0);
        if mmudata != 0 {
            let first = self.gcref(mmudata).unwrap_or(0);
            let mut ring = Vec::new();
            self.list(first, &mut FxHashSet::from_iter([mmudata]), &mut ring);
            ring.extend(self.object_at(mmudata));
            out.extend(ring.into_iter().filter(|o| seen.insert(o.addr)));
        }
        // Strings: the interning table's chains (the low bit of a slot marks a chain
        // that was rehashed).
        if let Some((tab, mask)) = self.string_table() {
            for i in 0..=mask {
                let head = self.gcref(tab + i * self.o.refsize).unwrap_or(0) & !1;
                self.list(head, &mut seen, &mut out);
            }
            out.push(Object {
                addr: tab,
                kind: Kind::Vm,
                size: (mask + 1) * self.o.refsize,
            });
        } else {
            self.warn("the string table was not found: strings are counted only if reached");
        }
        out.extend(self.vm_buffers());
        // Open upvalues hang off their thread.
        let threads: Vec<u64> = out
            .iter()
            .filter(|o| o.kind == Kind::Thread)
            .map(|o| o.addr)
            .collect();
        for l in threads {
            let open = self.gcref(l + self.f.l_stack + self.o.refsize).unwrap_or(0);
            self.list(open, &mut seen, &mut out);
        }
        out
    }

    fn object_at(&self, addr: u64) -> Option<Object> {
        let (o, f) = (self.o, &self.f);
        let (kind, size) = match self.gct(addr)? {
            GCT_STR => {
                let len = self.mem.u32(addr + f.str_len)? as u64;
                (Kind::String, f.str_data + ((len + 4) & !3))
            }
            GCT_UPVAL => (Kind::Upvalue, o.uv_size),
            GCT_THREAD => {
                let stacksize = self.stack_slots(addr)?;
                let own = match addr == self.main {
                    true => self.vm_state_size(),
                    false => self.lua_state_size(),
                };
                (Kind::Thread, own + 8 * stacksize)
            }
            GCT_PROTO => (Kind::Proto, self.mem.u32(addr + f.pt_sizept)? as u64),
            GCT_FUNC => {
                let ffid = self.mem.u8(addr + f.fn_ffid)?;
                let n = self.mem.u8(addr + f.fn_ffid + 1)? as u64;
                let size = match ffid {
                    0 => o.lfn_uv + o.refsize * n,
                    _ => o.cfn_uv + 8 * n,
                };
                (Kind::Function, size)
            }
            GCT_CDATA => (Kind::Cdata, self.cdata_size(addr)?),
            GCT_TRACE => {
                // lj_trace_free: the trace, its IR (less constants), snapshots and their
                // map (IRIns 8 bytes, SnapShot 12, SnapEntry 4).
                let nsnap = self.mem.u16(addr + o.tr_nsnap)? as u64;
                let nins = self.mem.u32(addr + o.tr_nins)? as u64;
                let nk = self.mem.u32(addr + o.tr_nk)? as u64;
                let nsnapmap = self.mem.u32(addr + o.tr_nsnapmap)? as u64;
                let ir = nins.checked_sub(nk)?;
                (Kind::Trace, o.tr_size + 8 * ir + 12 * nsnap + 4 * nsnapmap)
            }
            GCT_TAB => {
                let colo = self.mem.u8(addr + o.tab_colo)? as i8;
                let asize = self.mem.u32(addr + o.tab_asize)? as u64;
                let hmask = self.mem.u32(addr + o.tab_hmask)? as u64;
                let mut size = o.tab_size;
                if colo != 0 {
                    size += 8 * (colo as u8 & 0x7f) as u64;
                }
                if asize > 0 && colo <= 0 {
                    size += 8 * asize;
                }
                if hmask > 0 {
                    size += self.o.node_size * (hmask + 1);
                }
                (Kind::Table, size)
            }
            GCT_UDATA => {
                let len = self.mem.u32(addr + o.ud_len)? as u64;
                (Kind::Userdata, o.ud_size + len)
            }
            _ => return None,
        };
        Some(Object { addr, kind, size })
    }

    fn roots(&self) -> Vec<(String, u64)> {
        let mut roots = Vec::new();
        if let Some(loaded) = self.registry.and_then(|r| self.field(r, "_LOADED")) {
            roots.push(("package.loaded".to_string(), loaded));
        }
        if let Some(env) = self.gcref(self.main + self.f.l_stack + 2 * self.o.refsize) {
            roots.push(("_G".to_string(), env));
        }
        if let Some(r) = self.registry {
            roots.push(("registry".to_string(), r));
        }
        roots.push(("<main thread>".to_string(), self.main));
        roots
    }

    fn refs(&self, obj: &Object, out: &mut Vec<(Via, u64)>) {
        let (o, f) = (self.o, &self.f);
        let a = obj.addr;
        let mut push = |via: Via, ptr: Option<u64>| {
            if let Some(p) = ptr.filter(|&p| p != 0) {
                out.push((via, p));
            }
        };
        match obj.kind {
            Kind::Table => self.table_refs(a, out),
            Kind::Function => {
                push(Via::Env, self.gcref(a + o.fn_env));
                let n = self.mem.u8(a + f.fn_ffid + 1).unwrap_or(0) as u64;
                if self.mem.u8(a + f.fn_ffid) == Some(0) {
                    let pt = self.gcref(a + f.fn_pc).map(|pc| pc - f.pt_size);
                    let names = pt.map(|pt| self.upvalue_names(pt)).unwrap_or_default();
                    let of = super::defined_at(self.detail(obj));
                    for i in 0..n {
                        let name = names.get(i as usize).cloned().unwrap_or(i.to_string());
                        let uv = self.gcref(a + o.lfn_uv + o.refsize * i);
                        push(Via::Upvalue(format!("{name}{of}")), uv);
                    }
                    push(Via::Proto, pt);
                } else {
                    for i in 0..n {
                        let v = self.tv_gc(a + o.cfn_uv + 8 * i).map(|(_, p)| p);
                        push(Via::Upvalue((i + 1).to_string()), v);
                    }
                }
            }
            Kind::Upvalue => {
                // Closed: the value lives in the upvalue; open: on its thread's stack.
                if self.mem.u8(a + o.uv_closed) != Some(0) {
                    push(Via::Value, self.tv_gc(a + o.uv_tv).map(|(_, p)| p));
                }
            }
            Kind::Thread => {
                push(Via::Env, self.gcref(a + o.l_env));
                let stack = self.gcref(a + f.l_stack).unwrap_or(0);
                let top = self.mem.u64(a + f.l_top).unwrap_or(0);
                let size = self.stack_slots(a).unwrap_or(0);
                if stack != 0 && top >= stack && top <= stack + 8 * size {
                    for slot in (stack..top).step_by(8) {
                        push(Via::Stack, self.tv_gc(slot).map(|(_, p)| p));
                    }
                }
            }
            Kind::Proto => {
                push(Via::Const, self.gcref(a + f.pt_chunkname));
                let k = self.gcref(a + f.pt_k).unwrap_or(0);
                let sizekgc = self.mem.u32(a + f.pt_sizept - 8).unwrap_or(0) as u64;
                for i in 1..=sizekgc.min(1 << 20) {
                    push(Via::Const, self.gcref(k - o.refsize * i));
                }
            }
            Kind::Userdata => {
                push(Via::Metatable, self.gcref(a + o.ud_meta));
                push(Via::Env, self.gcref(a + o.ud_env));
            }
            Kind::String | Kind::Cdata | Kind::Trace | Kind::Vm => {}
        }
    }

    fn gc_total(&self) -> u64 {
        match self.o.refsize {
            8 => self.mem.u64(self.g + 16),
            _ => self.mem.u32(self.g + 16).map(u64::from),
        }
        .unwrap_or(0)
    }

    fn warnings(&self) -> Vec<String> {
        self.warnings.borrow().clone()
    }

    fn detail(&self, obj: &Object) -> Option<Detail> {
        let (o, f) = (self.o, &self.f);
        let pt = match obj.kind {
            Kind::Proto => obj.addr,
            Kind::Function if self.mem.u8(obj.addr + f.fn_ffid)? == 0 => {
                self.gcref(obj.addr + f.fn_pc)? - f.pt_size
            }
            Kind::Table => {
                let hmask = self.mem.u32(obj.addr + o.tab_hmask)? as u64;
                return Some(Detail::Table {
                    array: self.mem.u32(obj.addr + o.tab_asize)? as u64,
                    hash: if hmask > 0 { hmask + 1 } else { 0 },
                });
            }
            Kind::Thread => {
                let slots = self.stack_slots(obj.addr)?;
                return Some(Detail::Stack { slots });
            }
            _ => return None,
        };
        let source = self.string(self.gcref(pt + f.pt_chunkname)?)?;
        let line = self.mem.u32(pt + f.pt_firstline)?;
        Some(Detail::Defined(format!(
            "{}:{line}",
            super::chunk_name(&source)
        )))
    }
}

impl Heap<'_> {
    /// A table's references: its metatable, array part, and hash part's keys and values,
    /// less what it holds weakly.
    fn table_refs(&self, t: u64, out: &mut Vec<(Via, u64)>) {
        if let Some(mt) = self.gcref(t + self.o.tab_meta).filter(|&m| m != 0) {
            out.push((Via::Metatable, mt));
        }
        let Some(((node, nodes), (array, asize))) = self.table_parts(t) else {
            return;
        };
        let (weak_k, weak_v) = self.weakness(t);
        if !weak_v {
            for i in 0..asize {
                if let Some((_, v)) = self.tv_gc(array + 8 * i) {
                    out.push((Via::Index, v));
                }
            }
        }
        let string_keys = (0..nodes)
            .filter(|i| {
                self.tv_gc(node + i * self.o.node_size + 8)
                    .is_some_and(|(kt, _)| kt == ITYPE_STR)
            })
            .count() as u32;
        let named = string_keys <= MAX_NAMED_FIELDS;
        for i in 0..nodes {
            let n = node + i * self.o.node_size;
            let key = self.tv_gc(n + 8);
            // A dead key's value is nil: nothing to follow.
            let Some((_, value)) = self.tv_gc(n) else {
                continue;
            };
            let via = match key {
                Some((ITYPE_STR, k)) if named => match self.string(k) {
                    Some(name) => Via::Field(name),
                    None => Via::Index,
                },
                _ => Via::Index,
            };
            if !weak_v {
                out.push((via, value));
            }
            if let Some((kt, k)) = key {
                if kt == ITYPE_STR {
                    out.push((Via::StringKey, k));
                } else if !weak_k {
                    out.push((Via::Key, k));
                }
            }
        }
    }

    /// The names of proto `pt`'s upvalues (its debug info, NUL-terminated names).
    fn upvalue_names(&self, pt: u64) -> Vec<String> {
        let sizeuv = self.mem.u8(pt + self.f.pt_sizept + 4).unwrap_or(0) as usize;
        let Some(mut at) = self.gcref(pt + self.f.pt_uvinfo).filter(|&p| p != 0) else {
            return Vec::new();
        };
        let mut names = Vec::with_capacity(sizeuv);
        let mut name = Vec::new();
        while names.len() < sizeuv && name.len() < MAX_NAME {
            match self.mem.u8(at) {
                Some(0) => names.push(String::from_utf8_lossy(&std::mem::take(&mut name)).into()),
                Some(b) => name.push(b),
                None => break,
            }
            at += 1;
        }
        names
    }
}
