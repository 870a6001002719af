//! LuaJIT 2.1 in the live process: how a layout learned from the binary
//! (`lrec_inspect::lua::luajit`) is proved on it, and how a proto's names and lines are
//! read. [`crate::lua`] tracks the processes.

use std::fs::File;
use std::os::unix::fs::FileExt;

use lrec_format::{LuaProto, Sample};

use lrec_inspect::lua::luajit::{
    Builtins, Layout, Offsets, FRAME_LUA, GCT_FUNC, GCT_PROTO, GCT_STR, GCVMASK,
};
use lrec_inspect::lua::named::ABSENT;

use crate::lua::{read_u32, read_u64, VmCode};
use crate::raw::{RawLuaConfig, RawLuaFrame};

/// Samples in the interpreter that must agree on a layout before it is used.
pub const VOTES_NEEDED: u32 = 3;
/// Samples in the interpreter after which an unidentified layout is given up.
pub const TRIES_BEFORE_GIVING_UP: u32 = 200;
/// Longest chunk name read.
const MAX_CHUNKNAME: usize = 4096;
/// Most bytecode positions of a proto whose lines are read.
const MAX_SIZEBC: u32 = 1 << 20;

/// The built-in functions' names of a build.
pub fn builtins(l: &Layout) -> Vec<&'static str> {
    match l.builtins {
        Builtins::Upstream => crate::lua::luajit_builtins::UPSTREAM.to_vec(),
        Builtins::OpenResty => crate::lua::luajit_builtins::openresty(),
    }
}

/// The BPF walker's configuration for a layout and the interpreter ranges of a process,
/// with the trace array at `j_trace` from G (0: not known).
pub fn config(l: &Offsets, code: &[VmCode], j_trace: u32) -> RawLuaConfig {
    let ranges: Vec<(u64, u64)> = code.iter().map(|c| (c.start, c.end)).collect();
    RawLuaConfig::new(l, &ranges, j_trace)
}

/// Samples in traces after which a trace array that was not found is given up.
pub const TRACE_TRIES: u32 = 50;

/// Where `jit_State.trace`, the array of traces, lies from G: jit_State follows G in the
/// VM's block (GG_State) before the dispatch table, at an offset that depends on the
/// build, so the word is searched for there. It must be followed by `freetrace` and
/// `sizetrace`, and its entry `traceno` (a trace the VM ran) must be a GCtrace with that
/// number.
pub fn find_trace_array(mem: &File, l: &Offsets, g: u64, traceno: u32) -> Option<u32> {
    let mut block = vec![0u8; l.g2disp as usize];
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
                && hdr[l.gct() as usize] == 9 // ~LJ_TTRACE
                && u16::from_le_bytes(hdr[l.tr_traceno as usize..][..2].try_into().unwrap())
                    == traceno as u16
        })
        .map(|at| at as u32)
}

fn read_ref(mem: &File, l: &Offsets, addr: u64) -> Option<u64> {
    if l.is_gc64() {
        read_u64(mem, addr)
    } else {
        read_u32(mem, addr).map(u64::from)
    }
}

/// The VM a sample ran in, as this layout finds it: from DISPATCH in r14 (the
/// interpreter, and compiled code of GC64 builds), else from a C frame of the VM on the
/// sample's stack ([`on_stack`]).
pub fn vm_of(mem: &File, l: &Offsets, sample: &Sample, code: &[VmCode]) -> Option<u64> {
    validates(mem, l, sample.regs.r14, code).or_else(|| on_stack(mem, l, sample, code))
}

