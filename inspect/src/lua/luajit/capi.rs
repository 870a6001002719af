//! Offsets read from LuaJIT's C API, evaluated symbolically ([`crate::eval`]): the
//! interpreter never reads a prototype's chunk name or lines, but `lua_getinfo` does, and
//! `lua_close` reads the main thread. Shared libraries export the API, and so does the
//! `luajit` executable (it is linked with `-Wl,-E`); a stripped host that exports nothing
//! has only the interpreter's code.
//!
//! `lua_Debug` is public ABI: `source` at 32, `short_src` at 56 on x86_64.

use crate::elf::Code;
use crate::eval::{evaluate, Event, Expr, Op, Options};

use crate::lua::evidence::Facts;

const AR_SOURCE: i64 = 32;
const AR_SHORT_SRC: i64 = 56;
/// LuaJIT's own `lj_Debug` extends lua_Debug with `nparams` and `isvararg`.
const AR_ISVARARG: i64 = 124;

/// Whether `e` is a function's bytecode pointer, `[fn + fn.pc]`.
fn is_pc(e: &Expr, fn_pc: i64) -> bool {
    matches!(e.as_load(), Some((Some(_), k, _)) if k == fn_pc)
}

/// `[P + c]` with P a bytecode pointer: c (relative to the bytecode, i.e. to the end of
/// the GCproto).
fn from_pc(e: &Expr, fn_pc: i64) -> Option<(i64, u8)> {
    let (base, c, size) = e.as_load()?;
    is_pc(base?, fn_pc).then_some((c, size))
}

/// Reads what `lua_getinfo` (and the `lj_debug_line` it calls) and `lua_close` say.
/// `fn_pc` and `glref` come from the interpreter's code.
pub fn facts(code: &Code, fn_pc: i64, glref: i64, f: &mut Facts) {
    if let Some((start, _)) = code.symbol("lua_getinfo") {
        getinfo(code, start, fn_pc, f);
    }
    if let Some((start, _)) = code.symbol("lua_close") {
        close(code, start, glref, f);
    }
}

fn getinfo(code: &Code, start: u64, fn_pc: i64, f: &mut Facts) {
    const SRC: &str = "lua_getinfo's code";
    let opts = Options {
        inline_depth: 1,
        ..Options::default()
    };
    let ar = Expr::Arg(2).offset(0);
    let events = evaluate(code, start, &[], opts);
    // Offsets relative to the bytecode, then sizeof(GCproto) from the argument that
    // lj_debug_line (or any callee taking the proto) is given: bytecode - sizeof.
    let mut chunkname = None;
    let mut firstline = None;
    let mut flags = None;
    let mut line_fn = None;
    for e in &events {
        match e {
            // ar->source = strdata(proto_chunkname(pt))
            Event::Store { addr, value, .. } if *addr == ar.clone().offset(AR_SOURCE) => {
                let (Some(name), data) = value.split() else {
                    continue;
                };
                if let Some((c, _)) = from_pc(name, fn_pc) {
                    chunkname = Some(c);
                    f.set("str.data", data, SRC);
                }
            }
            // ar->isvararg = !!(pt->flags & PROTO_VARARG): a byte of the proto, masked.
            Event::Store { addr, value, .. } if *addr == ar.clone().offset(AR_ISVARARG) => {
                let mut v = value;
                while let Expr::Bin(Op::And | Op::Shr, a, _) = v {
                    v = a;
                }
                if let Some((c, 1)) = from_pc(v, fn_pc) {
                    flags = Some(c);
                }
            }
            Event::Call { args, target, .. } => {
                // lj_debug_shortname(ar->short_src, name, pt->firstline)
                if args.first() == Some(&ar.clone().offset(AR_SHORT_SRC)) {
                    if let Some((c, 4)) = args.get(2).and_then(|a| from_pc(a, fn_pc)) {
                        firstline = Some(c);
                    }
                }
                // lj_debug_line(pt, pc): pt = bytecode - sizeof(GCproto)
                if let (Some((Some(p), k)), Some(t)) = (args.first().map(Expr::split), target) {
                    if is_pc(p, fn_pc) && (-1024..-16).contains(&k) && line_fn.is_none() {
                        line_fn = Some((*t, -k));
                    }
                }
            }
            _ => {}
        }
    }
    let Some((line_fn, size)) = line_fn else {
        return;
    };
    let lines = debug_line(code, line_fn);
    // Only the function that reads lines as lj_debug_line does proves the proto's size.
    let Some(lines) = lines else {
        return;
    };
    f.set("pt.size", size, SRC);
    if let Some(c) = chunkname {
        f.set("pt.chunkname", c + size, SRC);
    }
    if let Some(c) = firstline {
        f.set("pt.firstline", c + size, SRC);
    }
    if let Some(c) = flags {
        f.set("pt.flags", c + size, SRC);
    }
    const LINE: &str = "lj_debug_line's code";
    f.set("pt.lineinfo", lines.lineinfo, LINE);
    f.set("pt.sizebc", lines.sizebc, LINE);
    f.set("pt.numline", lines.numline, LINE);
    f.set("pt.firstline", lines.firstline, LINE);
}

