//! Offsets read from LuaJIT's interpreter itself. buildvm generated its machine code from
//! the very headers that define the build's structures (vm_x64.dasc for GC64 builds,
//! vm_x86.dasc for the others), so its instructions carry the offsets as displacements.
//! The interpreter keeps fixed registers in every 2.1 build and fork: L:RB = rbp,
//! BASE = rdx, PC = rbx, DISPATCH = r14, KBASE = r15, RA = rcx, RC/RD = rax (their 32-bit
//! halves in GC32 builds). Each finder below names the dasc lines it reads.

use iced_x86::{Instruction, Mnemonic, OpKind, Register};

use crate::lua::evidence::Facts;

const RB: Register = Register::RBP;
const BASE: Register = Register::RDX;
const PC: Register = Register::RBX;
const DISPATCH: Register = Register::R14;
const KBASE: Register = Register::R15;
const RA: Register = Register::RCX;
const RD: Register = Register::RAX;

/// A memory operand `[base + disp]` (no index) of `size` bytes.
fn mem(i: &Instruction, op: u32) -> Option<(Register, i64, u32)> {
    (i.op_kind(op) == OpKind::Memory && i.memory_index() == Register::None).then(|| {
        (
            i.memory_base().full_register(),
            i.memory_displacement64() as i64,
            i.memory_size().size() as u32,
        )
    })
}

fn reg(i: &Instruction, op: u32) -> Option<Register> {
    (i.op_kind(op) == OpKind::Register).then(|| i.op_register(op).full_register())
}

fn imm(i: &Instruction, op: u32) -> Option<i64> {
    crate::x86::immediate(i, op)
}

/// `mov dst, [base + disp]`: disp.
fn load(i: &Instruction, dst: Register, base: Register) -> Option<i64> {
    if !matches!(i.mnemonic(), Mnemonic::Mov | Mnemonic::Movzx) || reg(i, 0)? != dst {
        return None;
    }
    let (b, d, _) = mem(i, 1)?;
    (b == base).then_some(d)
}

/// `mov [base + disp], src`: disp and size.
fn store(i: &Instruction, base: Register, src: Register) -> Option<(i64, u32)> {
    if i.mnemonic() != Mnemonic::Mov || reg(i, 1)? != src {
        return None;
    }
    let (b, d, size) = mem(i, 0)?;
    (b == base).then_some((d, size))
}

/// `mov [base + disp], imm`: disp, size and the immediate.
fn store_imm(i: &Instruction, base: Register) -> Option<(i64, u32, i64)> {
    if i.mnemonic() != Mnemonic::Mov {
        return None;
    }
    let (b, d, size) = mem(i, 0)?;
    (b == base).then_some((d, size, imm(i, 1)?))
}

/// The most frequent value, if any.
fn most<T: Ord + Copy>(mut v: Vec<T>) -> Option<T> {
    v.sort_unstable();
    let mut best = None;
    let mut run = 0;
    for (i, x) in v.iter().enumerate() {
        let n = v[i..].iter().take_while(|y| *y == x).count();
        if n > run && (i == 0 || v[i - 1] != *x) {
            run = n;
            best = Some(*x);
        }
    }
    best
}

