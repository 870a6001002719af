//! The evaluator's machine state: the registers' and the written stack slots' symbolic
//! values, merged where paths meet.

use std::collections::BTreeMap;

use iced_x86::Register;

use super::Expr;

/// Argument registers of the System V ABI, in order.
pub(super) const ARGS: [Register; 6] = [
    Register::RDI,
    Register::RSI,
    Register::RDX,
    Register::RCX,
    Register::R8,
    Register::R9,
];

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
