//! Symbolic evaluation of a function's machine code, whatever the architecture: what it
//! loads, stores, compares, calls and returns, in terms of its arguments
//! ([`crate::symbolic`]'s values and events). The layout learners (lua/*/capi.rs,
//! lua/frees.rs) ask these events questions such as "what does `lua_gettop` return, from
//! which fields of its argument": the offsets compiled into the code are the build's own.
//! Each architecture's evaluator sits behind [`evaluate`] (x86-64: [`crate::x86`]).

pub use crate::symbolic::{expr, Event, Expr, Op, Options};

use crate::elf::Code;

/// Evaluates the function at `start` (its end from `code`), with `args` for its first
/// arguments (`Expr::Arg(n)` for the others). Returns its events in address order of
/// evaluation. x86-64 is the architecture read so far (`elf::Code` reads x86-64 files).
pub fn evaluate(code: &Code, start: u64, args: &[Expr], opts: Options) -> Vec<Event> {
    crate::x86::evaluate(code, start, args, opts)
}
