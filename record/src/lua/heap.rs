//! Finds the LuaJIT VMs in a heap snapshot's memory ([`crate::heap`]) and says how to
//! read each one: its `global_State` and the layout that validates there. lanalyze walks
//! the objects (analyze/src/heap/).
//!
//! A VM's block (GG_State: the main lua_State, global_State, jit_State, then the
//! dispatch table) holds a table of a few hundred pointers, all into the interpreter's
//! code: no other memory does. G lies `g2disp` bytes before it, and the main thread right
//! before G, pointing back to it: a layout is taken only where both hold.

use lrec_inspect::lua::luajit::Offsets;
use lrec_inspect::lua::puc;

use crate::lua::VmCode;

/// Consecutive words into the interpreter that make a dispatch table (it has ~200).
const MIN_DISPATCH: usize = 64;

/// One VM found: its G, and sizeof(lua_State) measured there.
pub struct HeapVm {
    pub g: u64,
    /// sizeof(lua_State): the main thread lies right before G (forks add fields to it).
    pub lua_state_size: u32,
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

/// The LuaJIT VMs of layout `l` in `mem` whose interpreter is `code` (its ranges as
/// mapped).
pub fn find_luajit(mem: &Regions, code: &[VmCode], l: &Offsets) -> Vec<HeapVm> {
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
                if let Some(vm) = validate(mem, l, table) {
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

/// The VM whose dispatch table begins at `table`, if the layout validates there: G lies
/// `g2disp` before it, and the main thread (right before G) points back to G.
fn validate(mem: &Regions, l: &Offsets, table: u64) -> Option<HeapVm> {
    let g = table.checked_sub(u64::from(l.g2disp))?;
    let main = read_ref(mem, l, g + u64::from(l.g_mainthref))?;
    let glref = read_ref(mem, l, main + u64::from(l.l_glref))?;
    let size = g.checked_sub(main)?;
    (glref == g && size > u64::from(l.l_cframe) && size <= 256).then_some(HeapVm {
        g,
        lua_state_size: size as u32,
    })
}

fn read_ref(mem: &Regions, l: &Offsets, addr: u64) -> Option<u64> {
    match l.is_gc64() {
        true => mem.u64_at(addr),
        false => mem.u32_at(addr).map(u64::from),
    }
}

/// The PUC Lua VMs (their global_State) of layout `l` in `mem`: each main thread (an
/// object of the thread type) whose l_G's main thread is itself.
pub fn find_puc(mem: &Regions, l: &puc::Layout) -> Vec<u64> {
    let o = &l.offsets;
    let inside = l.rules.version >= 505;
    let mut found = Vec::new();
    for (start, data) in mem.0 {
        // 8-byte steps: from 5.3 on a state follows LUA_EXTRASPACE in its block.
        for i in 0..data.len() / 8 {
            // CommonHeader: `next`, then the type byte (LUA_TTHREAD, 8).
            if data.get(8 * i + 8) != Some(&8) {
                continue;
            }
            let at = start + 8 * i as u64;
            let Some(g) = mem.u64_at(at + u64::from(o.l_g)).filter(|&g| g != 0) else {
                continue;
            };
            let is_main = match inside {
                true => g.checked_add(u64::from(o.g_mainthread)) == Some(at),
                false => mem.u64_at(g + u64::from(o.g_mainthread)) == Some(at),
            };
            if is_main && !found.contains(&g) {
                found.push(g);
            }
        }
    }
    found
}

/// The offsets lanalyze's heap walker reads (analyze/src/heap/luajit.rs), by name, with
/// sizeof(lua_State) as measured in the snapshot.
pub fn offsets(l: &Offsets, vm: &HeapVm) -> Vec<(String, u32)> {
    let mut o = *l;
    o.l_size = vm.lua_state_size;
    o.named()
}
