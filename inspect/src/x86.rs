//! The symbolic evaluator of x86-64 functions (what `eval::evaluate` runs for x86-64 code): runs a
//! function's instructions (decoded by iced-x86) over symbolic values ([`Expr`]) and lists
//! what it reads, writes, compares, calls and returns in terms of its arguments.
//!
//! Path-insensitive and forward only: instructions are taken in address order; a forward
//! branch carries the state to its target, where it merges with the others (a register
//! that differs becomes unknown); a backward branch (a loop's) is not followed. Direct
//! calls into the same file can be evaluated in place ([`Options::inline_depth`]), with
//! the caller's values as arguments.

mod decode;
mod state;

use std::collections::HashMap;

use iced_x86::{
    Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, Mnemonic, OpAccess,
    OpKind, Register,
};

use crate::elf::Code;
use crate::symbolic::{Event, Expr, Op, Options};
use decode::operand_size;
pub use decode::{decode, immediate};
use state::{gpr, State};

/// Registers a call may change (System V: all but rbx, rbp, rsp, r12–r15).
const CALLER_SAVED: [Register; 9] = [
    Register::RAX,
    Register::RCX,
    Register::RDX,
    Register::RSI,
    Register::RDI,
    Register::R8,
    Register::R9,
    Register::R10,
    Register::R11,
];

/// What `eval::evaluate` does for x86-64 code.
pub fn evaluate(code: &Code, start: u64, args: &[Expr], opts: Options) -> Vec<Event> {
    let mut run = Run {
        code,
        opts,
        spent: 0,
        events: Vec::new(),
    };
    let end = code.function_at(start).map_or(start + 4096, |(_, e)| e);
    run.function(start, end, State::entry(args), 0);
    run.events
}

/// Evaluates the code at `start` up to `end` from a given register state: for code that
/// is not a function of its own (an interpreter's entry points and handlers).
pub fn evaluate_from(
    code: &Code,
    start: u64,
    end: u64,
    regs: &[(Register, Expr)],
    opts: Options,
) -> Vec<Event> {
    let mut state = State::entry(&[]);
    for r in state.regs.iter_mut() {
        *r = Expr::Unknown;
    }
    state.regs[gpr(Register::RSP).unwrap()] = Expr::Sp(0);
    for (r, v) in regs {
        if let Some(i) = gpr(*r) {
            state.regs[i] = v.clone();
        }
    }
    let mut run = Run {
        code,
        opts,
        spent: 0,
        events: Vec::new(),
    };
    run.function(start, end, state, 0);
    run.events
}

struct Run<'c, 'a> {
    code: &'c Code<'a>,
    opts: Options,
    spent: usize,
    events: Vec<Event>,
}

impl Run<'_, '_> {
    /// Evaluates [start, end) from `state`; returns the merged value of rax at its returns.
    fn function(&mut self, start: u64, end: u64, state: State, depth: u32) -> Expr {
        let Some(bytes) = self.code.bytes(start, end) else {
            return Expr::Unknown;
        };
        let mut decoder = Decoder::with_ip(64, bytes, start, DecoderOptions::NONE);
        let mut info = InstructionInfoFactory::new();
        let mut pending: HashMap<u64, State> = HashMap::new();
        let mut current = Some(state);
        let mut returned: Option<Expr> = None;
        let mut ins = Instruction::default();
        while decoder.can_decode() {
            decoder.decode_out(&mut ins);
            let at = ins.ip();
            // Every instruction decoded counts, also those no path reaches (skipped on
            // the way to a later branch target): a long function called often in place
            // costs its decoding each time.
            self.spent += 1;
            if self.spent > self.opts.budget || !crate::budget::charge(1) {
                break;
            }
            if let Some(p) = pending.remove(&at) {
                match &mut current {
                    Some(c) => c.merge(&p),
                    None => current = Some(p),
                }
            }
            let Some(mut s) = current.take() else {
                if pending.is_empty() {
                    break;
                }
                continue;
            };
            if ins.is_invalid() {
                break;
            }
            match self.step(&ins, &mut s, &mut info, depth, start, end) {
                Flow::Next => current = Some(s),
                Flow::Branch(target) => {
                    if target > at && target < end {
                        merge_into(&mut pending, target, &s);
                    }
                    current = Some(s);
                }
                Flow::Goto(target) => {
                    if target > at && target < end {
                        merge_into(&mut pending, target, &s);
                    } else if target >= start && target <= at {
                        // Back to a block that returns (an epilogue shared by paths).
                        if let Some(v) = self.epilogue(target, end, s) {
                            returned = Some(match returned {
                                Some(r) => Expr::merge(&r, &v),
                                None => v,
                            });
                        }
                    }
                }
                Flow::Switch(cases) => {
                    for target in cases.into_iter().filter(|&t| t > at && t < end) {
                        merge_into(&mut pending, target, &s);
                    }
                }
                Flow::Return(v) => {
                    returned = Some(match returned {
                        Some(r) => Expr::merge(&r, &v),
                        None => v,
                    });
                }
                Flow::Stop => {}
            }
        }
        returned.unwrap_or(Expr::Unknown)
    }

