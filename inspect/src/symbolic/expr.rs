//! Symbolic values of the evaluator: what a register or memory word holds, in terms of
//! the function's arguments (`Arg`), its entry stack pointer (`Sp`), constants and loads.
//! Constructors keep one normal form, so that `[rdi+0x18]+0x20` and `[rdi+0x18]+0x30-0x10`
//! compare equal: constants fold, and a constant added to anything becomes an `Offset`.
//!
//! Bounded by construction: a value's operands are shared (`Rc`), never copied, so a
//! register copied into a thousand states costs a thousand pointers; and no value holds
//! more than [`MAX_NODES`] nodes (counted as a tree, shared operands as often as they
//! occur): a bigger one is `Unknown`. Code that mixes a value with itself again and again
//! (a hash of a seed, `h ^ (h << 5) + (h >> 2)`, unrolled) would otherwise double its
//! tree at each step, and every comparison and merge of it with it. What the learners look
//! for is small (a field of an argument, a constant), so nothing they use is lost.

use std::fmt;
use std::rc::Rc;

/// A symbolic 64-bit value.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum Expr {
    Const(i64),
    /// The n-th integer argument register at entry (rdi, rsi, rdx, rcx, r8, r9).
    Arg(u8),
    /// The entry stack pointer plus a constant.
    Sp(i64),
    /// The `size`-byte word at an address (sign or zero extension not told apart).
    Load(Rc<Expr>, u8),
    /// A non-constant value plus a non-zero constant.
    Offset(Rc<Expr>, i64),
    /// Another operation of two values.
    Bin(Op, Rc<Expr>, Rc<Expr>),
    /// What a call returned: the call's address in the code.
    Ret(u64),
    /// One of several values: what paths that met held (at most [`MAX_PHI`], none of
    /// them a `Phi`; `Unknown` among them when a path's value was not known).
    Phi(Rc<[Expr]>),
    /// A value computed by an instruction the evaluator does not model (at this address):
    /// unknown, but the same wherever it flows.
    Opaque(u64),
    /// Nothing known (a merge of too many values).
    Unknown,
}

/// Values a merge keeps apart before it gives up.
pub const MAX_PHI: usize = 8;

/// The most nodes a value holds (as a tree): past it, a value is `Unknown`. The learners'
/// patterns hold a few (`[[a0+0x18]+0x20]` is five); 8 alternatives of 8 nodes fit.
pub const MAX_NODES: usize = 72;

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Op {
    Add,
    Sub,
    And,
    Or,
    Xor,
    Shl,
    Shr,
    Sar,
    Mul,
}

impl Expr {
    /// The value of two paths that meet: either, or unknown past [`MAX_PHI`] values.
    pub fn merge(a: &Expr, b: &Expr) -> Expr {
        if a == b {
            return a.clone();
        }
        let mut all: Vec<Expr> = Vec::new();
        for e in [a, b] {
            match e {
                Expr::Phi(v) => all.extend(v.iter().cloned()),
                e => all.push(e.clone()),
            }
        }
        let mut unique: Vec<Expr> = Vec::new();
        for e in all {
            if !unique.contains(&e) {
                unique.push(e);
            }
        }
        match unique.len() {
            1 => unique.pop().unwrap(),
            // The Phi node itself and its alternatives'.
            n if n <= MAX_PHI && unique.iter().map(Expr::nodes).sum::<usize>() < MAX_NODES => {
                Expr::Phi(unique.into())
            }
            _ => Expr::Unknown,
        }
    }

    /// The nodes of this value as a tree (shared operands as often as they occur), counted
    /// up to one past [`MAX_NODES`]: what a copy, a comparison or a walk of it costs at most.
    pub fn nodes(&self) -> usize {
        fn count(e: &Expr, n: &mut usize) {
            *n += 1;
            if *n > MAX_NODES {
                return;
            }
            match e {
                Expr::Load(a, _) | Expr::Offset(a, _) => count(a, n),
                Expr::Bin(_, a, b) => {
                    count(a, n);
                    count(b, n);
                }
                Expr::Phi(v) => v.iter().for_each(|x| count(x, n)),
                _ => {}
            }
        }
        let mut n = 0;
        count(self, &mut n);
        n.min(MAX_NODES + 1)
    }

    /// `self`, or `Unknown` when it holds more than [`MAX_NODES`] nodes.
    fn bounded(self) -> Expr {
        match self.nodes() > MAX_NODES {
            true => Expr::Unknown,
            false => self,
        }
    }

    /// The values this may be: its alternatives, or itself.
    pub fn alternatives(&self) -> &[Expr] {
        match self {
            Expr::Phi(v) => v,
            e => std::slice::from_ref(e),
        }
    }

    pub fn load(addr: Expr, size: u8) -> Expr {
        match addr {
            Expr::Unknown => Expr::Unknown,
            a => Expr::Load(Rc::new(a), size).bounded(),
        }
    }

    /// `self + k`.
    pub fn offset(self, k: i64) -> Expr {
        if k == 0 {
            return self;
        }
        match self {
            Expr::Const(c) => Expr::Const(c.wrapping_add(k)),
            Expr::Sp(s) => Expr::Sp(s.wrapping_add(k)),
            Expr::Offset(e, c) => match c.wrapping_add(k) {
                0 => Rc::unwrap_or_clone(e),
                s => Expr::Offset(e, s),
            },
            Expr::Unknown => Expr::Unknown,
            e => Expr::Offset(Rc::new(e), k).bounded(),
        }
    }