/// G, when `r14` (DISPATCH while the interpreter runs) points into a VM of this layout:
/// the dispatch table's first entry must be interpreter code, G = DISPATCH - GG_G2DISP,
/// its current state's `glref` must lead back to G, and its `vmstate` must be a trace
/// number or one of the LJ_VMST_* states.
pub fn validates(mem: &File, l: &Offsets, r14: u64, code: &[VmCode]) -> Option<u64> {
    let disp = if l.is_gc64() { r14 } else { r14 & 0xffff_ffff };
    let g = disp.checked_sub(u64::from(l.g2disp)).filter(|&g| g != 0)?;
    let check = || -> Option<bool> {
        let first = read_u64(mem, disp)?;
        if !code.iter().any(|c| first >= c.start && first < c.end) {
            return Some(false);
        }
        let cur_l = read_ref(mem, l, g + u64::from(l.g_cur_l))?;
        let glref = read_ref(mem, l, cur_l + u64::from(l.l_glref))?;
        let vmstate = read_u32(mem, g + u64::from(l.g_vmstate))? as i32;
        Some(cur_l != 0 && glref == g && (-8..1 << 20).contains(&vmstate))
    };
    check().unwrap_or(false).then_some(g)
}

/// What the Lua frame a sample runs says of a layout's function, prototype and string
/// fields, in VM `g`: `Some(true)` when its function is a Lua function whose prototype
/// holds the running PC (in the interpreter) and whose chunk name is a valid string,
/// `Some(false)` when a Lua function's prototype is no prototype or its chunk name no
/// string, `None` when the sample tells nothing (not at a Lua frame, between
/// instructions, memory gone). The frame's base is BASE (rdx)
/// in the interpreter, `G->jit_base` in a trace.
pub fn proto_proof(
    mem: &File,
    l: &Offsets,
    g: u64,
    sample: &Sample,
    code: &[VmCode],
) -> Option<bool> {
    let in_vm = code
        .iter()
        .any(|c| sample.regs.ip >= c.start && sample.regs.ip < c.end);
    // A sample in the interpreter carries its BASE and PC (rdx, rbx): the frame it ran,
    // whatever the VM does by now (a VM busy loading and collecting code is in C or the
    // GC at most looks, and the proof once starved: 1 decided look in 200). Else, a trace
    // running now.
    let (base, pc) = if in_vm {
        (sample.regs.dx, Some(sample.regs.bx))
    } else if l.g_jit_base != ABSENT && read_u32(mem, g + u64::from(l.g_vmstate))? as i32 >= 0 {
        (read_ref(mem, l, g + u64::from(l.g_jit_base))?, None)
    } else {
        return None;
    };
    proof_from(mem, l, base, pc)
}

/// [`proto_proof`] from the frame at `base` running at `pc` (when known): its function,
/// then its callers', read now. By the time lrec reads the process (it polls every 5 ms),
/// a function of a VM busy loading code (tests/luajit.rs's reload.lua: functions of
/// ~0.2 ms, each new) has often returned and the look tells nothing (the proof took 24 to
/// 416 samples in five runs), but its caller (a main loop) most often still runs, its
/// call's return PC in the frame above it (3 or 4 samples). A few frames down at most.
fn proof_from(mem: &File, l: &Offsets, base: u64, pc: Option<u64>) -> Option<bool> {
    let mut frame = base.checked_sub(8)?;
    let mut pc = pc;
    for _ in 0..PROOF_FRAMES {
        let (func, link) = frame_at(mem, l, frame)?;
        if let Some(decided) = proto_holds(mem, l, func, pc) {
            return Some(decided);
        }
        // The caller: a Lua frame's lies 1 + A slots (and GC64's link slot) below, A the
        // operand of the call before its return PC (the link); a vararg or C frame's
        // `delta` bytes below, its PC unknown.
        if link & 3 == FRAME_LUA {
            let ret = if l.is_gc64() {
                link
            } else {
                link & 0xffff_ffff
            };
            let a = (read_u32(mem, ret.checked_sub(4)?)? >> 8) & 0xff;
            frame = frame.checked_sub(8 * (1 + u64::from(l.is_gc64()) + u64::from(a)))?;
            pc = Some(ret);
        } else if link & !7 != 0 {
            frame = frame.checked_sub(link & !7)?;
            pc = None;
        } else {
            return None;
        }
    }
    None
}