    /// Runs the straight-line block at `target` (jumped back to) up to its `ret`, if it
    /// has one within a few instructions; its returned value.
    fn epilogue(&mut self, target: u64, end: u64, mut s: State) -> Option<Expr> {
        let bytes = self.code.bytes(target, end)?;
        let mut decoder = Decoder::with_ip(64, bytes, target, DecoderOptions::NONE);
        let mut info = InstructionInfoFactory::new();
        for _ in 0..16 {
            let ins = decoder.decode();
            self.spent += 1;
            if !crate::budget::charge(1) {
                return None;
            }
            match ins.flow_control() {
                FlowControl::Next => self.data(&ins, &mut s, &mut info),
                FlowControl::Return => {
                    let v = s.get(Register::RAX);
                    self.events.push(Event::Return {
                        at: ins.ip(),
                        value: v.clone(),
                    });
                    return Some(v);
                }
                _ => return None,
            }
        }
        None
    }

    fn step(
        &mut self,
        ins: &Instruction,
        s: &mut State,
        info: &mut InstructionInfoFactory,
        depth: u32,
        start: u64,
        end: u64,
    ) -> Flow {
        let at = ins.ip();
        match ins.flow_control() {
            FlowControl::Return => {
                self.events.push(Event::Return {
                    at,
                    value: s.get(Register::RAX),
                });
                return Flow::Return(s.get(Register::RAX));
            }
            FlowControl::ConditionalBranch => return Flow::Branch(ins.near_branch_target()),
            FlowControl::UnconditionalBranch => {
                let target = ins.near_branch_target();
                if target >= start && target < end {
                    return Flow::Goto(target);
                }
                // A tail call.
                let v = self.call(ins, s, Some(target), depth);
                self.events.push(Event::Return {
                    at,
                    value: v.clone(),
                });
                return Flow::Return(v);
            }
            FlowControl::IndirectBranch => {
                let target = self.operand(ins, 0, s);
                let cases = self.switch_targets(&target, start, end);
                let args = s.args();
                self.events.push(Event::Jump { at, target, args });
                return if cases.is_empty() {
                    Flow::Stop
                } else {
                    Flow::Switch(cases)
                };
            }
            FlowControl::Call => {
                let target = ins.near_branch_target();
                self.call(ins, s, Some(target), depth);
                return Flow::Next;
            }
            FlowControl::IndirectCall => {
                self.call(ins, s, None, depth);
                return Flow::Next;
            }
            FlowControl::Interrupt | FlowControl::Exception => return Flow::Stop,
            _ => {}
        }
        self.data(ins, s, info);
        Flow::Next
    }

    /// A call: its event, its evaluation in place when allowed, and the registers it may
    /// change. Returns what it returned.
    fn call(&mut self, ins: &Instruction, s: &mut State, target: Option<u64>, depth: u32) -> Expr {
        let at = ins.ip();
        let args = s.args();
        self.events.push(Event::Call {
            at,
            target,
            args: args.clone(),
        });
        let mut value = Expr::Ret(at);
        if let Some(t) = target.filter(|_| depth < self.opts.inline_depth) {
            if let Some((fs, fe)) = self.code.function_at(t) {
                let mut callee = State::entry(&args);
                // The return address is pushed below the caller's stack pointer.
                callee.regs[gpr(Register::RSP).unwrap()] = s.get(Register::RSP).offset(-8);
                let v = self.function(fs, fe, callee, depth + 1);
                if v.is_known() {
                    value = v;
                }
            }
        }
        for r in CALLER_SAVED {
            s.regs[gpr(r).unwrap()] = Expr::Unknown;
        }
        s.regs[gpr(Register::RAX).unwrap()] = value.clone();
        s.mem.clear();
        value
    }

