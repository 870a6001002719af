//! PUC Lua 5.1–5.5 in the target: finds its `luaV_execute` (whose native frames the Lua
//! frames replace), and reads its prototypes' names and lines with the build's layout
//! (`lrec_inspect::lua::puc`). Line tables come from BPF's copy of each proto.

use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::lua::puc_names::Code;
use crate::lua::{read_u32, read_u64};
use crate::raw::{RawLuaFrame, RawLuaProto, RawPucConfig, LUA_CHUNKNAME, LUA_LINEINFO, PUC_ABS_AT};
use lrec_inspect::lua::puc::{Layout, Strings};

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
fn read_string(mem: &File, l: &Layout, s: u64) -> Option<String> {
    if s == 0 {
        return None;
    }
    let o = &l.offsets;
    let tt = read_u32(mem, s + 8)? as u8;
    let shr = || read_u32(mem, s + u64::from(o.s_shrlen)).map(|v| v as u8);
    let lng = read_u64(mem, s + u64::from(o.s_len))?;
    let data = s + u64::from(o.s_data);
    let (len, text) = match l.rules.strings {
        Strings::Len => (lng, data),
        Strings::ShortLong if tt & 0x30 != 0 => (lng, data),
        Strings::ShortLong => (u64::from(shr()?), data),
        Strings::V55 if (shr()? as i8) >= 0 => (u64::from(shr()?), data),
        Strings::V55 => (lng, read_u64(mem, data)?),
    };
    if len > 4096 {
        return None;
    }
    let mut b = vec![0u8; len as usize];
    mem.read_exact_at(&mut b, text).ok()?;
    Some(String::from_utf8_lossy(&b).into_owned())
}

