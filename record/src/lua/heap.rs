//! Finds the LuaJIT VMs in a heap snapshot's memory ([`crate::heap`]) and says how to
//! read each one: its `global_State` and the layout that validates there. lanalyze walks
//! the objects (analyze/src/heap/).
//!
//! A VM's block (GG_State: the main lua_State, global_State, jit_State, then the
//! dispatch table) holds a table of a few hundred pointers, all into the interpreter's
//! code: no other memory does. G lies `g2disp` bytes before it, and the main thread right
//! before G, pointing back to it: a layout is taken only where both hold.

use crate::lua::luajit::{Layout, LAYOUTS};
use crate::lua::VmCode;

/// Consecutive words into the interpreter that make a dispatch table (it has ~200).
const MIN_DISPATCH: usize = 64;

/// One VM found: its G and the layout it validated with.
pub struct HeapVm {
    pub g: u64,
    pub layout: &'static Layout,
    /// sizeof(lua_State): the main thread lies right before G (forks add fields to it).
    pub lua_state_size: u32,
    /// From G to the dispatch table.
    pub g2disp: u32,
}

/// The memory of a snapshot: (start, bytes) regions in address order.
pub struct Regions<'a>(pub &'a [(u64, Vec<u8>)]);

impl Regions<'_> {
    fn u64_at(&self, addr: u64) -> Option<u64> {
        let i = self.0.partition_point(|(s, _)| *s <= addr).checked_sub(1)?;
        let (start, data) = &self.0[i];
        let off = (addr - start) as usize;
        let b = data.get(off..off + 8)?;
        Some(u64::from_le_bytes(b.try_into().unwrap()))
    }

    fn u32_at(&self, addr: u64) -> Option<u32> {
        self.u64_at(addr).map(|v| v as u32)
    }
}

/// The LuaJIT VMs in `mem` whose interpreter is `code` (its ranges as mapped).
pub fn find_luajit(mem: &Regions, code: &[VmCode]) -> Vec<HeapVm> {
    let in_vm = |w: u64| code.iter().any(|c| w >= c.start && w < c.end);
    let mut found: Vec<HeapVm> = Vec::new();
    for (start, data) in mem.0 {
        let mut run = 0usize;
        for (i, w) in data.chunks_exact(8).enumerate() {
            if in_vm(u64::from_le_bytes(w.try_into().unwrap())) {
                run += 1;
                continue;
            }
            if run >= MIN_DISPATCH {
                let table = start + 8 * (i - run) as u64;
                if let Some(vm) = validate(mem, table) {
                    if !found.iter().any(|f| f.g == vm.g) {
                        found.push(vm);
                    }
                }
            }
            run = 0;
        }
    }
    found
}

/// The VM whose dispatch table begins at `table`, under the first layout that validates:
/// at the layout's distance from G to the table, else at any distance (a build without
/// the JIT compiler has no jit_State between them).
fn validate(mem: &Regions, table: u64) -> Option<HeapVm> {
    let at = |l: &'static Layout, g2disp: u64| {
        let g = table.checked_sub(g2disp)?;
        let main = read_ref(mem, l, g + mainthref(l) as u64)?;
        let glref = read_ref(mem, l, main + l.abi.l_glref as u64)?;
        let size = g.checked_sub(main)?;
        (glref == g && size >= min_lua_state_size(l) && size <= 256).then_some(HeapVm {
            g,
            layout: l,
            lua_state_size: size as u32,
            g2disp: g2disp as u32,
        })
    };
    LAYOUTS
        .iter()
        .find_map(|l| at(l, l.abi.g2disp as u64))
        .or_else(|| {
            LAYOUTS
                .iter()
                .find_map(|l| (256..=8192).step_by(8).find_map(|d| at(l, d)))
        })
}

fn read_ref(mem: &Regions, l: &Layout, addr: u64) -> Option<u64> {
    match l.gc64() {
        true => mem.u64_at(addr),
        false => mem.u32_at(addr).map(u64::from),
    }
}

/// `global_State.mainthref`: the GCRef after the 32-bit vmstate.
fn mainthref(l: &Layout) -> u32 {
    l.abi.g_vmstate + l.ref_size() as u32
}

/// sizeof(lua_State) at least: `stacksize` follows `cframe`, then padding to 8 bytes
/// (OpenResty's fork adds two pointers after it).
fn min_lua_state_size(l: &Layout) -> u64 {
    l.abi.l_cframe as u64 + 16
}

/// Where a PUC Lua release keeps its main thread: global_State.mainthread points to it
/// (5.1–5.4), or global_State holds it at an offset (5.5's `mainth`, after
/// LUA_EXTRASPACE).
enum MainThread {
    Pointer(u64),
    Inside(u64),
}

/// PUC Lua: where lua_State.l_G and the main thread lie, by minor release (x86_64,
/// default luaconf.h).
fn puc_offsets(minor: u32) -> Option<(u64, MainThread)> {
    use MainThread::*;
    Some(match minor {
        1 => (32, Pointer(176)),
        2 => (24, Pointer(264)),
        3 => (24, Pointer(200)),
        4 => (24, Pointer(264)),
        5 => (24, Inside(1408 + 8)),
        _ => return None,
    })
}

/// The PUC Lua VMs (their global_State) in `mem`, of release 5.`minor`: each main thread
/// (an object of the thread type) whose l_G's main thread is itself. None when the
/// release cannot be read.
pub fn find_puc(mem: &Regions, minor: u32) -> Option<Vec<u64>> {
    let (l_g, main) = puc_offsets(minor)?;
    let mut found = Vec::new();
    for (start, data) in mem.0 {
        // 8-byte steps: from 5.3 on a state follows LUA_EXTRASPACE in its block.
        for i in 0..data.len() / 8 {
            // CommonHeader: `next`, then the type byte (LUA_TTHREAD, 8).
            if data.get(8 * i + 8) != Some(&8) {
                continue;
            }
            let l = start + 8 * i as u64;
            let Some(g) = mem.u64_at(l + l_g).filter(|&g| g != 0) else {
                continue;
            };
            let is_main = match main {
                MainThread::Pointer(off) => mem.u64_at(g + off) == Some(l),
                MainThread::Inside(off) => g.checked_add(off) == Some(l),
            };
            if is_main && !found.contains(&g) {
                found.push(g);
            }
        }
    }
    Some(found)
}

/// The offsets lanalyze's heap walker reads (analyze/src/heap/luajit.rs), by name.
pub fn offsets(vm: &HeapVm) -> Vec<(String, u32)> {
    let (l, a) = (vm.layout, &vm.layout.abi);
    [
        ("L.size", vm.lua_state_size),
        ("gc64", a.gc64),
        ("g2disp", vm.g2disp),
        ("g.vmstate", a.g_vmstate),
        ("g.mainthref", mainthref(l)),
        ("g.cur_L", a.g_cur_l),
        ("g.jit_base", a.g_jit_base),
        ("L.glref", a.l_glref),
        ("L.base", a.l_base),
        ("L.stack", a.l_stack),
        ("L.maxstack", a.l_maxstack),
        ("L.cframe", a.l_cframe),
        ("fn.ffid", a.fn_ffid),
        ("fn.pc", a.fn_pc),
        ("pt.size", a.pt_size),
        ("pt.sizebc", a.pt_sizebc),
        ("pt.k", l.pt_k),
        ("pt.sizept", l.pt_sizept),
        ("pt.chunkname", a.pt_chunkname),
        ("pt.firstline", a.pt_firstline),
        ("pt.uvinfo", l.pt_uvinfo),
        ("str.len", a.str_len),
        ("str.data", a.str_data),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}
