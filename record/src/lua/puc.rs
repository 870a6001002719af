//! PUC Lua 5.1–5.5 in the target: tells the release from the version string its library
//! carries, finds its `luaV_execute` (whose native frames the Lua frames replace), and
//! holds the layout of each release for the BPF walker (ebpf/puc.h). Line tables come
//! from BPF's copy of each proto.
//!
//! Layouts are those of x86_64 builds with the default luaconf.h, measured by compiling
//! each release's headers (offsetof). A build with another luaconf (LUA_32BITS) or
//! patched structures (skynet's strings) is not among them.

use std::path::Path;

use lrec_inspect::elf;

use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::lua::check::Pages;
use crate::lua::puc_names::Code;
use crate::lua::{read_u32, read_u64};
use crate::raw::{
    puc_rule, puc_strings, RawLuaFrame, RawLuaProto, RawPucConfig, LUA_LINEINFO, PUC_ABS_AT,
};

/// One PUC Lua release's layout.
#[derive(Debug, Clone, Copy)]
pub struct Release {
    pub minor: u32,
    /// Patch releases this layout covers, inclusive.
    pub patches: (u32, u32),
    pub abi: RawPucConfig,
}

impl Release {
    pub fn name(&self) -> String {
        match self.patches {
            (a, b) if a == b => format!("lua-5.{}.{a}", self.minor),
            (a, b) => format!("lua-5.{}.{a}-{b}", self.minor),
        }
    }
}

/// The walker's configuration of a 5.2–5.5 release: what they share, and each one's
/// offsets (see ebpf/sample.h for the fields). Tags as a TValue holds them (variant bits,
/// and bit 6 on collectable values): Lua closure 0x46, C closure 0x66, light C function
/// 0x16, thread 0x48.
struct Offsets {
    version: u32,
    rule: u32,
    /// CIST_FRESH (or CIST_REENTRY), CIST_TAIL, and the size of ci->callstatus.
    cist: (u32, u32, u32),
    /// lua_State: status, base_ci, errorJmp; global_State: mainthread.
    state: (u32, u32, u32, u32),
    /// CallInfo: u.l.savedpc, callstatus.
    ci: (u32, u32),
    /// sizeof lua_State, CallInfo, Proto.
    sizes: (u32, u32, u32),
    /// Proto: source, linedefined, lastlinedefined, code, sizecode, lineinfo,
    /// sizelineinfo, abslineinfo, sizeabslineinfo.
    proto: [u32; 9],
    strings: u32,
}

const fn config(o: Offsets) -> RawPucConfig {
    RawPucConfig {
        version: o.version,
        fresh_rule: o.rule,
        cist_fresh: o.cist.0,
        cist_tail: o.cist.1,
        callstatus_size: o.cist.2,
        l_g: 24,
        l_ci: 32,
        l_status: o.state.0,
        l_base_ci: o.state.1,
        l_savedpc: 0,
        l_errorjmp: o.state.2,
        g_mainthread: o.state.3,
        ci_func: 0,
        ci_previous: 16,
        ci_savedpc: o.ci.0,
        ci_callstatus: o.ci.1,
        ci_size: o.sizes.1,
        tag_lcl: 0x46,
        tag_ccl: 0x66,
        tag_lcf: 0x16,
        tag_thread: 0x48,
        cl_isc: 0,
        cl_p: 24,
        ccl_f: 24,
        ccl_upvalue: 32,
        p_source: o.proto[0],
        p_linedefined: o.proto[1],
        p_lastlinedefined: o.proto[2],
        p_code: o.proto[3],
        p_sizecode: o.proto[4],
        p_lineinfo: o.proto[5],
        p_sizelineinfo: o.proto[6],
        p_abslineinfo: o.proto[7],
        p_sizeabslineinfo: o.proto[8],
        strings: o.strings,
        str_len: 16,
        str_shrlen: 11,
        str_data: 24,
        op_call: 0,
        op_tailcall: 0,
        l_size: o.sizes.0,
        p_size: o.sizes.2,
        ci_tailcalls: 0,
        pad: 0,
    }
}

