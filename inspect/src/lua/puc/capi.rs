//! Offsets read from PUC Lua's C API, evaluated symbolically ([`crate::eval`]). Shared
//! libraries export the API, and so do hosts linked with `-Wl,-E` (the `lua` executable,
//! redis, skynet); each function below reads a few fields and names them by what it does
//! with them. `lua_Debug` is public ABI, per release.

use crate::elf::Code;
use crate::eval::{evaluate, Event, Expr, Op, Options};
use crate::lua::evidence::Facts;

/// `lua_Debug`'s `source`, `linedefined`, `lastlinedefined`, `nparams` and `isvararg`, by
/// minor release (5.1 has no nparams).
fn ar_fields(minor: u32) -> (i64, i64, i64, Option<(i64, i64)>) {
    match minor {
        1 => (32, 48, 52, None),
        2 | 3 => (32, 44, 48, Some((53, 54))),
        _ => (32, 52, 56, Some((61, 62))),
    }
}

fn events(code: &Code, name: &str, depth: u32) -> Option<Vec<Event>> {
    let (start, _) = code.symbol(name)?;
    let opts = Options {
        inline_depth: depth,
        ..Options::default()
    };
    Some(evaluate(code, start, &[], opts))
}

/// `[base + k]` (any size) with `base` the given value: k.
fn field_of(e: &Expr, base: &Expr) -> Option<i64> {
    e.alternatives().iter().find_map(|a| a.load_from(base))
}

/// Reads every function of the API that tells a field.
pub fn facts(code: &Code, minor: u32, f: &mut Facts) {
    let l = Expr::Arg(0);
    gettop(code, &l, minor, f);
    status(code, &l, f);
    pushthread(code, &l, minor, f);
    tolstring(code, f);
    getstack(code, &l, minor, f);
    pcallk(code, &l, minor, f);
    error_jump(code, &l, f);
    getinfo(code, minor, f);
    tocfunction(code, f);
    upvalueid(code, f);
    if minor >= 2 {
        newstate(code, f);
    }
    newthread(code, f);
}

/// `lua_newthread`: a thread object of sizeof(LX) bytes, its lua_State `extra` bytes in
/// (5.4+: `luaC_newobjdt(L, LUA_TTHREAD, sizeof(LX), offsetof(LX, l))`; 5.3: the object's
/// address plus the offset is returned).
fn newthread(code: &Code, f: &mut Facts) {
    const SRC: &str = "lua_newthread's code";
    let events = events(code, "lua_newthread", 0).unwrap_or_default();
    for e in &events {
        let Event::Call { at, args, .. } = e else {
            continue;
        };
        let consts: Vec<i64> = args
            .iter()
            .map(|a| match a {
                Expr::Const(c) => *c,
                _ => -1,
            })
            .collect();
        // The type (LUA_TTHREAD, 8), then the size, then (5.4+) the offset.
        let Some(t) = consts
            .windows(2)
            .position(|w| w[0] == 8 && (64..1024).contains(&w[1]))
        else {
            continue;
        };
        let size = consts[t + 1];
        let extra = match consts.get(t + 2) {
            Some(&e) if (0..64).contains(&e) => Some(e),
            _ => events.iter().find_map(|r| match r {
                Event::Return { value, .. } => match value.split() {
                    (Some(Expr::Ret(c)), k) if c == at => Some(k),
                    _ => None,
                },
                _ => None,
            }),
        };
        if let Some(extra) = extra {
            f.set("L.extra", extra, SRC);
            f.set("L.size", size - extra, SRC);
            return;
        }
    }
}