/// Reads the code and names of the proto frame `f` ran, in the live process, if it still
/// is that one before and after the reads: the same source string (named `chunkname`, as
/// BPF copied it), lines and size, and code that begins with the instructions BPF copied
/// (`head`) when the sample ran it. A proto freed before or during the reads keeps its
/// header's fields (an allocator overwrites a freed block's first bytes only), but not its
/// code's first instructions, nor when another takes the block: without `head` there is
/// no proof, and no read.
pub fn read_code(
    mem: &File,
    l: &Layout,
    f: &RawLuaFrame,
    chunkname: &str,
    head: &[u32],
) -> Option<Code> {
    let o = &l.offsets;
    let (pt, sizecode) = (f.ptr, f.sizebc);
    let version = l.rules.version;
    let u64_at = |off: u32| read_u64(mem, pt + u64::from(off));
    let u32_at = |off: u32| read_u32(mem, pt + u64::from(off));
    let has_key = || {
        u64_at(o.p_source) == Some(f.chunkname)
            && u32_at(o.p_linedefined).map(|v| v as i32) == Some(f.firstline)
            && u32_at(o.p_lastlinedefined) == Some(f.numline)
            && u32_at(o.p_sizecode) == Some(sizecode)
    };
    // A chunk name longer than BPF copies is not compared.
    let named =
        |s: Option<String>| chunkname.len() >= LUA_CHUNKNAME || s.as_deref() == Some(chunkname);
    let words = |n: u32| {
        Some(
            read_array(mem, pt + u64::from(o.p_code), n, 4)?
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect::<Vec<u32>>(),
        )
    };
    let proved = |code: &[u32]| !head.is_empty() && code.starts_with(head);
    if !has_key() || !named(read_string(mem, l, f.chunkname)) {
        return None;
    }
    let code = words(sizecode).filter(|c| proved(c))?;
    // String constants: 5.1 tags strings 4; later releases 0x44 (short) and 0x54 (long).
    let k = read_array(mem, pt + u64::from(o.p_k), u32_at(o.p_sizek)?, 16)?
        .chunks_exact(16)
        .map(|tv| {
            let tt = tv[8];
            let is_string = if version == 501 {
                tt == 4
            } else {
                tt & 0x0f == 4
            };
            let p = u64::from_le_bytes(tv[..8].try_into().ok()?);
            is_string.then(|| read_string(mem, l, p)).flatten()
        })
        .collect();
    let size = o.p_upvaldesc_size as usize;
    let upvalues = read_array(
        mem,
        pt + u64::from(o.p_upvalues),
        u32_at(o.p_sizeupvalues)?,
        size,
    )?
    .chunks_exact(size)
    .map(|u| read_string(mem, l, u64::from_le_bytes(u[..8].try_into().ok()?)))
    .collect();
    let locvars = read_array(
        mem,
        pt + u64::from(o.p_locvars),
        u32_at(o.p_sizelocvars)?,
        16,
    )?
    .chunks_exact(16)
    .filter_map(|v| {
        let name = read_string(mem, l, u64::from_le_bytes(v[..8].try_into().ok()?))?;
        let start = u32::from_le_bytes(v[8..12].try_into().ok()?);
        let end = u32::from_le_bytes(v[12..16].try_into().ok()?);
        Some((name, start, end))
    })
    .collect();
    let still = words(head.len() as u32).is_some_and(|c| proved(&c));
    (still && has_key()).then_some(Code {
        version,
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
    use crate::raw::LUA_CODE_HEAD;
    use lrec_inspect::lua::puc::releases::release;

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
            code_words: 0,
            code_head: [0; crate::raw::LUA_CODE_HEAD],
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

    /// A 5.4 proto `top(n) return mid(n) + 1 end` at 0x1000 in a file standing for the
    /// process's memory: its source string at 0x2000, code at 0x3000, upvalue names at
    /// 0x4000.
    fn memory_with_a_proto() -> (File, Layout, RawLuaFrame, Vec<u32>) {
        let l = release(4, 4).unwrap().layout();
        let o = l.offsets;
        let f = crate::lua::test_memory("puc-mem");
        let put = |at: u64, b: &[u8]| f.write_all_at(b, at).unwrap();
        let (pt, src, code, upv, mid) = (0x1000u64, 0x2000u64, 0x3000u64, 0x4000u64, 0x5000);
        // GETUPVAL 1 0; MOVE 2 0; CALL 1 2 2; ADDI; MMBINI; RETURN1; RETURN0.
        let words = [
            0x0000_0089u32,
            0x0000_0100,
            0x0202_00c4,
            0x8001_0095,
            0x0601_00af,
        ];
        for (s, text) in [(src, &b"top.lua"[..]), (mid, &b"mid"[..])] {
            put(s + 8, &[0x04]);
            put(s + u64::from(o.s_shrlen), &[text.len() as u8]);
            put(s + u64::from(o.s_data), text);
        }
        let field = |off: u32, v: &[u8]| put(pt + u64::from(off), v);
        field(o.p_source, &src.to_le_bytes());
        field(o.p_linedefined, &3u32.to_le_bytes());
        field(o.p_lastlinedefined, &3u32.to_le_bytes());
        field(o.p_sizecode, &(words.len() as u32).to_le_bytes());
        field(o.p_code, &code.to_le_bytes());
        field(o.p_sizeupvalues, &1u32.to_le_bytes());
        field(o.p_upvalues, &upv.to_le_bytes());
        put(upv, &mid.to_le_bytes());
        for (i, w) in words.iter().enumerate() {
            put(code + 4 * i as u64, &w.to_le_bytes());
        }
        let frame = RawLuaFrame {
            ptr: pt,
            chunkname: src,
            cframe: 0,
            firstline: 3,
            numline: 3,
            sizebc: words.len() as u32,
            pos: 2,
            ffid: 0,
            link: 0,
            check: 0,
            pad: 0,
            name_id: 0,
        };
        (f, l, frame, words.to_vec())
    }

    #[test]
    fn live_code_is_read_only_when_it_begins_as_the_sample_saw_it() {
        let (mem, l, f, words) = memory_with_a_proto();
        let m = &mem;
        let head = &words[..LUA_CODE_HEAD.min(words.len())];
        let code = read_code(m, &l, &f, "top.lua", head).expect("the proto is read");
        assert_eq!(code.code, words);
        assert_eq!(
            crate::lua::puc_names::callee_names(&code)[0],
            (2, "mid".to_string())
        );
        // No copy of the head: no proof, no read.
        assert!(read_code(m, &l, &f, "top.lua", &[]).is_none());
        // Freed: the allocator wrote its list pointer over the code's first instructions,
        // while the proto's header still reads as before.
        m.write_all_at(&0x5555_1234_5678u64.to_le_bytes(), 0x3000)
            .unwrap();
        assert!(read_code(m, &l, &f, "top.lua", head).is_none());
    }

    #[test]
    fn absolute_lines_of_5_1_to_5_3() {
        let raw: Vec<u8> = [3u32, 3, 4, 9]
            .iter()
            .flat_map(|l| l.to_le_bytes())
            .collect();
        let v53 = RawPucConfig::new(&release(3, 6).unwrap().layout());
        assert_eq!(lines(&proto(4, 2, &raw, &[]), &v53), vec![3, 3, 4, 9]);
        // A line table not copied whole gives no lines rather than wrong ones.
        assert!(lines(&proto(5, 2, &raw, &[]), &v53).is_empty());
    }

    #[test]
    fn delta_lines_of_5_4_with_absolute_anchors() {
        // linedefined 10; deltas +1, 0, +2, then an anchor (ABSLINEINFO, -128) at pc 3
        // saying line 400, then -1.
        let deltas = [1u8, 0, 2, 0x80, 0xff];
        let v54 = RawPucConfig::new(&release(4, 4).unwrap().layout());
        assert_eq!(
            lines(&proto(5, 10, &deltas, &[(3, 400)]), &v54),
            vec![11, 11, 13, 400, 399]
        );
    }
}