/// Frames from the sampled one down that [`proto_proof`] looks at.
const PROOF_FRAMES: usize = 8;

/// The function and the link of the frame whose link slot is at `frame` (GC64: the
/// function a tagged pointer in the slot below; GC32: both in one slot).
fn frame_at(mem: &File, l: &Offsets, frame: u64) -> Option<(u64, u64)> {
    if l.is_gc64() {
        let link = read_u64(mem, frame)?;
        Some((read_u64(mem, frame.checked_sub(8)?)? & GCVMASK, link))
    } else {
        let slot = read_u64(mem, frame)?;
        Some((slot & 0xffff_ffff, (slot >> 32) as i32 as i64 as u64))
    }
}

/// What function `func` says of the layout (as [`proto_proof`]): when it is a Lua
/// function, whether its prototype reads as one and holds `pc` when a PC is known
/// (`None` when it lies elsewhere: another function runs there by now).
fn proto_holds(mem: &File, l: &Offsets, func: u64, pc: Option<u64>) -> Option<bool> {
    let byte = |addr: u64| -> Option<u8> {
        let mut b = [0u8];
        mem.read_exact_at(&mut b, addr).ok()?;
        Some(b[0])
    };
    if func == 0 || byte(func + l.gct())? != GCT_FUNC || byte(func + u64::from(l.fn_ffid))? != 0 {
        return None;
    }
    let bc = read_ref(mem, l, func + u64::from(l.fn_pc))?;
    let pt = bc.checked_sub(u64::from(l.pt_size))?;
    let sizebc = read_u32(mem, pt + u64::from(l.pt_sizebc))?;
    if byte(pt + l.gct())? != GCT_PROTO || sizebc == 0 || sizebc > MAX_SIZEBC {
        return Some(false);
    }
    // Between instructions (a call's handler has set the callee's BASE and not yet
    // its PC) the PC tells nothing: only a PC inside proves.
    if pc.is_some_and(|pc| pc <= bc || pc > bc + 4 * u64::from(sizebc)) {
        return None;
    }
    let name = read_ref(mem, l, pt + u64::from(l.pt_chunkname))?;
    let len = read_u32(mem, name + u64::from(l.str_len))? as usize;
    if byte(name + l.gct())? != GCT_STR || len > MAX_CHUNKNAME {
        return Some(false);
    }
    let mut text = vec![0u8; len + 1];
    mem.read_exact_at(&mut text, name + u64::from(l.str_data))
        .ok()?;
    let numline = read_u32(mem, pt + u64::from(l.pt_numline))?;
    let firstline = read_u32(mem, pt + u64::from(l.pt_firstline))? as i32;
    Some(text[len] == 0 && is_name(&text[..len]) && firstline >= 0 && numline < 1 << 24)
}

/// Whether bytes read as a chunk or function name: UTF-8 without NULs or other control
/// characters than line breaks and tabs (a chunk loaded from a string has its source as
/// its name).
pub fn is_name(text: &[u8]) -> bool {
    std::str::from_utf8(text).is_ok_and(|s| {
        !s.chars()
            .any(|c| c.is_control() && c != '\n' && c != '\t' && c != '\r')
    })
}

/// How much of a sample's stack [`on_stack`] searches.
const ON_STACK_BYTES: usize = 4096;