    /// An instruction that only computes.
    fn data(&mut self, ins: &Instruction, s: &mut State, info: &mut InstructionInfoFactory) {
        let at = ins.ip();
        let m = ins.mnemonic();
        let size = |i: u32| operand_size(ins, i);
        match m {
            Mnemonic::Mov | Mnemonic::Movzx | Mnemonic::Movsx | Mnemonic::Movsxd => {
                // Extensions keep the value (a load's size says how wide it was).
                let v = self.operand(ins, 1, s);
                self.write(ins, 0, v, s);
            }
            Mnemonic::Lea => {
                let a = self.address(ins, s);
                self.write(ins, 0, a, s);
            }
            Mnemonic::Add | Mnemonic::Sub | Mnemonic::And | Mnemonic::Or | Mnemonic::Xor => {
                let op = match m {
                    Mnemonic::Add => Op::Add,
                    Mnemonic::Sub => Op::Sub,
                    Mnemonic::And => Op::And,
                    Mnemonic::Or => Op::Or,
                    _ => Op::Xor,
                };
                let a = self.operand(ins, 0, s);
                let b = self.operand(ins, 1, s);
                let v = Expr::op(op, a, b);
                self.write(ins, 0, v, s);
            }
            Mnemonic::Inc | Mnemonic::Dec => {
                let a = self.operand(ins, 0, s);
                let v = a.offset(if m == Mnemonic::Inc { 1 } else { -1 });
                self.write(ins, 0, v, s);
            }
            Mnemonic::Shl | Mnemonic::Shr | Mnemonic::Sar => {
                let op = match m {
                    Mnemonic::Shl => Op::Shl,
                    Mnemonic::Shr => Op::Shr,
                    _ => Op::Sar,
                };
                let a = self.operand(ins, 0, s);
                let b = self.operand(ins, 1, s);
                self.write(ins, 0, Expr::op(op, a, b), s);
            }
            Mnemonic::Cmp | Mnemonic::Test => {
                let a = self.operand(ins, 0, s);
                let b = self.operand(ins, 1, s);
                self.events.push(Event::Compare {
                    at,
                    a,
                    b,
                    size: size(0),
                    test: m == Mnemonic::Test,
                });
            }
            Mnemonic::Push => {
                let v = self.operand(ins, 0, s);
                let sp = s.get(Register::RSP).offset(-8);
                if let Expr::Sp(k) = sp {
                    s.store_slot(k, v, 8);
                }
                s.regs[gpr(Register::RSP).unwrap()] = sp;
            }
            Mnemonic::Pop => {
                let sp = s.get(Register::RSP);
                let v = match &sp {
                    Expr::Sp(k) => s.stack.get(k).map_or(Expr::Unknown, |(v, _)| v.clone()),
                    _ => Expr::Unknown,
                };
                s.regs[gpr(Register::RSP).unwrap()] = sp.offset(8);
                self.write(ins, 0, v, s);
            }
            Mnemonic::Xchg
                if ins.op0_kind() == OpKind::Register && ins.op1_kind() == OpKind::Register =>
            {
                let a = self.operand(ins, 0, s);
                let b = self.operand(ins, 1, s);
                self.write(ins, 0, b, s);
                self.write(ins, 1, a, s);
            }
            Mnemonic::Nop | Mnemonic::Endbr64 => {}
            _ => {
                // Anything else: what it writes becomes unknown.
                let i = info.info(ins);
                for r in i.used_registers() {
                    if matches!(
                        r.access(),
                        OpAccess::Write
                            | OpAccess::ReadWrite
                            | OpAccess::CondWrite
                            | OpAccess::ReadCondWrite
                    ) {
                        if let Some(n) = gpr(r.register()) {
                            s.regs[n] = Expr::Opaque(ins.ip());
                        }
                    }
                }
                for op in 0..ins.op_count() {
                    if ins.op_kind(op) == OpKind::Memory {
                        let addr = self.address(ins, s);
                        if let Expr::Sp(k) = addr {
                            s.stack.remove(&k);
                        }
                    }
                }
            }
        }
    }

    /// The value of operand `i`.
    fn operand(&mut self, ins: &Instruction, i: u32, s: &State) -> Expr {
        match ins.op_kind(i) {
            OpKind::Register => {
                let r = ins.op_register(i);
                // The low bits of a value are read as the value (an index, a flag); the
                // high byte registers are not.
                if matches!(r, Register::AH | Register::BH | Register::CH | Register::DH) {
                    return Expr::Opaque(ins.ip());
                }
                s.get(r)
            }
            OpKind::Memory => {
                let addr = self.address(ins, s);
                let size = operand_size(ins, i);
                self.read(ins.ip(), addr, size, s)
            }
            _ => immediate(ins, i).map_or(Expr::Unknown, Expr::Const),
        }
    }

    fn read(&mut self, at: u64, addr: Expr, size: u8, s: &State) -> Expr {
        if let Expr::Sp(k) = addr {
            return match s.stack.get(&k) {
                Some((v, sz)) if *sz >= size => v.clone(),
                _ => Expr::Unknown,
            };
        }
        if let Some((_, v, _)) = s
            .mem
            .iter()
            .rev()
            .find(|(a, _, sz)| *a == addr && *sz == size)
        {
            return v.clone();
        }
        if addr.is_known() {
            self.events.push(Event::Load {
                at,
                addr: addr.clone(),
                size,
            });
        }
        Expr::load(addr, size)
    }