/// Reads every fact the interpreter's code `ins` (its whole range, decoded) carries.
pub fn facts(ins: &[Instruction], f: &mut Facts) {
    const SRC: &str = "the VM's code";
    // vm_resume, vm_pcall, vm_call, vm_cpcall, vm_unwind_ff_eh:
    //   mov DISPATCH, L:RB->glref ; … ; add DISPATCH, GG_G2DISP
    let glref: Vec<(i64, i64, u32)> = ins
        .iter()
        .enumerate()
        .filter_map(|(n, i)| {
            let d = load(i, DISPATCH, RB)?;
            let size = mem(i, 1)?.2;
            let add = ins[n + 1..].iter().take(8).find(|j| {
                j.mnemonic() == Mnemonic::Add && reg(j, 0) == Some(DISPATCH) && imm(j, 1).is_some()
            })?;
            Some((d, imm(add, 1)?, size))
        })
        .collect();
    let Some((glref, g2disp, ref_size)) = most(glref) else {
        return;
    };
    let gc64 = ref_size == 8;
    let refsize = i64::from(ref_size);
    f.set("gc64", i64::from(gc64), SRC);
    f.set("L.glref", glref, SRC);
    f.set("g2disp", g2disp, SRC);
    // set_vmstate: mov dword [DISPATCH+DISPATCH_GL(vmstate)], ~LJ_VMST_*
    let vmstate = most(
        ins.iter()
            .filter_map(|i| store_imm(i, DISPATCH))
            .filter(|&(_, size, v)| size == 4 && (-8..=-1).contains(&v))
            .map(|(d, _, _)| d)
            .collect(),
    );
    let Some(vmstate) = vmstate else {
        return;
    };
    f.set("g.vmstate", vmstate + g2disp, SRC);
    let is_vmstate = |i: &Instruction| {
        store_imm(i, DISPATCH).is_some_and(|(d, size, v)| d == vmstate && size == 4 && v < 0)
    };
    // mov [DISPATCH+DISPATCH_GL(cur_L)], L:RB ; set_vmstate INTERP (vm_resume, vm_call,
    // after a C function returns in BC_FUNCC)
    let cur_l = most(
        ins.windows(2)
            .filter(|w| is_vmstate(&w[1]))
            .filter_map(|w| store(&w[0], DISPATCH, RB).map(|(d, _)| d))
            .collect(),
    );
    if let Some(d) = cur_l {
        f.set("g.cur_L", d + g2disp, SRC);
    }
    // vm_exit_interp: mov aword [DISPATCH+DISPATCH_GL(jit_base)], 0 (absent without a JIT)
    let jit_base = most(
        ins.iter()
            .filter_map(|i| store_imm(i, DISPATCH))
            .filter(|&(_, size, v)| i64::from(size) == refsize && v == 0)
            .map(|(d, _, _)| d)
            .collect(),
    );
    if let Some(d) = jit_base {
        f.set("g.jit_base", d + g2disp, SRC);
    }
    // BC_JLOOP: mov RA, [DISPATCH+DISPATCH_J(trace)] ; mov RA, [RA+RD*8] ;
    //           mov RD, TRACE:RA->mcode
    for w in ins.windows(3) {
        let (Some(d), Some((b, _, _))) = (load(&w[0], RA, DISPATCH), indexed(&w[1])) else {
            continue;
        };
        if b != RA {
            continue;
        }
        let dst = reg(&w[1], 0);
        if let Some((_, mcode, 8)) = mem(&w[2], 1).filter(|m| Some(m.0) == dst) {
            f.set("J.trace", d + g2disp, SRC);
            f.set("tr.mcode", mcode, SRC);
            break;
        }
    }
    funcc(ins, vmstate, refsize, f);
    entries(ins, gc64, f);
    proto(ins, gc64, f);
    ffi_callback(ins, g2disp, f);
    // ins_call: mov PC, LFUNC:RB->pc ; mov RAd, [PC] (then the dispatch on its opcode)
    let fn_pc = most(
        ins.windows(2)
            .filter(|w| mem(&w[1], 1).is_some_and(|(b, d, s)| b == PC && d == 0 && s == 4))
            .filter_map(|w| load(&w[0], PC, RB))
            .collect(),
    );
    if let Some(d) = fn_pc {
        f.set("fn.pc", d, SRC);
    }
    // BC_CALL*: cmp byte LFUNC:RB->ffid, 1 // (> FF_C) Calling a fast function?
    // (coroutine.resume's `cmp byte L:RB->status, LUA_YIELD` looks the same.)
    let status = f.get("L.status");
    let ffid = most(
        ins.iter()
            .filter(|i| i.mnemonic() == Mnemonic::Cmp && imm(i, 1) == Some(1))
            .filter_map(|i| mem(i, 0).filter(|&(b, _, s)| b == RB && s == 1))
            .map(|(_, d, _)| d)
            .filter(|&d| Some(d) != status)
            .collect(),
    );
    if let Some(d) = ffid {
        f.set("fn.ffid", d, SRC);
    }
    strings(ins, f);
    tables(ins, f);
}