/// What `lj_debug_line(GCproto *pt, BCPos pc)` reads of pt.
struct Lines {
    lineinfo: i64,
    sizebc: i64,
    numline: i64,
    firstline: i64,
}

/// `lj_debug_line`: `if (pc <= pt->sizebc && lineinfo) { first = pt->firstline; … if
/// (pt->numline < 256) return first + ((uint8_t *)lineinfo)[pc-1]; …`. None unless the
/// function at `start` reads all four fields that way.
fn debug_line(code: &Code, start: u64) -> Option<Lines> {
    let events = evaluate(code, start, &[], Options::default());
    let pt = Expr::Arg(0);
    let field = |e: &Expr, size: u8| -> Option<i64> {
        match e.as_load()? {
            (Some(b), k, s) if *b == pt && s == size => Some(k),
            _ => None,
        }
    };
    let mut sizebc = None;
    let mut numline = None;
    let mut lineinfo = None;
    let mut firstline = None;
    for e in &events {
        match e {
            Event::Compare {
                a, b, test: false, ..
            } => {
                let (x, y) = (a, b);
                for (v, other) in [(x, y), (y, x)] {
                    if let Some(k) = field(v, 4) {
                        if *other == Expr::Arg(1) {
                            sizebc = Some(k);
                        } else if matches!(
                            other,
                            Expr::Const(0xff | 0xfe | 0x100 | 0xffff | 0xfffe | 0x10000)
                        ) {
                            numline = Some(k);
                        }
                    }
                }
            }
            Event::Load { addr, .. } => {
                // ((uint8_t *)lineinfo)[pc-1]: a load through the lineinfo pointer.
                if let Expr::Bin(Op::Add, base, _) = addr.split().0.unwrap_or(addr) {
                    if let Some(k) = field(base, 8).or_else(|| field(base, 4)) {
                        lineinfo = Some(k);
                    }
                }
            }
            Event::Return {
                value: Expr::Bin(Op::Add, a, b),
                ..
            } => {
                for v in [a, b] {
                    if let Some(k) = field(v, 4) {
                        if Some(k) != numline {
                            firstline = firstline.or(Some(k));
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Some(Lines {
        lineinfo: lineinfo?,
        sizebc: sizebc?,
        numline: numline?,
        firstline: firstline?,
    })
}

/// `lua_close(L)`: `g = G(L); L = mainthread(g); …; lj_func_closeuv(L, tvref(L->stack))`.
fn close(code: &Code, start: u64, glref: i64, f: &mut Facts) {
    let events = evaluate(code, start, &[], Options::default());
    let g = Expr::load(Expr::Arg(0).offset(glref), 8);
    let g32 = Expr::load(Expr::Arg(0).offset(glref), 4);
    for e in &events {
        let Event::Call { args, .. } = e else {
            continue;
        };
        let (Some(l), Some(stack)) = (args.first(), args.get(1)) else {
            continue;
        };
        let Some((Some(base), mainthref, _)) = l.as_load() else {
            continue;
        };
        let stack_of_l = matches!(stack.as_load(), Some((Some(b), _, _)) if b == l);
        if (*base == g || *base == g32) && stack_of_l {
            f.set("g.mainthref", mainthref, "lua_close's code");
            return;
        }
    }
}
