//! Proving a PUC Lua layout (learned from the binary, `lrec_inspect::lua::puc::learn`) on
//! the live process before BPF walks with it: a sample whose registers hold a running
//! `lua_State` (luaV_execute keeps L in one) must read, with this layout, as the VM
//! reads it: its global state's main thread points back to that state, and its chain of
//! CallInfos down to the base one holds functions, whose prototypes have a source that is
//! a string and a saved pc inside their code.

use std::fs::File;
use std::os::unix::fs::FileExt;

use lrec_format::Sample;
use lrec_inspect::lua::puc::{Layout, Strings};

use super::luajit::is_name;
use super::{read_u32, read_u64};

/// CallInfos followed at most: a chain read this deep proves as much as one read to its
/// base, and a short walk is more often read whole while the process runs on (a chain of
/// 200 calls that returns and is called again every 20 µs was read whole on 1 sample in
/// 200 at 64 frames, and on 1 in 4 at 8).
const MAX_FRAMES: usize = 8;
/// Longest source name read.
const MAX_SOURCE: u64 = 4096;
/// LUA_TTHREAD as a GC object's type byte.
const TT_THREAD: u8 = 8;

fn byte(mem: &File, addr: u64) -> Option<u8> {
    let mut b = [0u8];
    mem.read_exact_at(&mut b, addr).ok()?;
    Some(b[0])
}

fn user_ptr(p: u64) -> bool {
    p > 4096 && p < 1 << 47 && p & 7 == 0
}

/// Stack words looked at for a state when no register holds one (as BPF's walker does:
/// ebpf/puc_work.h, LREC_PUC_SCAN_WORDS): a build that keeps L on its stack in
/// luaV_execute (a C++ build at -O2) is proved too.
const SCAN_WORDS: usize = 64;

/// What sample `s` says of layout `l`: `Some(true)` when a register (or a word near the
/// top of its stack) holds a state whose chain reads as the VM's (with at least one Lua
/// function), `Some(false)` when a state was found but its chain does not read, `None`
/// when the sample tells nothing.
pub fn proof(mem: &File, l: &Layout, s: &Sample) -> Option<bool> {
    let r = &s.regs;
    let regs = [r.bx, r.bp, r.r12, r.r13, r.r14, r.r15, r.di, r.si];
    let stack = s
        .user_stack
        .chunks_exact(8)
        .take(SCAN_WORDS)
        .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
        .filter(|&p| user_ptr(p));
    let state = regs
        .into_iter()
        .chain(stack)
        .find(|&p| is_state(mem, l, p))?;
    chain(mem, l, state)
}

/// Whether `p` is a lua_State of this layout: a thread object whose global state's main
/// thread belongs to the same global state.
fn is_state(mem: &File, l: &Layout, p: u64) -> bool {
    let o = &l.offsets;
    let check = || -> Option<bool> {
        if !user_ptr(p) || byte(mem, p + 8)? != TT_THREAD {
            return Some(false);
        }
        let g = read_u64(mem, p + u64::from(o.l_g))?;
        if !user_ptr(g) {
            return Some(false);
        }
        let main = match l.rules.version {
            505.. => g + u64::from(o.g_mainthread),
            _ => read_u64(mem, g + u64::from(o.g_mainthread))?,
        };
        Some(user_ptr(main) && read_u64(mem, main + u64::from(o.l_g))? == g)
    };
    check().unwrap_or(false)
}

/// Reads the state's CallInfos down to its base one. The process runs on while they are
/// read: a frame may return under the reader (its function slot then holds a result) and
/// a CallInfo be reused by the next call. So a chain that stops reading tells nothing
/// unless a second reading stops at the same CallInfo, on the same function slot and
/// value, while the state stayed in its frame.
fn chain(mem: &File, l: &Layout, state: u64) -> Option<bool> {
    // A suspended coroutine (a register may hold one its resumer handles) is not running:
    // a C function that yielded left its CallInfo's function slot on the yielded values.
    if byte(mem, state + u64::from(l.offsets.l_status))? != 0 {
        return None;
    }
    let l_ci = state + u64::from(l.offsets.l_ci);
    let top = read_u64(mem, l_ci)?;
    match walk(mem, l, state, top)? {
        Walk::Read(lua) => Some(lua > 0).filter(|&ok| ok),
        broke => {
            let again = read_u64(mem, l_ci)? == top && walk(mem, l, state, top)? == broke;
            Some(false).filter(|_| again && read_u64(mem, l_ci) == Some(top))
        }
    }
}

