//! PUC Lua 5.1–5.5's heap (lobject.h, lstate.h, lgc.c of each release): the objects of
//! the collector's lists with their sizes as each release's free functions free them, and
//! what each references. The layouts are x86_64's with the default luaconf.h (measured by
//! compiling each release's headers); a host with another luaconf (LUA_32BITS, a bigger
//! LUA_EXTRASPACE) is not read correctly, and the census check says so.

use std::cell::RefCell;

use anyhow::{bail, Result};
use lrec_format::LuaHeap;
use rustc_hash::FxHashSet;

use super::{Detail, Kind, Memory, Object, Via, VmHeap};

mod layout;
mod values;

use layout::Release;

/// Most objects followed along one list, and most slots read from one table.
const MAX_LIST: usize = 100_000_000;
/// A table with more string keys than this has its fields named `[*]`.
const MAX_NAMED_FIELDS: u32 = 64;
const MAX_NAME: usize = 200;
/// Extra stack slots every stack has past its end (EXTRA_STACK).
const EXTRA_STACK: u64 = 5;

/// A GC object's type, from its header's tag.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Tag {
    Str,
    Table,
    LClosure,
    CClosure,
    Udata,
    Thread,
    Proto,
    Upval,
}

/// A table's array part (address, slots) and node part (address, nodes, and whether
/// they were allocated: an empty hash part is a shared static node).
struct Parts {
    /// Whether the copy holds both parts: a damaged or changing heap's are not read.
    held: bool,
    array: u64,
    asize: u64,
    node: u64,
    nodes: u64,
    allocated: bool,
}

/// One PUC Lua VM's heap in a snapshot's memory.
pub struct Heap<'a> {
    mem: &'a Memory,
    r: Release,
    g: u64,
    main: u64,
    registry: Option<u64>,
    warnings: RefCell<Vec<String>>,
}