/// `lua_newstate` (5.2+): `l = (*f)(ud, NULL, LUA_TTHREAD, sizeof(LG))`, then the main
/// thread and the global state set up in that block: `L->l_G = g`, `g->frealloc = f`,
/// `g->allgc = L` (5.2–5.4: LG holds the thread's LX, then global_State; 5.5: the
/// global state holds the main thread).
fn newstate(code: &Code, f: &mut Facts) {
    const SRC: &str = "lua_newstate's code";
    let Some(l_g) = f.get("L.G") else {
        return;
    };
    let events = events(code, "lua_newstate", 0).unwrap_or_default();
    let Some((block, size)) = events.iter().find_map(|e| match e {
        Event::Call {
            at,
            target: None,
            args,
        } => match (args.get(1), args.get(2), args.get(3)) {
            (Some(Expr::Const(0)), Some(Expr::Const(8)), Some(Expr::Const(s)))
                if (256..65536).contains(s) =>
            {
                Some((Expr::Ret(*at), *s))
            }
            _ => None,
        },
        _ => None,
    }) else {
        return;
    };
    // An offset in the block: its stores' addresses and values.
    let at = |e: &Expr| match e.split() {
        (Some(b), k) if *b == block => Some(k),
        _ if *e == block => Some(0),
        _ => None,
    };
    let stores: Vec<(i64, &Expr)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Store {
                addr,
                value,
                size: 8,
                ..
            } => Some((at(addr)?, value)),
            _ => None,
        })
        .collect();
    // L->l_G = g: the main thread at `l`, the global state at `g`. Where the state's
    // set-up is inlined (f_luaopen, luaS_init, luai_makeseed: a C++ build of all of Lua in
    // one unit), other stores have that shape too: the pair the others corroborate is
    // taken, `g->frealloc = f` and a pointer to the thread (g->mainthread, g->allgc)
    // both stored in the global state.
    let in_g = |a: i64, (l, g): (i64, i64)| match g > l {
        true => a >= g && a < size,
        false => a >= g && a < l,
    };
    let corroborated = |pair: (i64, i64)| {
        let frealloc = stores
            .iter()
            .any(|&(a, v)| *v == Expr::Arg(0) && in_g(a, pair));
        let thread = stores
            .iter()
            .any(|&(a, v)| at(v) == Some(pair.0) && in_g(a, pair));
        u32::from(frealloc) + u32::from(thread)
    };
    let candidates = stores
        .iter()
        .filter_map(|&(a, v)| Some((a - l_g, at(v)?)).filter(|&(l, g)| l >= 0 && g != l));
    // The first of the best corroborated (max_by_key keeps the last of equals).
    let Some((l, g)) = candidates.rev().max_by_key(|&pair| corroborated(pair)) else {
        return;
    };
    if g > l {
        f.set("L.extra", l, SRC);
        f.set("L.size", g - l, SRC);
        f.set("g.size", size - g, SRC);
    } else {
        f.set("g.mainthread", l - g, SRC);
        f.set("g.size", size, SRC);
    }
    let main = f.get("g.mainthread");
    for &(a, v) in &stores {
        if *v == Expr::Arg(0) {
            f.set("g.frealloc", a - g, SRC);
        }
        // g->allgc = L (and g->mainthread = L, before 5.5), not a field of L itself: a
        // field of global_State before its main thread (5.5), or after the thread (before).
        if at(v) == Some(l) && in_g(a, (l, g)) && Some(a - g) != main {
            f.set("g.allgc", a - g, SRC);
        }
        if *v == Expr::Const(size) && a > g {
            f.set("g.totalbytes", a - g, SRC);
        }
    }
}

/// `lua_tocfunction`: `return clCvalue(o)->f` for a C closure.
fn tocfunction(code: &Code, f: &mut Facts) {
    for e in events(code, "lua_tocfunction", 0).unwrap_or_default() {
        let Event::Return { value, .. } = e else {
            continue;
        };
        for v in value.alternatives() {
            if let Some((Some(cl), k, 8)) = v.as_load() {
                if matches!(cl, Expr::Load(..)) && (8..64).contains(&k) {
                    f.set("ccl.f", k, "lua_tocfunction's code");
                }
            }
        }
    }
}

