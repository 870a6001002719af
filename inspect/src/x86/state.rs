//! The evaluator's machine state: the registers' and the written stack slots' symbolic
//! values, merged where paths meet.

use std::collections::BTreeMap;

use iced_x86::Register;

use crate::symbolic::Expr;

/// Argument registers of the System V ABI, in order.
pub(super) const ARGS: [Register; 6] = [
    Register::RDI,
    Register::RSI,
    Register::RDX,
    Register::RCX,
    Register::R8,
    Register::R9,
];

/// Stack slots a state keeps: writes to more are not kept (a later read of them is unknown).
const MAX_SLOTS: usize = 256;
/// Stores to other memory a state keeps, the latest.
const MAX_MEM: usize = 32;

/// The values of the registers and of the stack slots written so far.
#[derive(Clone, PartialEq)]
pub(super) struct State {
    pub(super) regs: [Expr; 16],
    /// Entry-sp-relative offset → (value, size).
    pub(super) stack: BTreeMap<i64, (Expr, u8)>,
    /// Stores to other memory, for loads of the very same address.
    pub(super) mem: Vec<(Expr, Expr, u8)>,
}

impl State {
    pub(super) fn entry(args: &[Expr]) -> State {
        let mut regs: [Expr; 16] = std::array::from_fn(|_| Expr::Unknown);
        for (i, r) in ARGS.iter().enumerate() {
            regs[gpr(*r).unwrap()] = args.get(i).cloned().unwrap_or(Expr::Arg(i as u8));
        }
        regs[gpr(Register::RSP).unwrap()] = Expr::Sp(0);
        State {
            regs,
            stack: BTreeMap::new(),
            mem: Vec::new(),
        }
    }

    pub(super) fn merge(&mut self, other: &State) {
        for (a, b) in self.regs.iter_mut().zip(&other.regs) {
            *a = Expr::merge(a, b);
        }
        self.stack.retain(|k, v| other.stack.get(k) == Some(v));
        self.mem.retain(|m| other.mem.contains(m));
    }

    /// A write of `value` to the stack slot at entry-sp-relative `k`, kept while the state
    /// holds fewer than [`MAX_SLOTS`] (a loop of pushes unrolled does not grow it further).
    pub(super) fn store_slot(&mut self, k: i64, value: Expr, size: u8) {
        if self.stack.len() < MAX_SLOTS || self.stack.contains_key(&k) {
            self.stack.insert(k, (value, size));
        } else {
            self.stack.remove(&k);
        }
    }

    /// A write of `value` to other memory at `addr`: the latest [`MAX_MEM`] are kept.
    pub(super) fn store_mem(&mut self, addr: Expr, value: Expr, size: u8) {
        self.mem.retain(|(a, _, _)| *a != addr);
        if self.mem.len() >= MAX_MEM {
            self.mem.remove(0);
        }
        self.mem.push((addr, value, size));
    }

    pub(super) fn get(&self, r: Register) -> Expr {
        gpr(r).map_or(Expr::Unknown, |i| self.regs[i].clone())
    }

    /// The argument registers' values: what a call (or a tail jump) here passes.
    pub(super) fn args(&self) -> Vec<Expr> {
        ARGS.iter().map(|&r| self.get(r)).collect()
    }
}

/// The index (0–15) of the 64-bit register holding `r`.
pub(super) fn gpr(r: Register) -> Option<usize> {
    let full = r.full_register();
    (full.is_gpr64()).then(|| full.number())
}
