//! The names PUC Lua's calls give their callees, as ldebug.c's `funcnamefromcode` derives
//! them for tracebacks: from the instruction that loaded the called register (a global or
//! field name, a method, an upvalue, a local), or the metamethod an instruction triggers.
//!
//! Conservative where Lua itself is not: the loading instruction is looked for backwards
//! from the call without crossing a jump, so code whose value may come from elsewhere
//! gets no name rather than a wrong one.

/// A proto's code and the names it holds, read from the live process.
pub struct Code {
    /// 501 … 505.
    pub version: u32,
    pub code: Vec<u32>,
    /// String constants (None for other constants).
    pub k: Vec<Option<String>>,
    pub upvalues: Vec<Option<String>>,
    /// Local variables: name, first and last+1 instruction where the variable is active.
    pub locvars: Vec<(String, u32, u32)>,
}

/// Instruction fields of one release.
struct Format {
    op_bits: u32,
    a_shift: u32,
    b_shift: u32,
    c_shift: u32,
    b_bits: u32,
    /// 5.1–5.3: B and C name a constant when this bit is set (RK operands).
    rk_const: u32,
}

const OLD: Format = Format {
    op_bits: 6,
    a_shift: 6,
    b_shift: 23,
    c_shift: 14,
    b_bits: 9,
    rk_const: 1 << 8,
};

const NEW: Format = Format {
    op_bits: 7,
    a_shift: 7,
    b_shift: 16,
    c_shift: 24,
    b_bits: 8,
    rk_const: 0,
};

/// Opcode numbers of one release (u8::MAX when the release has none).
struct Ops {
    mov: u32,
    getupval: u32,
    getglobal: u32,
    gettabup: u32,
    gettable: u32,
    getfield: u32,
    selfop: u32,
    jmp: u32,
    call: u32,
    tailcall: u32,
    /// Instructions that write no register A (stores, tests, jumps, returns): passed over.
    no_write: &'static [u32],
    /// (opcode, metamethod) of the instructions that call one.
    meta: &'static [(u32, &'static str)],
}

const NONE: u32 = u32::MAX;

const OPS51: Ops = Ops {
    mov: 0,
    getupval: 4,
    getglobal: 5,
    gettabup: NONE,
    gettable: 6,
    getfield: NONE,
    selfop: 11,
    jmp: 22,
    call: 28,
    tailcall: 29,
    no_write: &[7, 8, 9, 22, 23, 24, 25, 26, 30, 34, 35],
    meta: &[
        (6, "__index"),
        (11, "__index"),
        (7, "__newindex"),
        (9, "__newindex"),
        (12, "__add"),
        (13, "__sub"),
        (14, "__mul"),
        (15, "__div"),
        (16, "__mod"),
        (17, "__pow"),
        (18, "__unm"),
        (20, "__len"),
        (21, "__concat"),
        (23, "__eq"),
        (24, "__lt"),
        (25, "__le"),
        (33, "for iterator"),
    ],
};

const OPS52: Ops = Ops {
    mov: 0,
    getupval: 5,
    getglobal: NONE,
    gettabup: 6,
    gettable: 7,
    getfield: NONE,
    selfop: 12,
    jmp: 23,
    call: 29,
    tailcall: 30,
    no_write: &[8, 9, 10, 23, 24, 25, 26, 27, 31, 36, 39],
    meta: &[
        (6, "__index"),
        (7, "__index"),
        (12, "__index"),
        (8, "__newindex"),
        (10, "__newindex"),
        (13, "__add"),
        (14, "__sub"),
        (15, "__mul"),
        (16, "__div"),
        (17, "__mod"),
        (18, "__pow"),
        (19, "__unm"),
        (21, "__len"),
        (22, "__concat"),
        (24, "__eq"),
        (25, "__lt"),
        (26, "__le"),
        (34, "for iterator"),
    ],
};

const OPS53: Ops = Ops {
    mov: 0,
    getupval: 5,
    getglobal: NONE,
    gettabup: 6,
    gettable: 7,
    getfield: NONE,
    selfop: 12,
    jmp: 30,
    call: 36,
    tailcall: 37,
    no_write: &[8, 9, 10, 30, 31, 32, 33, 34, 38, 43, 46],
    meta: &[
        (6, "__index"),
        (7, "__index"),
        (12, "__index"),
        (8, "__newindex"),
        (10, "__newindex"),
        (13, "__add"),
        (14, "__sub"),
        (15, "__mul"),
        (16, "__mod"),
        (17, "__pow"),
        (18, "__div"),
        (19, "__idiv"),
        (20, "__band"),
        (21, "__bor"),
        (22, "__bxor"),
        (23, "__shl"),
        (24, "__shr"),
        (25, "__unm"),
        (26, "__bnot"),
        (28, "__len"),
        (29, "__concat"),
        (31, "__eq"),
        (32, "__lt"),
        (33, "__le"),
        (41, "for iterator"),
    ],
};