/// `lua_upvalueid` (5.2+): for a C closure, `if (1 <= n && n <= f->nupvalues) return
/// &f->upvalue[n - 1]` (16-byte TValues): compilers fold the -1 into the constants.
fn upvalueid(code: &Code, f: &mut Facts) {
    const SRC: &str = "lua_upvalueid's code";
    let n = Expr::Arg(2);
    let events = events(code, "lua_upvalueid", 0).unwrap_or_default();
    for e in &events {
        match e {
            Event::Compare {
                a, b, test: false, ..
            } if *b == n => {
                if let Some((Some(cl), k, 1)) = a.as_load() {
                    if matches!(cl, Expr::Load(..)) {
                        f.set("cl.nupvalues", k, SRC);
                    }
                }
            }
            Event::Return { value, .. } => {
                for v in value.alternatives() {
                    let (Some(Expr::Bin(Op::Add, cl, scaled)), k) = v.split() else {
                        continue;
                    };
                    if !matches!(**cl, Expr::Load(..)) {
                        continue;
                    }
                    // (n + c) * 16, as a shift and a multiplication by 1 or alone.
                    let mut s = &**scaled;
                    if let Expr::Bin(Op::Mul, x, one) = s {
                        if **one == Expr::Const(1) {
                            s = x;
                        }
                    }
                    let index = match s {
                        Expr::Bin(Op::Shl, i, four) if **four == Expr::Const(4) => &**i,
                        Expr::Bin(Op::Mul, i, sixteen) if **sixteen == Expr::Const(16) => &**i,
                        _ => continue,
                    };
                    let c = match index.split() {
                        (Some(i), c) if *i == n => c,
                        _ => continue,
                    };
                    // The upvalues begin the closure's variable part.
                    f.set("ccl.upvalue", k + 16 * (c + 1), SRC);
                    f.set("ccl.size0", k + 16 * (c + 1), SRC);
                }
            }
            _ => {}
        }
    }
}

/// `lua_gettop`: `L->top - (L->ci->func + 1)` (5.1: `L->top - L->base`).
fn gettop(code: &Code, l: &Expr, minor: u32, f: &mut Facts) {
    const SRC: &str = "lua_gettop's code";
    for e in events(code, "lua_gettop", 0).unwrap_or_default() {
        let Event::Return { value, .. } = e else {
            continue;
        };
        let mut diff = &value;
        // Strip the division by the slot size and the -1.
        while let Expr::Bin(Op::Sar | Op::Shr, a, _) | Expr::Offset(a, _) = diff {
            diff = a;
        }
        let Expr::Bin(Op::Sub, top, base) = diff else {
            continue;
        };
        let Some(top) = top.load_from(l) else {
            continue;
        };
        f.set("L.top", top, SRC);
        if minor == 1 {
            return;
        }
        // ci->func + 1: [[L + ci] + func] + sizeof(StackValue)
        let (Some(func), _) = base.split() else {
            continue;
        };
        let Some((Some(ci), func_at, _)) = func.as_load() else {
            continue;
        };
        if let Some(ci_at) = ci.load_from(l) {
            f.set("L.ci", ci_at, SRC);
            f.set("ci.func", func_at, SRC);
        }
        return;
    }
}

/// `lua_status`: `return L->status`.
fn status(code: &Code, l: &Expr, f: &mut Facts) {
    for e in events(code, "lua_status", 0).unwrap_or_default() {
        if let Event::Return { value, .. } = e {
            if let Some((Some(b), k, 1)) = value.as_load() {
                if b == l {
                    f.set("L.status", k, "lua_status's code");
                    return;
                }
            }
        }
    }
}

/// `lua_pushthread`: `return (G(L)->mainthread == L)` (5.5: the main thread lies inside
/// global_State).
fn pushthread(code: &Code, l: &Expr, minor: u32, f: &mut Facts) {
    const SRC: &str = "lua_pushthread's code";
    for e in events(code, "lua_pushthread", 0).unwrap_or_default() {
        let Event::Compare {
            a, b, test: false, ..
        } = e
        else {
            continue;
        };
        let other = match (a == *l, b == *l) {
            (true, _) => b,
            (_, true) => a,
            _ => continue,
        };
        let (g, main) = match minor {
            5.. => match other.split() {
                (Some(g), k) => (g.clone(), k),
                _ => continue,
            },
            _ => match other.as_load() {
                Some((Some(g), k, 8)) => (g.clone(), k),
                _ => continue,
            },
        };
        if let Some(g_at) = g.load_from(l) {
            f.set("L.G", g_at, SRC);
            f.set("g.mainthread", main, SRC);
            return;
        }
    }
}