/// G, when the sample's stack holds a C frame of a VM of this layout (JIT-compiled code
/// of GC32 builds keeps no DISPATCH in r14): a slot whose SAVE_L names a state whose
/// `cframe` is that very slot, and whose `glref` is a VM whose current state is valid.
pub fn on_stack(mem: &File, l: &Offsets, sample: &Sample, code: &[VmCode]) -> Option<u64> {
    let cf_l = l.cf_l as usize;
    let width = l.ref_size() as usize;
    // C frames are 16-byte aligned; the innermost ones matter, and each candidate costs a
    // read of the target's memory: the first 4 KiB of the stack at most.
    let stack = &sample.user_stack[..sample.user_stack.len().min(ON_STACK_BYTES)];
    (0..stack.len().saturating_sub(cf_l + width))
        .step_by(16)
        .find_map(|off| {
            let raw = &stack[off + cf_l..off + cf_l + width];
            let state = match l.is_gc64() {
                true => u64::from_le_bytes(raw.try_into().unwrap()),
                false => u64::from(u32::from_le_bytes(raw.try_into().unwrap())),
            };
            if state == 0 || state & 7 != 0 || state >> 47 != 0 {
                return None;
            }
            let cf = sample.regs.sp + off as u64;
            if read_u64(mem, state + u64::from(l.l_cframe)).is_none_or(|c| c & !3 != cf) {
                return None;
            }
            let g = read_ref(mem, l, state + u64::from(l.l_glref))?;
            validates(mem, l, g + u64::from(l.g2disp), code)
        })
}

/// Reads a proto's chunk name and line table, checking that it still is the proto BPF
/// saw (the same chunk name, first line, line count and size).
/// (the same key before and after the reads: a VM that frees it meanwhile, and another
/// proto put there, fail it).
pub fn read_proto(mem: &File, l: &Offsets, f: &RawLuaFrame) -> Option<LuaProto> {
    let pt = f.ptr;
    if !has_key(mem, l, f) || f.sizebc > MAX_SIZEBC {
        return None;
    }
    let len = read_u32(mem, f.chunkname + u64::from(l.str_len))? as usize;
    let mut text = vec![0u8; len.min(MAX_CHUNKNAME)];
    mem.read_exact_at(&mut text, f.chunkname + u64::from(l.str_data))
        .ok()?;
    let lineinfo = read_ref(mem, l, pt + u64::from(l.pt_lineinfo))?;
    let proto = LuaProto {
        pid: 0,
        id: 0,
        chunkname: String::from_utf8_lossy(&text).into_owned(),
        firstline: f.firstline,
        numline: f.numline,
        lines: read_lines(mem, lineinfo, f.firstline, f.numline, f.sizebc),
        callee_names: callee_names(mem, l, pt, f.sizebc).unwrap_or_default(),
    };
    has_key(mem, l, f).then_some(proto)
}

/// Whether the proto at frame `f`'s address has the frame's key: its size, chunk name and
/// lines, and the chunk name's identity, read as BPF reads them (ebpf/luajit.h,
/// lj_proto_key).
fn has_key(mem: &File, l: &Offsets, f: &RawLuaFrame) -> bool {
    let pt = f.ptr;
    let key = (|| {
        let chunkname = read_ref(mem, l, pt + u64::from(l.pt_chunkname))?;
        let id = read_u64(mem, chunkname + u64::from(l.str_hash))?;
        Some((
            chunkname,
            read_u32(mem, pt + u64::from(l.pt_firstline))? as i32,
            read_u32(mem, pt + u64::from(l.pt_numline))?,
            read_u32(mem, pt + u64::from(l.pt_sizebc))?,
            (id as u32) ^ ((id >> 32) as u32),
        ))
    })();
    key == Some((f.chunkname, f.firstline, f.numline, f.sizebc, f.name_id))
}