/// Lua 5.1.5: CallInfos are an array, without flags (luaV_execute goes on in the same
/// native frame for OP_CALL and OP_TAILCALL of a Lua function only); every function is a
/// closure (Closure.isC tells C from Lua); the running function's pc is in L->savedpc.
const V51: RawPucConfig = RawPucConfig {
    version: 501,
    fresh_rule: puc_rule::OPCODE,
    cist_fresh: 0,
    cist_tail: 0,
    callstatus_size: 1,
    l_g: 32,
    l_ci: 40,
    l_status: 10,
    l_base_ci: 80,
    l_savedpc: 48,
    l_errorjmp: 168,
    g_mainthread: 176,
    ci_func: 8,
    ci_previous: 0,
    ci_savedpc: 24,
    ci_callstatus: 0,
    ci_size: 40,
    tag_lcl: 6,
    tag_ccl: 6,
    tag_lcf: 0xff,
    tag_thread: 8,
    cl_isc: 10,
    cl_p: 32,
    ccl_f: 32,
    ccl_upvalue: 40,
    p_source: 64,
    p_linedefined: 96,
    p_lastlinedefined: 100,
    p_code: 24,
    p_sizecode: 80,
    p_lineinfo: 40,
    p_sizelineinfo: 84,
    p_abslineinfo: 0,
    p_sizeabslineinfo: 0,
    strings: puc_strings::LEN,
    str_len: 16,
    str_shrlen: 0,
    str_data: 24,
    op_call: 28,
    op_tailcall: 29,
    l_size: 184,
    p_size: 120,
    ci_tailcalls: 36,
    pad: 0,
};

/// 5.4 and 5.5 Protos.
const PROTO_54: [u32; 9] = [112, 44, 48, 64, 24, 88, 28, 96, 40];

/// A 5.4 release: its rule, CIST_FRESH and CIST_TAIL, lua_State's base_ci and errorJmp,
/// global_State's mainthread, and sizeof(lua_State).
const fn v54(rule: u32, cist: (u32, u32), state: (u32, u32, u32), l_size: u32) -> RawPucConfig {
    config(Offsets {
        version: 504,
        rule,
        cist: (cist.0, cist.1, 2),
        state: (10, state.0, state.1, state.2),
        ci: (32, 62),
        sizes: (l_size, 64, 128),
        proto: PROTO_54,
        strings: puc_strings::SHORT_LONG,
    })
}

/// The layouts known, by release (measured on each release's sources; Debian's builds
/// checked against their debug info).
pub const RELEASES: &[Release] = &[
    Release {
        minor: 1,
        patches: (5, 5),
        abi: V51,
    },
    Release {
        minor: 2,
        patches: (4, 4),
        abi: config(Offsets {
            version: 502,
            rule: puc_rule::REENTRY,
            cist: (4, 64, 1),
            state: (10, 128, 112, 264),
            ci: (56, 34),
            sizes: (208, 80, 128),
            proto: [72, 104, 108, 24, 88, 40, 92, 0, 0],
            strings: puc_strings::LEN,
        }),
    },
    Release {
        minor: 3,
        patches: (6, 6),
        abi: config(Offsets {
            version: 503,
            rule: puc_rule::FRESH,
            cist: (8, 32, 2),
            state: (12, 96, 88, 200),
            ci: (40, 66),
            sizes: (208, 72, 120),
            proto: [104, 40, 44, 56, 24, 72, 28, 0, 0],
            strings: puc_strings::SHORT_LONG,
        }),
    },
    // 5.4.0 and 5.4.1 recurse into luaV_execute for every Lua call; 5.4.1 and 5.4.2 lack
    // tbclist.
    Release {
        minor: 4,
        patches: (0, 0),
        abi: v54(puc_rule::ALL, (0, 16), (96, 88, 256), 200),
    },
    Release {
        minor: 4,
        patches: (1, 1),
        abi: v54(puc_rule::ALL, (0, 16), (88, 80, 264), 192),
    },
    Release {
        minor: 4,
        patches: (2, 2),
        abi: v54(puc_rule::FRESH, (4, 32), (88, 80, 264), 192),
    },
    Release {
        minor: 4,
        patches: (3, 9),
        abi: v54(puc_rule::FRESH, (4, 32), (96, 88, 264), 200),
    },
    // 5.5: the main thread is inside global_State (g_mainthread is its offset).
    Release {
        minor: 5,
        patches: (0, 1),
        abi: config(Offsets {
            version: 505,
            rule: puc_rule::FRESH,
            cist: (1 << 16, 1 << 22, 4),
            state: (11, 96, 88, 1416),
            ci: (32, 60),
            sizes: (208, 64, 128),
            proto: PROTO_54,
            strings: puc_strings::V55,
        }),
    },
];