/// `lua_tolstring`: `if (len) *len = tsslen(ts); return getstr(ts)`: where the text and
/// (for long strings) the length are.
fn tolstring(code: &Code, f: &mut Facts) {
    const SRC: &str = "lua_tolstring's code";
    let len = Expr::Arg(2);
    for e in events(code, "lua_tolstring", 0).unwrap_or_default() {
        match e {
            Event::Return { value, .. } => {
                for v in value.alternatives() {
                    if let (Some(ts), data) = v.split() {
                        if matches!(ts, Expr::Load(..)) && (16..=64).contains(&data) {
                            f.set("s.data", data, SRC);
                        }
                    }
                }
            }
            Event::Store {
                addr,
                value,
                size: 8,
                ..
            } if addr == len => {
                // tsslen(ts): the byte shrlen of a short string, lnglen of a long one.
                for v in value.alternatives() {
                    match v.as_load() {
                        Some((Some(ts), k, 8))
                            if matches!(ts, Expr::Load(..)) && (8..64).contains(&k) =>
                        {
                            f.set("s.len", k, SRC)
                        }
                        Some((Some(ts), k, 1))
                            if matches!(ts, Expr::Load(..)) && (9..16).contains(&k) =>
                        {
                            f.set("s.shrlen", k, SRC)
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
}

/// `lua_getstack`: `for (ci = L->ci; level > 0 && ci != &L->base_ci; ci = ci->previous)`
/// (5.1: CallInfos are an array, `ci > L->base_ci`).
fn getstack(code: &Code, l: &Expr, minor: u32, f: &mut Facts) {
    const SRC: &str = "lua_getstack's code";
    let events = events(code, "lua_getstack", 0).unwrap_or_default();
    if minor == 1 {
        return getstack_51(&events, l, f);
    }
    for e in &events {
        let Event::Compare {
            a, b, test: false, ..
        } = e
        else {
            continue;
        };
        for (ci, base) in [(a, b), (b, a)] {
            let Some(ci_at) = field_of(ci, l) else {
                continue;
            };
            let base_at = match base.split() {
                (Some(b), k) if b == l => Some(k),
                _ => None,
            };
            if let Some(base_at) = base_at {
                f.set("L.ci", ci_at, SRC);
                f.set("L.base_ci", base_at, SRC);
            }
        }
    }
    let Some(ci_at) = f.get("L.ci") else {
        return;
    };
    let ci = Expr::load(l.clone().offset(ci_at), 8);
    // ci = ci->previous: a load through the current CallInfo, compared with &L->base_ci.
    for e in &events {
        if let Event::Compare { a, b, .. } = e {
            for v in a.alternatives().iter().chain(b.alternatives()) {
                if let Some(prev) = v.load_from(&ci) {
                    f.set("ci.previous", prev, SRC);
                }
            }
        }
    }
}

/// Lua 5.1's `lua_getstack`: `for (ci = L->ci; level > 0 && ci > L->base_ci; ci--)`: the
/// CallInfos are an array, and the loop steps down it by their size.
fn getstack_51(events: &[Event], l: &Expr, f: &mut Facts) {
    const SRC: &str = "lua_getstack's code";
    for e in events {
        let Event::Compare {
            a, b, test: false, ..
        } = e
        else {
            continue;
        };
        for (ci, base) in [(a, b), (b, a)] {
            let Some(base_at) = base.load_from(l) else {
                continue;
            };
            let stepped = ci.alternatives().iter().find_map(|v| match v.split() {
                (Some(c), k) if (-128..-16).contains(&k) => Some((c.load_from(l)?, -k)),
                _ => None,
            });
            if let Some((ci_at, size)) = stepped {
                f.set("L.ci", ci_at, SRC);
                f.set("L.base_ci", base_at, SRC);
                f.set("ci.size", size, SRC);
                return;
            }
        }
    }
}

/// `lua_pcallk` (5.2+): `ci->u.c.k = k; …; ci->callstatus |= CIST_YPCALL`. `u.c.k` shares
/// its place with `u.l.savedpc` in 5.2 (`c` = {ctx, k, …}, `l` = {base, savedpc}), 5.4 and
/// 5.5 (`l` = {savedpc, …}); in 5.3 `l` = {base, savedpc} and `c` = {k, …}: savedpc lies
/// one pointer past k.
fn pcallk(code: &Code, l: &Expr, minor: u32, f: &mut Facts) {
    let savedpc_past_k = match minor {
        3 => 8,
        _ => 0,
    };
    const SRC: &str = "lua_pcallk's code";
    let Some(ci_at) = f.get("L.ci") else {
        return;
    };
    let ci = Expr::load(l.clone().offset(ci_at), 8);
    for e in events(code, "lua_pcallk", 0).unwrap_or_default() {
        let Event::Store {
            addr, value, size, ..
        } = e
        else {
            continue;
        };
        let (Some(base), k) = addr.split() else {
            continue;
        };
        if *base != ci {
            continue;
        }
        if value == Expr::Arg(5) {
            f.set("ci.savedpc", k + savedpc_past_k, SRC);
        }
        if matches!(&value, Expr::Bin(Op::Or, _, c) if matches!(**c, Expr::Const(_))) {
            f.set("ci.callstatus", k, SRC);
            f.set("ci.callstatus_size", i64::from(size), SRC);
        }
    }
}

/// `luaD_rawrunprotected`, which `lua_resume` calls: `lj.previous = L->errorJmp;
/// L->errorJmp = &lj` (a `lua_longjmp` on its stack).
fn error_jump(code: &Code, l: &Expr, f: &mut Facts) {
    let calls = events(code, "lua_resume", 0).unwrap_or_default();
    for e in calls {
        let Event::Call {
            target: Some(t),
            args,
            ..
        } = e
        else {
            continue;
        };
        if args.first() != Some(l) {
            continue;
        }
        for e in evaluate(code, t, &[], Options::default()) {
            if let Event::Store {
                addr,
                value: Expr::Sp(_),
                size: 8,
                ..
            } = e
            {
                if let (Some(b), k) = addr.split() {
                    if *b == Expr::Arg(0) {
                        f.set("L.errorJmp", k, "luaD_rawrunprotected's code");
                        return;
                    }
                }
            }
        }
    }
}

/// `lua_getinfo`: `ar->source = getstr(p->source); ar->linedefined = p->linedefined;
/// ar->lastlinedefined = p->lastlinedefined` with `p = cl->l.p`.
fn getinfo(code: &Code, minor: u32, f: &mut Facts) {
    const SRC: &str = "lua_getinfo's code";
    let (source, linedefined, lastlinedefined, params) = ar_fields(minor);
    let ar = Expr::Arg(2);
    let events = events(code, "lua_getinfo", 1).unwrap_or_default();
    let mut proto: Option<Expr> = None;
    for e in &events {
        let Event::Store { addr, value, .. } = e else {
            continue;
        };
        if *addr != ar.clone().offset(source) {
            continue;
        }
        // getstr(p->source): [[cl + p] + source] + data (a short string's text; 5.5's long
        // strings point to theirs).
        for v in value.alternatives() {
            let (Some(s), data) = v.split() else {
                continue;
            };
            if data < 16 {
                continue;
            }
            let Some((Some(p), src, 8)) = s.as_load() else {
                continue;
            };
            let Some((Some(_), lcl_p, 8)) = p.as_load() else {
                continue;
            };
            f.set("lcl.p", lcl_p, SRC);
            f.set("p.source", src, SRC);
            if minor >= 3 {
                f.set("s.data", data, SRC);
            }
            proto = Some(p.clone());
        }
    }
    let Some(p) = proto else {
        return;
    };
    for e in &events {
        let Event::Store { addr, value, .. } = e else {
            continue;
        };
        let (nparams, isvararg) = params.unzip();
        // 5.5 keeps is_vararg as a bit of `flag`.
        let vararg = if minor >= 5 { "p.flag" } else { "p.is_vararg" };
        let name = match addr.split() {
            (Some(a), k) if *a == ar && k == linedefined => "p.linedefined",
            (Some(a), k) if *a == ar && k == lastlinedefined => "p.lastlinedefined",
            (Some(a), k) if *a == ar && Some(k) == nparams => "p.numparams",
            (Some(a), k) if *a == ar && Some(k) == isvararg => vararg,
            _ => continue,
        };
        // A byte flag may be masked or shifted first.
        let mut v = value;
        while let Expr::Bin(Op::And | Op::Shr, a, _) = v {
            v = a;
        }
        if let Some(k) = field_of(v, &p) {
            f.set(name, k, SRC);
        }
    }
}