impl<'a> Heap<'a> {
    pub fn new(mem: &'a Memory, vm: &LuaHeap) -> Result<Heap<'a>> {
        let minor = match vm.vm.strip_prefix("Lua 5.").and_then(|m| m.parse().ok()) {
            Some(m @ 1..=5) => m,
            _ => bail!(
                "the heap of {} cannot be read by this lanalyze (5.1–5.5 can)",
                vm.vm
            ),
        };
        let r = Release::new(minor, &vm.offsets)?;
        let mut heap = Heap {
            mem,
            r,
            g: vm.g,
            main: 0,
            registry: None,
            warnings: RefCell::new(Vec::new()),
        };
        let r = &heap.r;
        heap.main = match r.minor {
            // 5.5: the main thread lives in global_State.
            5 => vm.g + r.g_mainthread,
            _ => mem.u64(vm.g + r.g_mainthread).unwrap_or(0),
        };
        if heap.main == 0 || mem.u64(heap.main + r.l_g) != Some(vm.g) {
            bail!(
                "the Lua state at {:#x} of process {} is not in the snapshot, or not laid out \
                 as Lua 5.{}'s default build",
                vm.g,
                vm.pid,
                r.minor
            );
        }
        heap.registry = heap
            .tv_gc(vm.g + heap.r.g_registry)
            .filter(|&(t, _)| t == Tag::Table)
            .map(|(_, p)| p);
        if heap.registry.is_none() {
            heap.warn("the registry (and so package.loaded and _G) was not found");
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

    fn list(&self, first: u64, next: u64, seen: &mut FxHashSet<u64>, out: &mut Vec<Object>) {
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
            o = self.ptr(o + next);
        }
    }

    /// 5.3's upvalues, which no list holds: those of every Lua closure, and the open ones
    /// of every thread.
    fn upvalues_53(&self, out: &mut Vec<Object>, seen: &mut FxHashSet<u64>) {
        let r = &self.r;
        let (closures, threads): (Vec<u64>, Vec<u64>) = (
            out.iter()
                .filter(|o| {
                    o.kind == Kind::Function && self.header_tag(o.addr) == Some(Tag::LClosure)
                })
                .map(|o| o.addr)
                .collect(),
            out.iter()
                .filter(|o| o.kind == Kind::Thread)
                .map(|o| o.addr)
                .collect(),
        );
        let mut add = |uv: u64, out: &mut Vec<Object>| {
            if uv != 0 && seen.insert(uv) {
                out.push(Object {
                    addr: uv,
                    kind: Kind::Upvalue,
                    size: r.uv_size,
                });
            }
        };
        for c in closures {
            let n = self.mem.u8(c + r.cl_nupvalues).unwrap_or(0) as u64;
            for i in 0..n {
                add(self.ptr(c + r.lcl_uv + 8 * i), out);
            }
        }
        for l in threads {
            let mut uv = self.ptr(l + r.l_openupval);
            let mut steps = 0;
            while uv != 0 && steps < MAX_LIST {
                add(uv, out);
                uv = self.ptr(uv + r.uv_next);
                steps += 1;
            }
        }
    }

    fn thread_size(&self, l: u64) -> u64 {
        let r = &self.r;
        let stack = match r.minor {
            4.. => {
                let slots = self
                    .ptr(l + r.l_stacksize)
                    .saturating_sub(self.ptr(l + r.l_stack))
                    / 16;
                16 * (slots + EXTRA_STACK)
            }
            _ => 16 * self.int(l + r.l_stacksize),
        };
        let cis = match r.minor {
            1 => self.int(l + r.l_ci_count),
            2 => {
                // base_ci is part of the state; the CallInfos after it were allocated.
                let mut n = 0;
                let mut ci = self.ptr(l + r.l_ci_count + 24);
                while ci != 0 && n < 1 << 20 {
                    n += 1;
                    ci = self.ptr(ci + 24);
                }
                n
            }
            5 => self.int(l + r.l_ci_count),
            _ => self.mem.u16(l + r.l_ci_count).unwrap_or(0) as u64,
        };
        let own = match (l == self.main, r.minor) {
            // 5.5's global_State holds the main thread.
            (true, 5) => r.g_size,
            // The main thread's block (LG) holds global_State too.
            (true, _) => self.g + r.g_size - (l - r.extra),
            (false, _) => r.extra + r.l_size,
        };
        own + stack + r.ci_size * cis
    }

    fn proto_size(&self, p: u64) -> u64 {
        let r = &self.r;
        let n = |off: u64| self.int(p + off);
        // 5.5's PF_FIXED: code and line info in memory the collector does not count.
        let fixed = r
            .pt_flag
            .is_some_and(|at| self.mem.u8(p + at).is_some_and(|f| f & 4 != 0));
        let code = match fixed {
            true => 0,
            false => {
                4 * n(r.pt_sizecode)
                    + r.lineinfo_size * n(r.pt_sizelineinfo)
                    + r.pt_sizeabslineinfo.map_or(0, |o| 8 * n(o))
            }
        };
        r.pt_size
            + code
            + 8 * n(r.pt_sizep)
            + 16 * n(r.pt_sizek)
            + 16 * n(r.pt_sizelocvars)
            + r.upvaldesc_size * n(r.pt_sizeupvalues)
    }
}

impl VmHeap for Heap<'_> {
    fn census(&self) -> Vec<Object> {
        let r = &self.r;
        let mut seen = FxHashSet::default();
        let mut out = Vec::new();
        for &list in &r.g_lists {
            self.list(self.ptr(self.g + list), 0, &mut seen, &mut out);
        }
        if let Some(ring) = r.g_ring {
            // 5.1's tmudata: the last of a ring of userdata waiting for __gc.
            let last = self.ptr(self.g + ring);
            if last != 0 {
                let mut ring = Vec::new();
                self.list(
                    self.ptr(last),
                    0,
                    &mut FxHashSet::from_iter([last]),
                    &mut ring,
                );
                ring.extend(self.object_at(last));
                out.extend(ring.into_iter().filter(|o| seen.insert(o.addr)));
            }
        }
        if seen.insert(self.main) {
            out.extend(self.object_at(self.main));
        }
        // Strings of the string table (5.3+: short strings only; long ones are in allgc).
        let hash = self.ptr(self.g + r.g_strt);
        let size = self.int(self.g + r.g_strt + 12);
        if hash != 0 && size < 1 << 28 {
            for i in 0..size {
                self.list(self.ptr(hash + 8 * i), r.s_chain, &mut seen, &mut out);
            }
            out.push(Object {
                addr: hash,
                kind: Kind::Vm,
                size: 8 * size,
            });
        } else {
            self.warn("the string table was not found: strings are counted only if reached");
        }
        if let Some(off) = r.g_buffsize {
            let size = self.ptr(self.g + off);
            if size > 0 && size < 1 << 32 {
                out.push(Object {
                    addr: self.g + off,
                    kind: Kind::Vm,
                    size,
                });
            }
        }
        match r.minor {
            3 => self.upvalues_53(&mut out, &mut seen),
            // Open upvalues chain off their thread (5.4 keeps them in allgc too).
            1 | 2 => {
                let threads: Vec<u64> = out
                    .iter()
                    .filter(|o| o.kind == Kind::Thread)
                    .map(|o| o.addr)
                    .collect();
                for l in threads {
                    self.list(self.ptr(l + r.l_openupval), r.uv_next, &mut seen, &mut out);
                }
            }
            _ => {}
        }
        out
    }

    fn object_at(&self, addr: u64) -> Option<Object> {
        let r = &self.r;
        let (kind, size) = match self.header_tag(addr)? {
            Tag::Str => (Kind::String, self.str_size(addr)?),
            Tag::Table => {
                let Parts {
                    array,
                    asize,
                    nodes,
                    allocated,
                    ..
                } = self.table_parts(addr)?;
                let mut hash = if allocated { nodes * r.node_size } else { 0 };
                // 5.5 keeps `lastfree` before a hash part of 8 nodes or more.
                if r.minor == 5 && allocated && nodes >= 8 {
                    hash += 8;
                }
                let (_, array) = self.array_bytes(array, asize);
                (Kind::Table, r.t_size + array + hash)
            }
            Tag::LClosure => {
                let n = self.mem.u8(addr + r.cl_nupvalues)? as u64;
                (Kind::Function, r.lcl_base + 8 * n)
            }
            Tag::CClosure => {
                let n = self.mem.u8(addr + r.cl_nupvalues)? as u64;
                (Kind::Function, r.ccl_base + 16 * n)
            }
            Tag::Udata => {
                let len = self.mem.u64(addr + r.ud_len)?;
                let size = match r.minor {
                    4.. => match self.mem.u16(addr + r.ud_nuvalue?)? as u64 {
                        0 => r.ud_size0 + len,
                        nuv => r.ud_uv + 16 * nuv + len,
                    },
                    _ => r.ud_size0 + len,
                };
                (Kind::Userdata, size)
            }
            Tag::Thread => (Kind::Thread, self.thread_size(addr)),
            Tag::Proto => (Kind::Proto, self.proto_size(addr)),
            Tag::Upval => (Kind::Upvalue, r.uv_size),
        };
        Some(Object { addr, kind, size })
    }

    fn roots(&self) -> Vec<(String, u64)> {
        let r = &self.r;
        let mut roots = Vec::new();
        if let Some(loaded) = self.registry.and_then(|reg| self.field(reg, "_LOADED")) {
            roots.push(("package.loaded".to_string(), loaded));
        }
        let globals = match r.l_gt {
            Some(off) => self.tv_gc(self.main + off).map(|(_, p)| p),
            // LUA_RIDX_GLOBALS: the registry's array slot 2.
            None => self.registry.and_then(|reg| {
                let parts = self.table_parts(reg).filter(|p| p.held)?;
                (parts.asize >= 2)
                    .then(|| self.array_slot(parts.array, 1))
                    .flatten()
                    .map(|(_, p)| p)
            }),
        };
        if let Some(g) = globals {
            roots.push(("_G".to_string(), g));
        }
        if let Some(reg) = self.registry {
            roots.push(("registry".to_string(), reg));
        }
        roots.push(("<main thread>".to_string(), self.main));
        roots
    }

    fn refs(&self, obj: &Object, out: &mut Vec<(Via, u64)>) {
        let r = &self.r;
        let a = obj.addr;
        let mut push = |via: Via, p: Option<u64>| {
            if let Some(p) = p.filter(|&p| p != 0) {
                out.push((via, p));
            }
        };
        let Some(tag) = self
            .header_tag(a)
            .or((obj.kind == Kind::Upvalue).then_some(Tag::Upval))
        else {
            return;
        };
        match tag {
            Tag::Table => {
                push(Via::Metatable, Some(self.ptr(a + r.t_meta)));
                let Some(Parts {
                    held: true,
                    array,
                    asize,
                    node,
                    nodes,
                    allocated,
                }) = self.table_parts(a)
                else {
                    return;
                };
                let (weak_k, weak_v) = self.weakness(a);
                if !weak_v {
                    for i in 0..asize {
                        push(Via::Index, self.array_slot(array, i).map(|(_, p)| p));
                    }
                }
                if !allocated {
                    return;
                }
                let string_keys = (0..nodes)
                    .filter(|i| {
                        matches!(self.node_key(node + i * r.node_size), Some((Tag::Str, _)))
                    })
                    .count() as u32;
                for i in 0..nodes {
                    let n = node + i * r.node_size;
                    let Some((_, v)) = self.tv_gc(n) else {
                        continue;
                    };
                    let key = self.node_key(n);
                    let via = match key {
                        Some((Tag::Str, k)) if string_keys <= MAX_NAMED_FIELDS => {
                            self.string(k).map_or(Via::Index, Via::Field)
                        }
                        _ => Via::Index,
                    };
                    if !weak_v {
                        push(via, Some(v));
                    }
                    match key {
                        Some((Tag::Str, k)) => push(Via::StringKey, Some(k)),
                        Some((_, k)) if !weak_k => push(Via::Key, Some(k)),
                        _ => {}
                    }
                }
            }
            Tag::LClosure => {
                if let Some(env) = r.cl_env {
                    push(Via::Env, Some(self.ptr(a + env)));
                }
                let p = self.ptr(a + r.lcl_p);
                let names = self.upvalue_names(p);
                let n = self.mem.u8(a + r.cl_nupvalues).unwrap_or(0) as u64;
                let of = super::defined_at(self.detail(obj));
                for i in 0..n {
                    let name = names.get(i as usize).cloned().unwrap_or(i.to_string());
                    let uv = Some(self.ptr(a + r.lcl_uv + 8 * i));
                    push(Via::Upvalue(format!("{name}{of}")), uv);
                }
                push(Via::Proto, Some(p));
            }
            Tag::CClosure => {
                if let Some(env) = r.cl_env {
                    push(Via::Env, Some(self.ptr(a + env)));
                }
                let n = self.mem.u8(a + r.cl_nupvalues).unwrap_or(0) as u64;
                for i in 0..n {
                    let v = self.tv_gc(a + r.ccl_uv + 16 * i).map(|(_, p)| p);
                    push(Via::Upvalue((i + 1).to_string()), v);
                }
            }
            Tag::Upval => {
                if self.ptr(a + r.uv_v) == a + r.uv_value {
                    push(Via::Value, self.tv_gc(a + r.uv_value).map(|(_, p)| p));
                }
            }
            Tag::Thread => {
                if let Some(gt) = r.l_gt {
                    push(Via::Env, self.tv_gc(a + gt).map(|(_, p)| p));
                }
                let (stack, top) = (self.ptr(a + r.l_stack), self.ptr(a + r.l_top));
                if stack != 0 && top >= stack && top - stack < 16 << 24 {
                    for slot in (stack..top).step_by(16) {
                        push(Via::Stack, self.tv_gc(slot).map(|(_, p)| p));
                    }
                }
            }
            Tag::Proto => {
                push(Via::Const, Some(self.ptr(a + r.pt_source)));
                let n = |off: u64| self.int(a + off).min(1 << 24);
                let k = self.ptr(a + r.pt_k);
                for i in 0..n(r.pt_sizek) {
                    push(Via::Const, self.tv_gc(k + 16 * i).map(|(_, p)| p));
                }
                let ps = self.ptr(a + r.pt_p);
                for i in 0..n(r.pt_sizep) {
                    push(Via::Const, Some(self.ptr(ps + 8 * i)));
                }
                let uvs = self.ptr(a + r.pt_upvalues);
                for i in 0..n(r.pt_sizeupvalues) {
                    push(Via::Const, Some(self.ptr(uvs + r.upvaldesc_size * i)));
                }
                let vars = self.ptr(a + r.pt_locvars);
                for i in 0..n(r.pt_sizelocvars) {
                    push(Via::Const, Some(self.ptr(vars + 16 * i)));
                }
            }
            Tag::Udata => {
                push(Via::Metatable, Some(self.ptr(a + r.ud_meta)));
                match r.minor {
                    1 | 2 => push(Via::Env, r.ud_env.map(|at| self.ptr(a + at))),
                    3 => {
                        let tt = self.mem.u8(a + r.ud_uvtag.unwrap_or(10)).unwrap_or(0) as u32;
                        if self.tag_of(tt).is_some() {
                            push(Via::Env, r.ud_env.map(|at| self.ptr(a + at)));
                        }
                    }
                    _ => {
                        let nuv = r
                            .ud_nuvalue
                            .map_or(0, |at| self.mem.u16(a + at).unwrap_or(0))
                            as u64;
                        for i in 0..nuv {
                            let v = self.tv_gc(a + r.ud_uv + 16 * i).map(|(_, p)| p);
                            push(Via::Upvalue((i + 1).to_string()), v);
                        }
                    }
                }
            }
            Tag::Str => {}
        }
    }

    fn gc_total(&self) -> u64 {
        let r = &self.r;
        let total = self.ptr(self.g + r.g_totalbytes) as i64;
        let debt = r.g_debt.map_or(0, |d| self.ptr(self.g + d) as i64);
        // gettotalbytes: 5.2–5.4 add the debt, 5.5 subtracts it.
        match r.minor {
            5 => (total - debt).max(0) as u64,
            _ => (total + debt).max(0) as u64,
        }
    }

    fn warnings(&self) -> Vec<String> {
        self.warnings.borrow().clone()
    }

    fn detail(&self, obj: &Object) -> Option<Detail> {
        let r = &self.r;
        let p = match (obj.kind, self.header_tag(obj.addr)?) {
            (Kind::Proto, _) => obj.addr,
            (Kind::Function, Tag::LClosure) => self.ptr(obj.addr + r.lcl_p),
            (Kind::Table, _) => {
                let t = self.table_parts(obj.addr)?;
                let hash = if t.allocated { t.nodes } else { 0 };
                return Some(Detail::Table {
                    array: t.asize,
                    hash,
                });
            }
            (Kind::Thread, _) => {
                let slots = match r.minor {
                    4.. => {
                        let (last, stack) = (
                            self.ptr(obj.addr + r.l_stacksize),
                            self.ptr(obj.addr + r.l_stack),
                        );
                        last.saturating_sub(stack) / 16 + EXTRA_STACK
                    }
                    _ => self.int(obj.addr + r.l_stacksize),
                };
                return Some(Detail::Stack { slots });
            }
            _ => return None,
        };
        let source = self.string(self.ptr(p + r.pt_source))?;
        let line = self.int(p + r.pt_linedefined);
        Some(Detail::Defined(format!(
            "{}:{line}",
            super::chunk_name(&source)
        )))
    }
}

impl Heap<'_> {
    /// The names of proto `p`'s upvalues.
    fn upvalue_names(&self, p: u64) -> Vec<String> {
        let r = &self.r;
        let n = self.int(p + r.pt_sizeupvalues).min(256);
        let uvs = self.ptr(p + r.pt_upvalues);
        (0..n)
            .map(|i| {
                let name = self.ptr(uvs + r.upvaldesc_size * i);
                self.string(name).unwrap_or_else(|| i.to_string())
            })
            .collect()
    }
}