/// 5.4 and 5.5 share these numbers (5.5 appends opcodes after OP_VARARG and swaps
/// OP_SHLI/OP_SHRI, named by OP_MMBINI's operand anyway).
const OPS54: Ops = Ops {
    mov: 0,
    getupval: 9,
    getglobal: NONE,
    gettabup: 11,
    gettable: 12,
    getfield: 14,
    selfop: 20,
    jmp: 56,
    call: 68,
    tailcall: 69,
    no_write: &[
        10, 15, 16, 17, 18, 46, 47, 48, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 70, 71,
        72, 78,
    ],
    meta: &[
        (11, "__index"),
        (12, "__index"),
        (13, "__index"),
        (14, "__index"),
        (20, "__index"),
        (15, "__newindex"),
        (16, "__newindex"),
        (17, "__newindex"),
        (18, "__newindex"),
        (49, "__unm"),
        (50, "__bnot"),
        (52, "__len"),
        (53, "__concat"),
        (57, "__eq"),
        (60, "__eq"),
        (61, "__eq"),
        (58, "__lt"),
        (62, "__lt"),
        (64, "__lt"),
        (59, "__le"),
        (63, "__le"),
        (65, "__le"),
        (54, "__close"),
        (70, "__close"),
        (76, "for iterator"),
    ],
};

/// 5.4's metamethods in TMS order (ltm.h), which OP_MMBIN* name by their C operand.
const TMS54: &[&str] = &[
    "__index",
    "__newindex",
    "__gc",
    "__mode",
    "__len",
    "__eq",
    "__add",
    "__sub",
    "__mul",
    "__mod",
    "__pow",
    "__div",
    "__idiv",
    "__band",
    "__bor",
    "__bxor",
    "__shl",
    "__shr",
    "__unm",
    "__bnot",
    "__lt",
    "__le",
    "__concat",
    "__call",
    "__close",
];

fn release(version: u32) -> (&'static Format, &'static Ops) {
    match version {
        501 => (&OLD, &OPS51),
        502 => (&OLD, &OPS52),
        503 => (&OLD, &OPS53),
        _ => (&NEW, &OPS54),
    }
}

/// The name each calling position of `c` gives its callee, sorted by position.
pub fn callee_names(c: &Code) -> Vec<(u32, String)> {
    let (f, ops) = release(c.version);
    let op = |i: u32| i & ((1 << f.op_bits) - 1);
    let mut names = Vec::new();
    for (pc, &i) in c.code.iter().enumerate() {
        let o = op(i);
        let name = if o == ops.call || o == ops.tailcall {
            object_name(c, f, ops, pc, field(i, f.a_shift, 8))
        } else if c.version >= 504 && (46..=48).contains(&o) {
            // OP_MMBIN, OP_MMBINI, OP_MMBINK: the metamethod is operand C.
            TMS54
                .get(field(i, f.c_shift, 8) as usize)
                .map(|s| s.to_string())
        } else {
            ops.meta
                .iter()
                .find(|(m, _)| *m == o)
                .map(|(_, n)| n.to_string())
        };
        if let Some(n) = name {
            names.push((pc as u32, n));
        }
    }
    names
}

fn field(i: u32, shift: u32, bits: u32) -> u32 {
    (i >> shift) & ((1 << bits) - 1)
}

/// The name of the value register `reg` holds at instruction `pc` (getobjname).
fn object_name(c: &Code, f: &Format, ops: &Ops, pc: usize, reg: u32) -> Option<String> {
    if let Some(local) = local_name(c, pc, reg) {
        return Some(local);
    }
    let op = |i: u32| i & ((1 << f.op_bits) - 1);
    // The instruction that loaded the register, not crossing a jump.
    let (at, i) = c.code[..pc]
        .iter()
        .enumerate()
        .rev()
        .map(|(p, &i)| (p, i))
        .find(|&(_, i)| {
            op(i) == ops.jmp || (field(i, f.a_shift, 8) == reg && !ops.no_write.contains(&op(i)))
        })?;
    let o = op(i);
    let b = field(i, f.b_shift, f.b_bits);
    let cc = field(i, f.c_shift, if f.rk_const != 0 { 9 } else { 8 });
    let constant = |idx: u32| c.k.get(idx as usize).cloned().flatten();
    // 5.1–5.3: an RK operand names a constant when its top bit is set.
    let rk = |x: u32| {
        if f.rk_const != 0 && x & f.rk_const != 0 {
            constant(x & !f.rk_const)
        } else {
            None
        }
    };
    match o {
        _ if o == ops.jmp => None,
        _ if o == ops.mov => (b < reg).then(|| object_name(c, f, ops, at, b)).flatten(),
        _ if o == ops.getupval => c.upvalues.get(b as usize).cloned().flatten(),
        _ if o == ops.getglobal => constant(field(i, f.c_shift, 18)),
        _ if o == ops.gettabup || o == ops.getfield => {
            if f.rk_const != 0 {
                rk(cc)
            } else {
                constant(cc)
            }
        }
        _ if o == ops.gettable => rk(cc),
        _ if o == ops.selfop => {
            if f.rk_const != 0 {
                rk(cc)
            } else if field(i, 15, 1) == 1 {
                // 5.4: k flag, C is a constant.
                constant(cc)
            } else {
                None
            }
        }
        _ => None,
    }
}