    /// Writes `v` to operand `i` (a register or memory).
    fn write(&mut self, ins: &Instruction, i: u32, v: Expr, s: &mut State) {
        match ins.op_kind(i) {
            OpKind::Register => {
                let r = ins.op_register(i);
                // A write to a low part keeps the value computed (its low bits are what
                // code reads back); the high byte registers hold no value of their own.
                if let Some(n) = gpr(r) {
                    s.regs[n] = match r {
                        Register::AH | Register::BH | Register::CH | Register::DH => {
                            Expr::Opaque(ins.ip())
                        }
                        _ => v,
                    };
                }
            }
            OpKind::Memory => {
                let addr = self.address(ins, s);
                let size = operand_size(ins, i);
                if let Expr::Sp(k) = addr {
                    s.store_slot(k, v.clone(), size);
                } else if addr.is_known() {
                    s.store_mem(addr.clone(), v.clone(), size);
                }
                self.events.push(Event::Store {
                    at: ins.ip(),
                    addr,
                    value: v,
                    size,
                });
            }
            _ => {}
        }
    }

    /// The cases of a compiled `switch` that jumps to `target`: a table of 32-bit offsets
    /// from its own address (position-independent code: `T + [T + 4i]`) or of absolute
    /// addresses (`[T + 8i]`). The table's length is not known: its entries are read while
    /// they land in the function.
    fn switch_targets(&self, target: &Expr, start: u64, end: u64) -> Vec<u64> {
        let table = |addr: &Expr, scale: i64| -> Option<u64> {
            let (Some(Expr::Bin(Op::Mul, _, k)), t) = addr.split() else {
                return None;
            };
            (**k == Expr::Const(scale)).then_some(t as u64)
        };
        let mut out = Vec::new();
        let mut read = |t: u64, width: u64, entry: &dyn Fn(&[u8]) -> u64| {
            for i in 0..512 {
                let Some(b) = self.code.data(t + i * width, width) else {
                    break;
                };
                let to = entry(b);
                if to < start || to >= end {
                    break;
                }
                out.push(to);
            }
        };
        match target {
            // movsxd r, [T + i*4]; add r, T; jmp r
            Expr::Offset(load, t) => {
                let Expr::Load(addr, 4) = &**load else {
                    return out;
                };
                if table(addr, 4) == Some(*t as u64) {
                    let t = *t as u64;
                    read(t, 4, &|b| {
                        t.wrapping_add(i32::from_le_bytes(b.try_into().unwrap()) as i64 as u64)
                    });
                }
            }
            // jmp [T + i*8]
            Expr::Load(addr, 8) => {
                if let Some(t) = table(addr, 8) {
                    read(t, 8, &|b| u64::from_le_bytes(b.try_into().unwrap()));
                }
            }
            _ => {}
        }
        out
    }

    /// The address a memory operand names.
    fn address(&self, ins: &Instruction, s: &State) -> Expr {
        if ins.segment_prefix() == Register::FS || ins.segment_prefix() == Register::GS {
            return Expr::Unknown;
        }
        if ins.is_ip_rel_memory_operand() {
            return Expr::Const(ins.ip_rel_memory_address() as i64);
        }
        let base = match ins.memory_base() {
            Register::None => Expr::Const(0),
            r => s.get(r),
        };
        let disp = ins.memory_displacement64() as i64;
        let addr = match ins.memory_index() {
            Register::None => base,
            r => {
                let idx = match s.get(r) {
                    Expr::Unknown => Expr::Opaque(ins.ip()),
                    v => v,
                };
                let scaled = Expr::op(Op::Mul, idx, Expr::Const(ins.memory_index_scale() as i64));
                Expr::op(Op::Add, base, scaled)
            }
        };
        addr.offset(disp)
    }
}

enum Flow {
    Next,
    /// A conditional branch: both ways go on.
    Branch(u64),
    /// An unconditional jump within the function.
    Goto(u64),
    /// A jump through a table of cases (a compiled `switch`): all of them.
    Switch(Vec<u64>),
    Return(Expr),
    Stop,
}

/// Branch targets waiting for their state at most: a branch to one more is not followed
/// (its code is evaluated only if a path falls through to it).
const MAX_PENDING: usize = 512;

fn merge_into(pending: &mut HashMap<u64, State>, at: u64, s: &State) {
    let room = pending.len() < MAX_PENDING;
    match pending.get_mut(&at) {
        Some(p) => p.merge(s),
        None if room => {
            pending.insert(at, s.clone());
        }
        None => {}
    }
}

#[cfg(test)]
mod tests;