    /// `a op b`, folded where both are known or the operation keeps a base.
    pub fn op(op: Op, a: Expr, b: Expr) -> Expr {
        use Expr::*;
        match (op, a, b) {
            (_, Unknown, _) | (_, _, Unknown) => Unknown,
            (Op::Add, a, Const(k)) | (Op::Add, Const(k), a) => a.offset(k),
            (Op::Sub, a, Const(k)) => a.offset(k.wrapping_neg()),
            (Op::Sub, a, b) if a == b => Const(0),
            (Op::Sub, Sp(x), Sp(y)) => Const(x.wrapping_sub(y)),
            (Op::Xor, a, b) if a == b => Const(0),
            (op, Const(x), Const(y)) => Const(match op {
                Op::Add => x.wrapping_add(y),
                Op::Sub => x.wrapping_sub(y),
                Op::And => x & y,
                Op::Or => x | y,
                Op::Xor => x ^ y,
                Op::Shl => x.wrapping_shl(y as u32),
                Op::Shr => ((x as u64).wrapping_shr(y as u32)) as i64,
                Op::Sar => x.wrapping_shr(y as u32),
                Op::Mul => x.wrapping_mul(y),
            }),
            (op, a, b) => Bin(op, Rc::new(a), Rc::new(b)).bounded(),
        }
    }

    /// The value as (base, constant): `Offset(e, k)` → (e, k), a constant → (None, k).
    pub fn split(&self) -> (Option<&Expr>, i64) {
        match self {
            Expr::Offset(e, k) => (Some(e), *k),
            Expr::Const(k) => (None, *k),
            e => (Some(e), 0),
        }
    }

    /// When this is a load: its address as (base, constant) and its size.
    pub fn as_load(&self) -> Option<(Option<&Expr>, i64, u8)> {
        match self {
            Expr::Load(a, size) => {
                let (base, k) = a.split();
                Some((base, k, *size))
            }
            _ => None,
        }
    }

    /// When this is `[base + k]` (any size) with the given base: k.
    pub fn load_from(&self, base: &Expr) -> Option<i64> {
        match self.as_load()? {
            (Some(b), k, _) if b == base => Some(k),
            _ => None,
        }
    }

    /// Whether the value depends on an unknown.
    pub fn is_known(&self) -> bool {
        match self {
            Expr::Unknown => false,
            Expr::Load(a, _) | Expr::Offset(a, _) => a.is_known(),
            Expr::Bin(_, a, b) => a.is_known() && b.is_known(),
            Expr::Phi(v) => v.iter().any(Expr::is_known),
            _ => true,
        }
    }

    /// Whether `e` occurs in this value.
    pub fn contains(&self, e: &Expr) -> bool {
        self == e
            || match self {
                Expr::Load(a, _) | Expr::Offset(a, _) => a.contains(e),
                Expr::Bin(_, a, b) => a.contains(e) || b.contains(e),
                Expr::Phi(v) => v.iter().any(|x| x.contains(e)),
                _ => false,
            }
    }

    /// Every load inside this value (itself included), outermost first.
    pub fn loads(&self) -> Vec<&Expr> {
        let mut out = Vec::new();
        self.visit(&mut |e| {
            if matches!(e, Expr::Load(..)) {
                out.push(e)
            }
        });
        out
    }

    fn visit<'a>(&'a self, f: &mut impl FnMut(&'a Expr)) {
        f(self);
        match self {
            Expr::Load(a, _) | Expr::Offset(a, _) => a.visit(f),
            Expr::Bin(_, a, b) => {
                a.visit(f);
                b.visit(f);
            }
            Expr::Phi(v) => v.iter().for_each(|x| x.visit(f)),
            _ => {}
        }
    }
}

impl fmt::Debug for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Const(k) => write!(f, "{k:#x}"),
            Expr::Arg(n) => write!(f, "a{n}"),
            Expr::Sp(k) => write!(f, "sp{k:+#x}"),
            Expr::Load(a, s) => write!(f, "[{a:?}]{}", s * 8),
            Expr::Offset(e, k) => write!(f, "{e:?}{k:+#x}"),
            Expr::Bin(op, a, b) => write!(f, "({a:?} {op:?} {b:?})"),
            Expr::Ret(at) => write!(f, "ret@{at:#x}"),
            Expr::Opaque(at) => write!(f, "op@{at:#x}"),
            Expr::Phi(v) => write!(f, "phi{v:?}"),
            Expr::Unknown => write!(f, "?"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_fold_into_one_offset() {
        let l = Expr::load(Expr::Arg(0).offset(0x18), 8);
        let a = l.clone().offset(0x30).offset(-0x10);
        assert_eq!(a, l.clone().offset(0x20));
        assert_eq!(a.split(), (Some(&l), 0x20));
        assert_eq!(l.clone().offset(8).offset(-8), l);
        assert_eq!(
            Expr::op(Op::Sub, Expr::Sp(-8), Expr::Sp(-24)),
            Expr::Const(16)
        );
        assert_eq!(
            Expr::load(Expr::Arg(0).offset(0x18), 8).load_from(&Expr::Arg(0)),
            Some(0x18)
        );
    }
}