/// The layout of release 5.`minor`.`patch`, if known.
pub fn release(minor: u32, patch: u32) -> Option<Release> {
    RELEASES
        .iter()
        .find(|r| r.minor == minor && (r.patches.0..=r.patches.1).contains(&patch))
        .copied()
}

/// Where a binary's `luaV_execute` lies (SVMA), and how it was found: its own symbols,
/// those of its separate debug file (Debian's `-dbg` packages, by build-id), or, in a
/// stripped binary, the dispatch table of its release's opcodes that only the interpreter
/// loop holds ([`lrec_inspect::lua::detect::puc_execute`]). `Err` says why it was not found.
pub fn find_execute(
    data: &[u8],
    binary: &lrec_format::Binary,
    minor: u32,
    debug_dir: &Path,
) -> Result<(u64, u64, &'static str), String> {
    if let Some((s, e)) = elf::function_symbol(data, "luaV_execute") {
        return Ok((s, e, "its symbol"));
    }
    if let Some(debug) = crate::embedder::separate_debug_file(debug_dir, binary) {
        if let Some((s, e)) = elf::function_symbol(&debug.data, "luaV_execute") {
            return Ok((s, e, "the debug file's symbol"));
        }
    }
    lrec_inspect::lua::detect::puc_execute(data, binary, minor)
        .map(|(s, e)| (s, e, "its opcode dispatch table"))
}

/// Proto fields only names need (read by lrec, not BPF): the constants, upvalue names and
/// local variables, and their counts.
struct NameFields {
    k: u64,
    sizek: u64,
    upvalues: u64,
    sizeupvalues: u64,
    locvars: u64,
    sizelocvars: u64,
    /// Bytes per upvalue entry: a TString* (5.1) or an Upvaldesc whose name comes first.
    upvalue_size: u64,
}

fn name_fields(version: u32) -> NameFields {
    let f = |k, sizek, upvalues, sizeupvalues, locvars, sizelocvars, upvalue_size| NameFields {
        k,
        sizek,
        upvalues,
        sizeupvalues,
        locvars,
        sizelocvars,
        upvalue_size,
    };
    match version {
        501 => f(16, 76, 56, 72, 48, 92, 8),
        502 => f(16, 84, 56, 80, 48, 100, 16),
        503 => f(48, 20, 88, 16, 80, 36, 16),
        _ => f(56, 20, 80, 16, 104, 36, 16),
    }
}

/// Most instructions, constants and variables of a proto read for names.
const MAX_READ: u32 = 1 << 20;

/// An array of `n` entries of `size` bytes at the pointer stored at `field`.
fn read_array(mem: &File, field: u64, n: u32, size: usize) -> Option<Vec<u8>> {
    if n > MAX_READ {
        return None;
    }
    let mut b = vec![0u8; n as usize * size];
    if n > 0 {
        mem.read_exact_at(&mut b, read_u64(mem, field)?).ok()?;
    }
    Some(b)
}