/// The names the proto's calls give their callees (see [`crate::lua::luajit_bytecode`]),
/// read from the proto's block (bytecode, uvinfo and varinfo live in it) and its string
/// constants.
fn callee_names(mem: &File, l: &Offsets, pt: u64, sizebc: u32) -> Option<Vec<(u32, String)>> {
    if [l.pt_sizept, l.pt_k, l.pt_uvinfo, l.pt_varinfo].contains(&ABSENT) {
        return None;
    }
    let sizept = read_u32(mem, pt + u64::from(l.pt_sizept))? as usize;
    let bc_end = l.pt_size as usize + sizebc as usize * 4;
    if sizept < bc_end || sizept > 16 << 20 {
        return None;
    }
    let mut block = vec![0u8; sizept];
    mem.read_exact_at(&mut block, pt).ok()?;
    let bc: Vec<u32> = block[l.pt_size as usize..bc_end]
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
        let len = read_u32(mem, s + u64::from(l.str_len))? as usize;
        if len > 256 {
            return None;
        }
        let mut text = vec![0u8; len];
        mem.read_exact_at(&mut text, s + u64::from(l.str_data))
            .ok()?;
        Some(String::from_utf8_lossy(&text).into_owned())
    };
    let proto = crate::lua::luajit_bytecode::Proto {
        bc: &bc,
        kstr: &kstr,
        uvinfo: inside(l.pt_uvinfo),
        varinfo: inside(l.pt_varinfo),
        fr2: l.is_gc64(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use lrec_inspect::lua::luajit::releases::known;

    /// A GC32 VM's memory in a sparse file (addresses are offsets): the sampled frame's
    /// function returned long ago (another function, whose bytecode does not hold the
    /// sample's PC, runs at its base now), and its caller, a main loop, still runs.
    #[test]
    fn a_returned_function_is_proved_by_its_caller() {
        let l = known("upstream-gc32").unwrap().offsets;
        let mem = crate::lua::test_memory("proof");
        let put = |addr: u64, bytes: &[u8]| mem.write_all_at(bytes, addr).unwrap();
        // A Lua function at `func` whose proto (chunk name "@main.lua") has `sizebc`
        // instructions at `bc`.
        let function = |func: u64, bc: u64, sizebc: u32| {
            let pt = bc - u64::from(l.pt_size);
            put(func + l.gct(), &[GCT_FUNC]);
            put(func + u64::from(l.fn_ffid), &[0]);
            put(func + u64::from(l.fn_pc), &(bc as u32).to_le_bytes());
            put(pt + l.gct(), &[GCT_PROTO]);
            put(pt + u64::from(l.pt_sizebc), &sizebc.to_le_bytes());
            put(pt + u64::from(l.pt_firstline), &1u32.to_le_bytes());
            put(pt + u64::from(l.pt_numline), &10u32.to_le_bytes());
            let name = pt + 0x800;
            put(pt + u64::from(l.pt_chunkname), &(name as u32).to_le_bytes());
            put(name + l.gct(), &[GCT_STR]);
            put(name + u64::from(l.str_len), &9u32.to_le_bytes());
            put(name + u64::from(l.str_data), b"@main.lua\0");
        };
        let (main, main_bc) = (0x10_000, 0x20_000);
        let (now, now_bc) = (0x30_000, 0x40_000);
        function(main, main_bc, 40);
        function(now, now_bc, 40);
        // The main loop's frame (base 0x1010), its call at instruction 5 with A = 2: the
        // callee's frame lies 1 + 2 slots above, its link the return PC.
        let ret = main_bc + 4 * 6;
        put(ret - 4, &(2u32 << 8).to_le_bytes());
        put(0x1008, &(main as u32).to_le_bytes());
        let base = 0x1010 + 8 * 3;
        put(base - 8, &(now as u32).to_le_bytes());
        put(base - 4, &(ret as u32).to_le_bytes());
        // The sample ran at a PC in neither function's bytecode.
        let gone = 0x50_000 + 8;
        assert_eq!(proof_from(&mem, &l, base, Some(gone)), Some(true));
        // A caller whose proto is no proto contradicts the layout.
        put(main_bc - u64::from(l.pt_size) + l.gct(), &[0]);
        assert_eq!(proof_from(&mem, &l, base, Some(gone)), Some(false));
        // The sampled function's own proto, holding the PC, decides first.
        assert_eq!(proof_from(&mem, &l, base, Some(now_bc + 8)), Some(true));
    }
}