#[derive(PartialEq)]
enum Walk {
    /// Down to the base CallInfo, with this many Lua functions.
    Read(usize),
    /// Stopped reading at this CallInfo, function slot and value.
    Broke(u64, u64, u64),
}

fn walk(mem: &File, l: &Layout, state: u64, top: u64) -> Option<Walk> {
    let (o, r) = (&l.offsets, &l.rules);
    let v51 = r.version == 501;
    let base = match v51 {
        true => read_u64(mem, state + u64::from(o.l_base_ci))?,
        false => state + u64::from(o.l_base_ci),
    };
    let mut ci = top;
    if ci == base {
        // Not inside a call: it tells nothing.
        return None;
    }
    let mut lua = 0;
    for depth in 0..MAX_FRAMES {
        if ci == base {
            return Some(Walk::Read(lua));
        }
        if !user_ptr(ci) {
            return Some(Walk::Broke(ci, 0, 0));
        }
        let func = read_u64(mem, ci + u64::from(o.ci_func))?;
        if !user_ptr(func) {
            return Some(Walk::Broke(ci, func, 0));
        }
        let value = read_u64(mem, func)?;
        let tt = u32::from(byte(mem, func + 8)?);
        let is_lua = match v51 {
            true => tt == r.tag_lcl && byte(mem, value + u64::from(o.cl_isc))? == 0,
            false => tt == r.tag_lcl,
        };
        if is_lua {
            // 5.1 keeps the running function's pc in the state.
            let savedpc = match (v51, depth) {
                (true, 0) => read_u64(mem, state + u64::from(o.l_savedpc))?,
                _ => read_u64(mem, ci + u64::from(o.ci_savedpc))?,
            };
            if !proto_reads(mem, l, value, savedpc)? {
                return Some(Walk::Broke(ci, func, value));
            }
            lua += 1;
        } else if tt != r.tag_ccl && tt != r.tag_lcf && !(v51 && tt == r.tag_lcl) {
            return Some(Walk::Broke(ci, func, value));
        }
        ci = match v51 {
            true => ci.checked_sub(u64::from(o.ci_size))?,
            false => read_u64(mem, ci + u64::from(o.ci_previous))?,
        };
    }
    Some(Walk::Read(lua))
}

/// Whether closure `cl`'s prototype reads as one: a source that is a string, lines in
/// order, and the saved pc inside its code.
fn proto_reads(mem: &File, l: &Layout, cl: u64, savedpc: u64) -> Option<bool> {
    let o = &l.offsets;
    let p = read_u64(mem, cl + u64::from(o.lcl_p))?;
    if !user_ptr(p) {
        return Some(false);
    }
    let code = read_u64(mem, p + u64::from(o.p_code))?;
    let sizecode = u64::from(read_u32(mem, p + u64::from(o.p_sizecode))?);
    let first = read_u32(mem, p + u64::from(o.p_linedefined))? as i32;
    let last = read_u32(mem, p + u64::from(o.p_lastlinedefined))? as i32;
    if !(savedpc >= code && savedpc <= code + 4 * sizecode) || first < 0 || last < first {
        return Some(false);
    }
    let source = read_u64(mem, p + u64::from(o.p_source))?;
    Some(source == 0 || string_reads(mem, l, source)?)
}

/// Whether `s` is a string object of this layout whose text reads as a name.
fn string_reads(mem: &File, l: &Layout, s: u64) -> Option<bool> {
    let o = &l.offsets;
    let tt = byte(mem, s + 8)?;
    if !user_ptr(s) || tt & 0x0f != 4 {
        return Some(false);
    }
    let long = || read_u64(mem, s + u64::from(o.s_len));
    let short = || byte(mem, s + u64::from(o.s_shrlen));
    let data = s + u64::from(o.s_data);
    let (len, text) = match l.rules.strings {
        Strings::Len => (long()?, data),
        Strings::ShortLong if tt & 0x30 != 0 => (long()?, data),
        Strings::ShortLong => (u64::from(short()?), data),
        Strings::V55 if (short()? as i8) >= 0 => (u64::from(short()?), data),
        Strings::V55 => (long()?, read_u64(mem, data)?),
    };
    if len > MAX_SOURCE {
        return Some(false);
    }
    let mut b = vec![0u8; len as usize];
    mem.read_exact_at(&mut b, text).ok()?;
    Some(is_name(&b))
}
