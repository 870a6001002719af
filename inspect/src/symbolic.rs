//! The values and events of symbolic evaluation, the same for every architecture: what a
//! register or memory word holds in terms of a function's arguments ([`Expr`]), and what an
//! instruction did with them ([`Event`]), which the evaluators of each architecture produce.

pub mod expr;

pub use expr::{Expr, Op};

/// What an instruction did, in symbolic values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Load {
        at: u64,
        addr: Expr,
        size: u8,
    },
    Store {
        at: u64,
        addr: Expr,
        value: Expr,
        size: u8,
    },
    /// `cmp a, b` or (`test`) `test a, b`.
    Compare {
        at: u64,
        a: Expr,
        b: Expr,
        size: u8,
        test: bool,
    },
    Call {
        at: u64,
        target: Option<u64>,
        args: Vec<Expr>,
    },
    Return {
        at: u64,
        value: Expr,
    },
    /// An indirect jump (a dispatch through a table, a computed goto, a tail call through
    /// a pointer, which passes `args`: the argument registers there).
    Jump {
        at: u64,
        target: Expr,
        args: Vec<Expr>,
    },
}

/// How far the evaluation goes.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Direct calls evaluated in place, nested this deep (0: none).
    pub inline_depth: u32,
    /// Instructions evaluated in all, callees included.
    pub budget: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            inline_depth: 0,
            budget: 20_000,
        }
    }
}