/// The local variable in register `reg` at instruction `pc` (luaF_getlocalname: the
/// registers of the locals active there are numbered in order).
fn local_name(c: &Code, pc: usize, reg: u32) -> Option<String> {
    let mut n = reg + 1;
    for (name, start, end) in &c.locvars {
        if *start as usize > pc {
            break;
        }
        if (pc as u32) < *end {
            n -= 1;
            if n == 0 {
                return Some(name.clone());
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 5.4 iABC: C(8) B(8) k(1) A(8) op(7).
    fn abc(op: u32, a: u32, b: u32, c: u32, k: u32) -> u32 {
        op | a << 7 | k << 15 | b << 16 | c << 24
    }

    #[test]
    fn names_5_4_calls_by_upvalue_global_field_method_and_metamethod() {
        let code = Code {
            version: 504,
            code: vec![
                abc(9, 0, 0, 0, 0),  // 0 GETUPVAL R0 U0 (hot)
                abc(68, 0, 1, 1, 0), // 1 CALL R0
                abc(11, 0, 1, 0, 0), // 2 GETTABUP R0 U1 K0 ("print")
                abc(68, 0, 1, 1, 0), // 3 CALL R0
                abc(14, 0, 1, 1, 0), // 4 GETFIELD R0 R1 K1 ("run")
                abc(68, 0, 1, 1, 0), // 5 CALL R0
                abc(20, 0, 1, 1, 1), // 6 SELF R0 R1 K1 ("run")
                abc(68, 0, 2, 1, 0), // 7 CALL R0
                abc(46, 0, 1, 6, 0), // 8 MMBIN __add
                abc(56, 0, 0, 0, 0), // 9 JMP
                abc(68, 0, 1, 1, 0), // 10 CALL R0 after a jump: no name
                abc(68, 1, 1, 1, 0), // 11 CALL R1, a local
            ],
            k: vec![Some("print".into()), Some("run".into())],
            upvalues: vec![Some("hot".into()), Some("_ENV".into())],
            locvars: vec![("a".into(), 0, 20), ("f".into(), 0, 20)],
        };
        let names = callee_names(&code);
        let want: Vec<(u32, String)> = [
            (1, "hot"),
            (2, "__index"),
            (3, "print"),
            (4, "__index"),
            (5, "run"),
            (6, "__index"),
            (7, "run"),
            (8, "__add"),
            (11, "f"),
        ]
        .iter()
        .map(|(p, n)| (*p, n.to_string()))
        .collect();
        // R0 is the local `a` everywhere: locals win, as in Lua.
        assert_eq!(names.iter().find(|n| n.0 == 1).unwrap().1, "a");
        let without_locals = Code {
            locvars: vec![],
            ..code
        };
        let names = callee_names(&without_locals);
        assert_eq!(
            names
                .iter()
                .filter(|(p, _)| *p != 11)
                .cloned()
                .collect::<Vec<_>>(),
            want.into_iter()
                .filter(|(p, _)| *p != 11)
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn names_5_1_globals_and_rk_fields() {
        // 5.1: op(6) A(8) C(9) B(9); GETGLOBAL A Bx.
        let abc = |op: u32, a: u32, b: u32, c: u32| op | a << 6 | c << 14 | b << 23;
        let code = Code {
            version: 501,
            code: vec![
                5 | 2 << 6,               // GETGLOBAL R2 K0 ("hot")
                abc(28, 2, 2, 1),         // CALL R2
                abc(6, 2, 1, 1 << 8 | 1), // GETTABLE R2 R1 K1 ("run")
                abc(28, 2, 1, 1),         // CALL R2
                abc(12, 0, 1, 2),         // ADD: __add
            ],
            k: vec![Some("hot".into()), Some("run".into())],
            upvalues: vec![],
            locvars: vec![],
        };
        let names = callee_names(&code);
        assert_eq!(
            names,
            vec![
                (1, "hot".to_string()),
                (2, "__index".to_string()),
                (3, "run".to_string()),
                (4, "__add".to_string())
            ]
        );
    }
}