/// A table lookup by string key (BC_TGETS and friends):
///   mov RCd, TAB:RB->hmask ; and RCd, STR:RC->sid ; imul RCd, #NODE ;
///   add NODE:RC, TAB:RB->node
fn tables(ins: &[Instruction], f: &mut Facts) {
    const SRC: &str = "the VM's code (table lookups)";
    for w in ins.windows(4) {
        let (Some((t, hmask, 4)), Some((_, hash, 4))) = (mem(&w[0], 1), mem(&w[1], 1)) else {
            continue;
        };
        let r = reg(&w[0], 0);
        let and = w[1].mnemonic() == Mnemonic::And && reg(&w[1], 0) == r;
        let node_size = (w[2].mnemonic() == Mnemonic::Imul && reg(&w[2], 0) == r)
            .then(|| imm(&w[2], 2))
            .flatten();
        let node = (w[3].mnemonic() == Mnemonic::Add && reg(&w[3], 0) == r)
            .then(|| mem(&w[3], 1))
            .flatten()
            .filter(|m| m.0 == t);
        if let (true, Some(n), Some((_, node, _))) = (and, node_size, node) {
            f.set("str.hash", hash, SRC);
            f.set("tab.hmask", hmask, SRC);
            f.set("node.size", n, SRC);
            f.set("tab.node", node, SRC);
            return;
        }
    }
}

/// `mov dst, [base + index*scale]`: (base, index, scale).
fn indexed(i: &Instruction) -> Option<(Register, Register, u32)> {
    (i.mnemonic() == Mnemonic::Mov
        && i.op_kind(1) == OpKind::Memory
        && i.memory_index() != Register::None)
        .then(|| {
            (
                i.memory_base().full_register(),
                i.memory_index().full_register(),
                i.memory_index_scale(),
            )
        })
}

/// BC_FUNCC, which calls a C function: the function's `f`, the state's base, top and
/// maxstack, and where the C frame keeps L.
///   mov CFUNC:RB, [BASE-16] ; (cleartp) ; mov KBASE, CFUNC:RB->f ; mov L:RB, SAVE_L ;
///   lea RD, [BASE+NARGS:RD*8-8] ; mov L:RB->base, BASE ; lea RA, [RD+8*LUA_MINSTACK] ;
///   cmp RA, L:RB->maxstack ; mov L:RB->top, RD ; … ; set_vmstate C ; call KBASE
fn funcc(ins: &[Instruction], vmstate: i64, refsize: i64, f: &mut Facts) {
    const SRC: &str = "the VM's code (BC_FUNCC)";
    for (n, i) in ins.iter().enumerate() {
        let is_call = i.mnemonic() == Mnemonic::Call && reg(i, 0) == Some(KBASE);
        if !is_call || n < 12 {
            continue;
        }
        let before = &ins[n - 12..n];
        let sets_c = before
            .iter()
            .any(|j| store_imm(j, DISPATCH).is_some_and(|(d, _, v)| d == vmstate && v == -2));
        let Some(k) = before.iter().position(|j| load(j, KBASE, RB).is_some()) else {
            continue;
        };
        if !sets_c {
            continue;
        }
        let fun = load(&before[k], KBASE, RB).unwrap();
        let rest = &before[k + 1..];
        let Some(save_l) = rest.iter().find_map(|j| {
            let (b, d, _) = mem(j, 1)?;
            (j.mnemonic() == Mnemonic::Mov && reg(j, 0) == Some(RB) && b == Register::RSP)
                .then_some(d)
        }) else {
            continue;
        };
        let base = rest.iter().find_map(|j| store(j, RB, BASE));
        let top = rest.iter().find_map(|j| store(j, RB, RD));
        let maxstack = rest.iter().find_map(|j| {
            (j.mnemonic() == Mnemonic::Cmp && reg(j, 0) == Some(RA))
                .then(|| mem(j, 1))
                .flatten()
                .filter(|m| m.0 == RB)
        });
        if let (Some((base, _)), Some((top, _)), Some((_, maxstack, _))) = (base, top, maxstack) {
            f.set("fn.f", fun, SRC);
            f.set("cf.L", save_l, SRC);
            f.set("L.base", base, SRC);
            f.set("L.top", top, SRC);
            f.set("L.maxstack", maxstack, SRC);
            let _ = refsize;
            return;
        }
    }
}

