//! Names of called functions, from LuaJIT bytecode, as `lj_debug_funcname` derives them:
//! a function has no name of its own; the instruction that called it says how the callee
//! was fetched (`global 'f'`, `field 'f'`, `method 'f'`, `upvalue 'f'`, `local 'f'`), and
//! a metamethod is named by the instruction that triggered it (`__add`, `__index`). lrec
//! computes, once per proto, the name each of its calling instructions gives its callee.

/// Opcodes of LuaJIT 2.1 (lj_bc.h, BCDEF order) that the derivation looks at.
mod op {
    pub const MOV: u8 = 18;
    pub const UGET: u8 = 45;
    pub const GGET: u8 = 54;
    pub const TGETS: u8 = 57;
    pub const CALLM: u8 = 65;
    pub const ITERC: u8 = 69;
    pub const ITERN: u8 = 70;
    pub const KNIL: u8 = 44;
}

/// Operand A of these opcodes is a destination (BCMdst).
fn a_is_dst(o: u8) -> bool {
    matches!(o, 12 | 13 | 18..=43 | 45 | 51..=54 | 56..=59 | 89..=95)
}

/// Operand A of these opcodes is a base of several slots (BCMbase).
fn a_is_base(o: u8) -> bool {
    matches!(o, 44 | 63 | 65..=73 | 77..=84)
}

/// The metamethod each opcode may trigger (lj_bc.h, the BCDEF mm column), by opcode.
fn metamethod(op: u8) -> Option<&'static str> {
    Some(match op {
        0 | 1 => "__lt",
        2 | 3 => "__le",
        4..=11 => "__eq",
        20 => "__unm",
        21 => "__len",
        22 | 27 | 32 => "__add",
        23 | 28 | 33 => "__sub",
        24 | 29 | 34 => "__mul",
        25 | 30 | 35 => "__div",
        26 | 31 | 36 => "__mod",
        37 => "__pow",
        38 => "__concat",
        54 | 56..=59 => "__index",
        55 | 60..=64 => "__newindex",
        51..=53 => "__gc",
        _ => return None,
    })
}

/// Names of LuaJIT's internal local variables (lj_debug.c, VARNAMEDEF order).
const INTERNAL_VARS: &[&str] = &[
    "(for index)",
    "(for limit)",
    "(for step)",
    "(for generator)",
    "(for state)",
    "(for control)",
];

fn op(ins: u32) -> u8 {
    ins as u8
}
fn a(ins: u32) -> u32 {
    (ins >> 8) & 0xff
}
fn b(ins: u32) -> u32 {
    ins >> 24
}
fn c(ins: u32) -> u32 {
    (ins >> 16) & 0xff
}
fn d(ins: u32) -> u32 {
    ins >> 16
}

/// What name derivation reads of one proto.
pub struct Proto<'a> {
    /// The bytecode, header instruction first.
    pub bc: &'a [u32],
    /// `proto_kgc(pt, ~idx)` as a string, when it is one.
    pub kstr: &'a dyn Fn(u32) -> Option<String>,
    /// The upvalue names (uvinfo), NUL-separated; empty when stripped.
    pub uvinfo: &'a [u8],
    /// The compressed local variable info (varinfo); empty when stripped.
    pub varinfo: &'a [u8],
    /// Frame link slots between a call's base and its function (1 + LJ_FR2).
    pub fr2: bool,
}

/// For each bytecode position that calls a function or may trigger a metamethod, the name
/// the callee gets there (`hot`, `run`, `__add`), in order. Positions without one are
/// left out.
pub fn callee_names(pt: &Proto) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for (pos, &ins) in pt.bc.iter().enumerate().skip(1) {
        let o = op(ins);
        let name = if (op::CALLM..=op::ITERN).contains(&o) {
            let slot = if o == op::ITERC {
                a(ins).wrapping_sub(3)
            } else {
                a(ins)
            };
            slot_name(pt, pos, slot).map(|(_, name)| name)
        } else {
            metamethod(o).map(str::to_string)
        };
        if let Some(n) = name {
            out.push((pos as u32, n));
        }
    }
    out
}

