//! LuaJIT 2.1 builds: their layouts (what the BPF walker, ebpf/luajit.h, reads), how a
//! candidate layout is validated against the live process, and how a proto's names and
//! lines are read. [`crate::lua`] tracks the processes and tells their layout.

use std::fs::File;
use std::os::unix::fs::FileExt;

use lrec_format::{LuaProto, Sample};

use crate::lua::check::Pages;
use crate::lua::{read_u32, read_u64, VmCode};
use crate::raw::{RawLuaConfig, RawLuaFrame, MAX_LUA_RANGES};

/// Samples in the interpreter that must agree on a layout before it is used.
pub const VOTES_NEEDED: u32 = 3;
/// Samples in the interpreter after which an unidentified layout is given up.
pub const TRIES_BEFORE_GIVING_UP: u32 = 200;
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

    /// Bytes of a GCRef or MRef: 64 bits in GC64 builds, 32 bits otherwise.
    pub fn ref_size(&self) -> u64 {
        if self.gc64() {
            8
        } else {
            4
        }
    }

    /// Where a GC object's type byte (GCHeader.gct) lies in it.
    pub fn gct_offset(&self) -> usize {
        if self.gc64() {
            9
        } else {
            5
        }
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
        // GCtrace (lj_jit.h), the same in OpenResty's fork; J->trace is found per process.
        j_trace: 0,
        tr_nsnap: 10,
        tr_ir: 32,
        tr_snap: 48,
        tr_snapmap: 56,
        tr_nsnapmap: 44,
        tr_szmcode: 84,
        tr_mcode: 88,
        tr_traceno: 104,
        cts_stack: CTS_STACK_UPSTREAM,
        lh_size: 0,
        gh_lo: 0,
        gh_size: 0,
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
        j_trace: 0,
        tr_nsnap: 6,
        tr_ir: 16,
        tr_snap: 32,
        tr_snapmap: 40,
        tr_nsnapmap: 28,
        tr_szmcode: 60,
        tr_mcode: 64,
        tr_traceno: 80,
        cts_stack: CTS_STACK_UPSTREAM,
        lh_size: 0,
        gh_lo: 0,
        gh_size: 0,
    },
    pt_k: 16,
    pt_sizept: 32,
    pt_uvinfo: 56,
    pt_varinfo: 60,
    builtins: upstream_builtins,
};

/// Where CCallback.stack lies in CTState (lj_ctype.h: after 8 pointer-sized fields or 7,
/// 8 or 14 FPR slots and 8 GPR slots): upstream at 168 (since 2024-04, when the
/// finalizer table left CTState) or 176 (before), OpenResty's fork (14 FPR slots since
/// 2019) at 224 or, should the table leave there too, 216. The BPF walker reads both
/// words of a pair: the other is an unused GPR slot or the callback's mcode pointer.
const CTS_STACK_UPSTREAM: u32 = 168;
const CTS_STACK_OPENRESTY: u32 = 216;

/// A layout that differs from `base` in where G, the current state and the JIT base are,
/// and in its fork's built-in functions and FFI callback state.
const fn variant(
    base: Layout,
    name: &'static str,
    g2disp: u32,
    g_cur_l: u32,
    g_jit_base: u32,
    openresty: bool,
) -> Layout {
    let mut l = base;
    l.name = name;
    l.abi.g2disp = g2disp;
    l.abi.g_cur_l = g_cur_l;
    l.abi.g_jit_base = g_jit_base;
    if openresty {
        l.builtins = crate::lua::luajit_builtins::openresty;
        l.abi.cts_stack = CTS_STACK_OPENRESTY;
    }
    l
}

fn upstream_builtins() -> Vec<&'static str> {
    crate::lua::luajit_builtins::UPSTREAM.to_vec()
}

/// The layouts known, tried in order against the live process.
pub const LAYOUTS: &[Layout] = &[
    GC64,
    variant(GC64, "openresty-gc64", 4008, 368, 376, true),
    GC32,
    variant(GC64, "upstream-2022-gc64", 3968, 368, 376, false),
    variant(GC32, "upstream-2022-gc32", 3176, 288, 292, false),
    variant(GC32, "openresty-gc32", 3216, 288, 292, true),
];

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
    c.with_read_spans()
}

/// Samples in traces after which a trace array that was not found is given up.
pub const TRACE_TRIES: u32 = 50;