/// The VM's entries from C (vm_resume, vm_call, vm_cpcall), which set up its C frame:
///   saveregs ; mov L:RB, CARG1 ; mov SAVE_L, CARG1 ; …
///   vm_cpcall: mov KBASE, L:RB->stack ; sub KBASE, L:RB->top ; … ; mov SAVE_NRES, KBASEd ;
///              mov KBASE, L:RB->cframe ; mov SAVE_CFRAME, KBASE ; mov L:RB->cframe, rsp
///   vm_call:   mov SAVE_NRES, CARG3d ; … ; mov SAVE_PC, L:RB
///   vm_resume: cmp byte L:RB->status, RDL
/// Stack slots are given from the C frame: the stack pointer after `saveregs`.
fn entries(ins: &[Instruction], gc64: bool, f: &mut Facts) {
    const SRC: &str = "the VM's code (its entries)";
    for (n, i) in ins.iter().enumerate() {
        // saveregs ends with `sub rsp, CFRAME_SPACE`, after four pushes.
        if !(i.mnemonic() == Mnemonic::Sub
            && reg(i, 0) == Some(Register::RSP)
            && imm(i, 1).is_some())
        {
            continue;
        }
        let body = &ins[n + 1..(n + 24).min(ins.len())];
        // vm_cpcall's stack and top.
        for w in body.windows(2) {
            let (Some(s), Some((b, t, _))) = (load(&w[0], KBASE, RB), mem(&w[1], 1)) else {
                continue;
            };
            if w[1].mnemonic() == Mnemonic::Sub && reg(&w[1], 0) == Some(KBASE) && b == RB {
                f.set("L.stack", s, SRC);
                f.set("L.top", t, SRC);
                // SAVE_NRES takes the difference, a 32-bit store from KBASE.
                if let Some(nres) = body.iter().find_map(|j| {
                    store(j, Register::RSP, KBASE)
                        .filter(|&(_, size)| size == 4)
                        .map(|(d, _)| d)
                }) {
                    f.set("cf.nres", nres, SRC);
                }
            }
        }
        // mov KBASE, L:RB->cframe ; mov SAVE_CFRAME, KBASE ; mov L:RB->cframe, rsp
        for w in body.windows(3) {
            let (Some(c), Some((prev, 8)), Some((c2, _))) = (
                load(&w[0], KBASE, RB),
                store(&w[1], Register::RSP, KBASE),
                store(&w[2], RB, Register::RSP),
            ) else {
                continue;
            };
            if c == c2 {
                f.set("L.cframe", c, SRC);
                f.set("cf.prev", prev, SRC);
            }
        }
        // cmp byte L:RB->status, RDL
        if let Some(d) = body.iter().find_map(|j| {
            (j.mnemonic() == Mnemonic::Cmp && reg(j, 1) == Some(RD))
                .then(|| mem(j, 0))
                .flatten()
                .filter(|m| m.0 == RB && m.2 == 1)
                .map(|m| m.1)
        }) {
            f.set("L.status", d, SRC);
        }
        // SAVE_PC holds L in vm_call and vm_cpcall: a store of RB to the C frame other
        // than SAVE_L (a store of CARG1).
        let width = if gc64 { 8 } else { 4 };
        let save_l = body
            .iter()
            .find_map(|j| store(j, Register::RSP, Register::RDI).map(|(d, _)| d));
        if let Some(pc) = body.iter().find_map(|j| {
            store(j, Register::RSP, RB).filter(|&(d, s)| s == width && Some(d) != save_l)
        }) {
            f.set("cf.pc", pc.0, SRC);
        }
    }
}