/// lj_debug_slotname: how `slot` got its value before position `pos`.
fn slot_name(pt: &Proto, pos: usize, mut slot: u32) -> Option<(&'static str, String)> {
    let mut at = pos;
    'restart: loop {
        if let Some(name) = var_name(pt.varinfo, at as u32, slot) {
            return Some(("local", name));
        }
        let mut i = at;
        while i > 1 {
            i -= 1;
            let ins = pt.bc[i];
            let o = op(ins);
            if a_is_base(o) {
                // A call or multi-slot op clobbered the slot: no name.
                if slot >= a(ins) && (o != op::KNIL || slot <= d(ins)) {
                    return None;
                }
                continue;
            }
            if !a_is_dst(o) || a(ins) != slot {
                continue;
            }
            match o {
                op::MOV => {
                    slot = d(ins);
                    at = i;
                    continue 'restart;
                }
                op::GGET => return (pt.kstr)(d(ins)).map(|n| ("global", n)),
                op::TGETS => {
                    let name = (pt.kstr)(c(ins))?;
                    let prev = pt.bc[i - 1];
                    let self_slot = a(ins) + 1 + u32::from(pt.fr2);
                    if i > 1 && op(prev) == op::MOV && a(prev) == self_slot && d(prev) == b(ins) {
                        return Some(("method", name));
                    }
                    return Some(("field", name));
                }
                op::UGET => return uv_name(pt.uvinfo, d(ins)).map(|n| ("upvalue", n)),
                _ => return None,
            }
        }
        return None;
    }
}

fn uv_name(uvinfo: &[u8], idx: u32) -> Option<String> {
    let name = uvinfo.split(|&b| b == 0).nth(idx as usize)?;
    (!name.is_empty()).then(|| String::from_utf8_lossy(name).into_owned())
}

fn uleb128(p: &[u8], at: &mut usize) -> Option<u32> {
    let mut v = 0u32;
    let mut shift = 0;
    loop {
        let byte = *p.get(*at)?;
        *at += 1;
        v |= u32::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(v);
        }
        shift += 7;
        if shift > 28 {
            return None;
        }
    }
}

/// lj_debug_varname: the local variable in `slot` live at `pc`.
fn var_name(varinfo: &[u8], pc: u32, mut slot: u32) -> Option<String> {
    let mut at = 0;
    let mut lastpc = 0u32;
    loop {
        let vn = *varinfo.get(at)?;
        let start = at;
        if vn == 0 {
            return None;
        }
        if usize::from(vn) > INTERNAL_VARS.len() {
            while *varinfo.get(at)? != 0 {
                at += 1;
            }
        }
        let name_end = at;
        at += 1;
        let startpc = lastpc + uleb128(varinfo, &mut at)?;
        lastpc = startpc;
        if startpc > pc {
            return None;
        }
        let endpc = startpc + uleb128(varinfo, &mut at)?;
        if pc < endpc {
            if slot == 0 {
                return Some(match INTERNAL_VARS.get(usize::from(vn).wrapping_sub(1)) {
                    Some(n) if usize::from(vn) <= INTERNAL_VARS.len() => n.to_string(),
                    _ => String::from_utf8_lossy(&varinfo[start..name_end]).into_owned(),
                });
            }
            slot -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ins(o: u8, a: u32, d: u32) -> u32 {
        u32::from(o) | (a << 8) | (d << 16)
    }

    #[test]
    fn globals_fields_methods_and_metamethods() {
        let bc = [
            0,                    // FUNCF header
            ins(op::GGET, 2, 0),  // 1: slot2 = _G[k0] ("hot")
            ins(66, 2, 0),        // 2: CALL slot2
            ins(op::TGETS, 3, 1), // 3: slot3 = slot0.k1 ("run"), B=0 C=1
            ins(66, 3, 0),        // 4: CALL slot3
            ins(op::MOV, 5, 0),   // 5: slot5 = slot0 (self)
            ins(op::TGETS, 3, 1), // 6: slot3 = slot0.k1
            ins(66, 3, 0),        // 7: CALL slot3 (method)
            ins(32, 1, 0),        // 8: ADDVV
        ];
        let k = |i: u32| Some(["hot", "run"][i as usize].to_string());
        let pt = Proto {
            bc: &bc,
            kstr: &k,
            uvinfo: b"",
            varinfo: b"",
            fr2: true,
        };
        let names = callee_names(&pt);
        assert_eq!(
            names,
            [
                (1, "__index".to_string()),
                (2, "hot".to_string()),
                (3, "__index".to_string()),
                (4, "run".to_string()),
                (6, "__index".to_string()),
                (7, "run".to_string()),
                (8, "__add".to_string()),
            ]
        );
    }

    #[test]
    fn locals_come_from_varinfo() {
        // One variable "f" live from pc 1 to 5 in slot 0.
        let varinfo = b"f\0\x01\x04\0";
        assert_eq!(var_name(varinfo, 2, 0).as_deref(), Some("f"));
        assert_eq!(var_name(varinfo, 2, 1), None);
        assert_eq!(var_name(varinfo, 6, 0), None);
        assert_eq!(uv_name(b"a\0bb\0", 1).as_deref(), Some("bb"));
    }
}