/// A TString's text, as ebpf/puc.h reads it.
fn read_string(mem: &File, abi: &RawPucConfig, s: u64) -> Option<String> {
    if s == 0 {
        return None;
    }
    let mut h = [0u8; 24];
    mem.read_exact_at(&mut h, s).ok()?;
    let (tt, shr) = (h[8], h[11]);
    let lng = u64::from_le_bytes(h[16..24].try_into().ok()?);
    let (len, text) = match abi.strings {
        puc_strings::LEN => (lng, s + 24),
        puc_strings::SHORT_LONG if tt & 0x30 != 0 => (lng, s + 24),
        puc_strings::SHORT_LONG => (u64::from(shr), s + 24),
        _ if (shr as i8) >= 0 => (u64::from(shr), s + 24),
        _ => (lng, read_u64(mem, s + 24)?),
    };
    if len > 4096 {
        return None;
    }
    let mut b = vec![0u8; len as usize];
    mem.read_exact_at(&mut b, text).ok()?;
    Some(String::from_utf8_lossy(&b).into_owned())
}

/// Reads the code and names of the proto at `pt` in the live process, if it still is the
/// one a sample ran (same source string, first line and size).
/// Whether the proto frame `f` names (from a call site BPF remembered) is still the one at
/// its address: the same source, lines and size (the key BPF gives PUC protos). None when
/// it cannot be read.
pub fn proto_unchanged(
    mem: &mut Pages,
    pid: u32,
    abi: &RawPucConfig,
    f: &RawLuaFrame,
) -> Option<bool> {
    // The Proto's header, read at once.
    let mut hdr = [0u8; 256];
    mem.read(pid, f.ptr, hdr.get_mut(..abi.p_size as usize)?)
        .then_some(())?;
    let u32_at = |off: u32| u32::from_le_bytes(hdr[off as usize..][..4].try_into().unwrap());
    let source = u64::from_le_bytes(hdr[abi.p_source as usize..][..8].try_into().unwrap());
    Some(
        source == f.chunkname
            && u32_at(abi.p_linedefined) as i32 == f.firstline
            && u32_at(abi.p_lastlinedefined) == f.numline
            && u32_at(abi.p_sizecode) == f.sizebc,
    )
}

pub fn read_code(
    mem: &File,
    abi: &RawPucConfig,
    pt: u64,
    source: u64,
    linedefined: i32,
    sizecode: u32,
) -> Option<Code> {
    let u64_at = |off: u32| read_u64(mem, pt + u64::from(off));
    let u32_at = |off: u64| read_u32(mem, pt + off);
    if u64_at(abi.p_source)? != source
        || u32_at(u64::from(abi.p_linedefined))? as i32 != linedefined
        || u32_at(u64::from(abi.p_sizecode))? != sizecode
    {
        return None;
    }
    let nf = name_fields(abi.version);
    let code = read_array(mem, pt + u64::from(abi.p_code), sizecode, 4)?
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    // String constants: 5.1 tags strings 4; later releases 0x44 (short) and 0x54 (long).
    let k = read_array(mem, pt + nf.k, u32_at(nf.sizek)?, 16)?
        .chunks_exact(16)
        .map(|tv| {
            let tt = tv[8];
            let is_string = if abi.version == 501 {
                tt == 4
            } else {
                tt & 0x0f == 4
            };
            let p = u64::from_le_bytes(tv[..8].try_into().ok()?);
            is_string.then(|| read_string(mem, abi, p)).flatten()
        })
        .collect();
    let size = nf.upvalue_size as usize;
    let upvalues = read_array(mem, pt + nf.upvalues, u32_at(nf.sizeupvalues)?, size)?
        .chunks_exact(size)
        .map(|u| read_string(mem, abi, u64::from_le_bytes(u[..8].try_into().ok()?)))
        .collect();
    let locvars = read_array(mem, pt + nf.locvars, u32_at(nf.sizelocvars)?, 16)?
        .chunks_exact(16)
        .filter_map(|v| {
            let name = read_string(mem, abi, u64::from_le_bytes(v[..8].try_into().ok()?))?;
            let start = u32::from_le_bytes(v[8..12].try_into().ok()?);
            let end = u32::from_le_bytes(v[12..16].try_into().ok()?);
            Some((name, start, end))
        })
        .collect();
    Some(Code {
        version: abi.version,
        code,
        k,
        upvalues,
        locvars,
    })
}