/// Fields of the prototype, from the bytecode pointer PC (which points into the
/// bytecode that follows a GCproto): PC2PROTO(field) = offsetof(GCproto, field) -
/// sizeof(GCproto).
///   BC_FUNCF: mov KBASE, [PC-4+PC2PROTO(k)] ; movzx RAd, byte [PC-4+PC2PROTO(numparams)]
///   vm_growstack_f: movzx RAd, byte [PC-4+PC2PROTO(framesize)]
/// numparams and framesize follow the GC header (GCHeader; then uint8_t numparams,
/// framesize), which gives sizeof(GCproto).
fn proto(ins: &[Instruction], gc64: bool, f: &mut Facts) {
    const SRC: &str = "the VM's code (PC2PROTO)";
    let bytes: Vec<i64> = ins
        .iter()
        .filter(|i| i.mnemonic() == Mnemonic::Movzx)
        .filter_map(|i| mem(i, 1))
        .filter(|&(b, d, s)| b == PC && s == 1 && d < -16)
        .map(|(_, d, _)| d)
        .collect();
    let numparams = most(bytes.clone());
    let Some(numparams) = numparams.filter(|&n| bytes.contains(&(n + 1))) else {
        return;
    };
    let header = if gc64 { 10 } else { 6 };
    let size = header - (numparams + 4);
    f.set("pt.size", size, SRC);
    f.set("pt.numparams", header, SRC);
    f.set("pt.framesize", header + 1, SRC);
    let k = most(
        ins.iter()
            .filter_map(|i| load(i, KBASE, PC))
            .filter(|&d| d < -4)
            .collect(),
    );
    if let Some(k) = k {
        f.set("pt.k", k + 4 + size, SRC);
    }
}

/// The FFI callback handler, entered with G in rbp (its C thunk sets it):
///   lea DISPATCH, [ebp+GG_G2DISP] ; mov CTSTATE, GL:ebp->ctype_state ; … ;
///   lea rax, [rsp+CFRAME_SIZE] ; … ; mov CTSTATE->cb.stack, rax
fn ffi_callback(ins: &[Instruction], g2disp: i64, f: &mut Facts) {
    const SRC: &str = "the VM's code (vm_ffi_callback)";
    for (n, i) in ins.iter().enumerate() {
        let lea = i.mnemonic() == Mnemonic::Lea && reg(i, 0) == Some(DISPATCH);
        if !lea
            || i.memory_base().full_register() != RB
            || i.memory_displacement64() as i64 != g2disp
        {
            continue;
        }
        let body = &ins[n + 1..(n + 40).min(ins.len())];
        let Some((cts, ctype_state)) = body.iter().find_map(|j| {
            let (b, d, _) = mem(j, 1)?;
            (j.mnemonic() == Mnemonic::Mov && b == RB).then(|| (reg(j, 0), d))
        }) else {
            return;
        };
        f.set("g.ctype_state", ctype_state, SRC);
        // lea rax, [rsp+CFRAME_SIZE], later stored to CTSTATE->cb.stack.
        let frame = body.iter().find_map(|j| {
            (j.mnemonic() == Mnemonic::Lea && j.memory_base() == Register::RSP)
                .then(|| reg(j, 0))?
        });
        if let (Some(cts), Some(frame)) = (cts, frame) {
            if let Some((d, 8)) = body.iter().rev().find_map(|j| store(j, cts, frame)) {
                f.set("cts.cb_stack", d, SRC);
            }
        }
        return;
    }
}

/// GCstr: its length and where its text begins.
///   BC_LEN: cvtsi2sd xmm0, dword STR:RD->len
///   string.byte/sub: mov RCd, STR:RB->len ; … ; lea RD, [STR:RB+RAd+#STR-1]
fn strings(ins: &[Instruction], f: &mut Facts) {
    const SRC: &str = "the VM's code (string functions)";
    let len = most(
        ins.iter()
            .filter(|i| i.mnemonic() == Mnemonic::Cvtsi2sd)
            .filter_map(|i| mem(i, 1).filter(|m| m.2 == 4))
            .map(|(_, d, _)| d)
            .collect(),
    );
    let Some(len) = len else {
        return;
    };
    f.set("str.len", len, SRC);
    for (n, i) in ins.iter().enumerate() {
        if i.mnemonic() != Mnemonic::Lea
            || i.memory_index() == Register::None
            || i.memory_index_scale() != 1
        {
            continue;
        }
        let base = i.memory_base().full_register();
        let disp = i.memory_displacement64() as i64;
        let loads_len = ins[n.saturating_sub(16)..n]
            .iter()
            .any(|j| j.mnemonic() == Mnemonic::Mov && mem(j, 1) == Some((base, len, 4)));
        if loads_len && disp > len {
            f.set("str.data", disp + 1, SRC);
            return;
        }
    }
}