/// Where `jit_State.trace`, the array of traces, lies from G: jit_State follows G in the
/// VM's block (GG_State) before the dispatch table, at an offset that depends on the
/// build, so the word is searched for there. It must be followed by `freetrace` and
/// `sizetrace`, and its entry `traceno` (a trace the VM ran) must be a GCtrace with that
/// number.
pub fn find_trace_array(mem: &File, l: &Layout, g: u64, traceno: u32) -> Option<u32> {
    let mut block = vec![0u8; l.abi.g2disp as usize];
    mem.read_exact_at(&mut block, g).ok()?;
    let word = |at: usize| u64::from_le_bytes(block[at..at + 8].try_into().unwrap());
    (0..block.len().saturating_sub(16))
        .step_by(8)
        .find(|&at| {
            let array = word(at);
            let sizetrace = word(at + 8) >> 32;
            if array == 0 || array % 4 != 0 || u64::from(traceno) >= sizetrace {
                return false;
            }
            let Some(t) = read_ref(mem, l, array + u64::from(traceno) * l.ref_size()) else {
                return false;
            };
            let mut hdr = [0u8; 128];
            t != 0
                && mem.read_exact_at(&mut hdr, t).is_ok()
                && hdr[l.gct_offset()] == 9 // ~LJ_TTRACE
                && u16::from_le_bytes(hdr[l.abi.tr_traceno as usize..][..2].try_into().unwrap())
                    == traceno as u16
        })
        .map(|at| at as u32)
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
pub fn validates(mem: &File, l: &Layout, r14: u64, code: &[VmCode]) -> bool {
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

/// How much of a sample's stack [`on_stack`] searches.
const ON_STACK_BYTES: usize = 4096;

/// Whether the sample's stack holds a C frame of a VM of this layout (JIT-compiled code
/// of GC32 builds keeps no DISPATCH in r14): a slot whose SAVE_L names a state whose
/// `cframe` is that very slot, and whose `glref` is a VM whose current state is valid.
pub fn on_stack(mem: &File, l: &Layout, sample: &Sample, code: &[VmCode]) -> bool {
    let cf_l = l.abi.cf_l as usize;
    let width = l.ref_size() as usize;
    // C frames are 16-byte aligned; the innermost ones matter, and each candidate costs a
    // read of the target's memory: the first 4 KiB of the stack at most.
    let stack = &sample.user_stack[..sample.user_stack.len().min(ON_STACK_BYTES)];
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

/// Whether the proto frame `f` of process `pid` names (from a call site BPF remembered) is
/// still the one at its address: the same size, chunk name, lines and chunk-name identity,
/// read as BPF reads them (ebpf/luajit.h, lj_proto_key). None when it cannot be read.
pub fn proto_unchanged(mem: &mut Pages, pid: u32, l: &Layout, f: &RawLuaFrame) -> Option<bool> {
    let a = &l.abi;
    let mut span = [0u8; 128];
    let len = (a.pt_firstline + 8 - a.pt_sizebc) as usize;
    mem.read(pid, f.ptr + u64::from(a.pt_sizebc), span.get_mut(..len)?)
        .then_some(())?;
    let at = |off: u32| (off - a.pt_sizebc) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(span[o..o + 4].try_into().unwrap());
    let chunkname = match l.gc64() {
        true => u64::from_le_bytes(span[at(a.pt_chunkname)..][..8].try_into().unwrap()),
        false => u64::from(u32_at(at(a.pt_chunkname))),
    };
    let fields = (
        u32_at(0),
        chunkname,
        u32_at(at(a.pt_firstline)) as i32,
        u32_at(at(a.pt_firstline) + 4),
    );
    if fields != (f.sizebc, f.chunkname, f.firstline, f.numline) {
        return Some(false);
    }
    // GCstr: the string's id and hash precede its length.
    let mut id = [0u8; 8];
    mem.read(pid, chunkname + u64::from(a.str_len) - 8, &mut id)
        .then_some(())?;
    let id = u64::from_le_bytes(id);
    Some((id as u32) ^ ((id >> 32) as u32) == f.name_id)
}

/// Reads a proto's chunk name and line table, checking that it still is the proto BPF
/// saw (the same chunk name, first line, line count and size).
pub fn read_proto(mem: &File, l: &Layout, f: &RawLuaFrame) -> Option<LuaProto> {
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

/// The names the proto's calls give their callees (see [`crate::lua::luajit_bytecode`]),
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
    let kstr = |idx: u32| -> Option<String> {
        let s = read_ref(mem, l, k.checked_sub((u64::from(idx) + 1) * l.ref_size())?)?;
        let len = read_u32(mem, s + u64::from(l.abi.str_len))? as usize;
        if len > 256 {
            return None;
        }
        let mut text = vec![0u8; len];
        mem.read_exact_at(&mut text, s + u64::from(l.abi.str_data))
            .ok()?;
        Some(String::from_utf8_lossy(&text).into_owned())
    };
    let proto = crate::lua::luajit_bytecode::Proto {
        bc: &bc,
        kstr: &kstr,
        uvinfo: inside(l.pt_uvinfo),
        varinfo: inside(l.pt_varinfo),
        fr2: l.gc64(),
    };
    Some(crate::lua::luajit_bytecode::callee_names(&proto))
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
pub fn lines(raw: &[u8], firstline: i32, numline: u32, sizebc: u32) -> Vec<u32> {
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