/// The source line of each instruction of a proto BPF copied (empty when its line table
/// was not copied whole), as luaG_getfuncline computes it.
pub fn lines(c: &RawLuaProto, abi: &RawPucConfig) -> Vec<u32> {
    let n = c.sizebc as usize;
    let raw = &c.lineinfo[..(c.lineinfo_len as usize).min(LUA_LINEINFO)];
    if abi.p_abslineinfo == 0 {
        // 5.1–5.3: an absolute line per instruction.
        if raw.len() != n * 4 {
            return Vec::new();
        }
        return raw
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
    }
    // 5.4+: a signed delta per instruction from the line before, and at every entry of
    // abslineinfo ({pc, line} pairs) an absolute line instead.
    if raw.len() != n {
        return Vec::new();
    }
    let abs_end = PUC_ABS_AT + (c.abs_len as usize).min(LUA_LINEINFO - PUC_ABS_AT);
    let mut abs = c.lineinfo[PUC_ABS_AT..abs_end].chunks_exact(8).map(|b| {
        (
            i32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            i32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        )
    });
    let mut next = abs.next();
    let mut line = c.firstline;
    raw.iter()
        .enumerate()
        .map(|(pc, &d)| {
            match next {
                Some((at, l)) if at as usize == pc => {
                    line = l;
                    next = abs.next();
                }
                _ => line += i32::from(d as i8),
            }
            line.max(0) as u32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proto(sizebc: u32, firstline: i32, lineinfo: &[u8], abs: &[(i32, i32)]) -> RawLuaProto {
        let mut p = RawLuaProto {
            tgid: 0,
            chunkname_len: 0,
            ptr: 0,
            chunkname: 0,
            firstline,
            numline: 0,
            sizebc,
            lineinfo_len: lineinfo.len() as u32,
            abs_len: (abs.len() * 8) as u32,
            name_id: 0,
            name: [0; crate::raw::LUA_CHUNKNAME],
            lineinfo: [0; LUA_LINEINFO],
        };
        p.lineinfo[..lineinfo.len()].copy_from_slice(lineinfo);
        for (i, (pc, line)) in abs.iter().enumerate() {
            let at = PUC_ABS_AT + 8 * i;
            p.lineinfo[at..at + 4].copy_from_slice(&pc.to_le_bytes());
            p.lineinfo[at + 4..at + 8].copy_from_slice(&line.to_le_bytes());
        }
        p
    }

    #[test]
    fn absolute_lines_of_5_1_to_5_3() {
        let raw: Vec<u8> = [3u32, 3, 4, 9]
            .iter()
            .flat_map(|l| l.to_le_bytes())
            .collect();
        let v53 = release(3, 6).unwrap().abi;
        assert_eq!(lines(&proto(4, 2, &raw, &[]), &v53), vec![3, 3, 4, 9]);
        // A line table not copied whole gives no lines rather than wrong ones.
        assert!(lines(&proto(5, 2, &raw, &[]), &v53).is_empty());
    }

    #[test]
    fn delta_lines_of_5_4_with_absolute_anchors() {
        // linedefined 10; deltas +1, 0, +2, then an anchor (ABSLINEINFO, -128) at pc 3
        // saying line 400, then -1.
        let deltas = [1u8, 0, 2, 0x80, 0xff];
        let v54 = release(4, 4).unwrap().abi;
        assert_eq!(
            lines(&proto(5, 10, &deltas, &[(3, 400)]), &v54),
            vec![11, 11, 13, 400, 399]
        );
    }

    #[test]
    fn releases_are_told_by_minor_and_patch() {
        assert_eq!(release(4, 4).unwrap().name(), "lua-5.4.3-9");
        assert_eq!(release(4, 0).unwrap().abi.fresh_rule, puc_rule::ALL);
        assert_eq!(release(5, 1).unwrap().abi.version, 505);
        assert!(release(3, 0).is_none());
        assert!(release(6, 0).is_none());
    }
}
