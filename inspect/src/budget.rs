//! How much work one look at a binary may take. Learning a Lua VM's layout evaluates
//! functions of a binary nobody here has seen, and a search for one function evaluates
//! many: each evaluation is bounded (by the evaluator itself), and their sum is bounded here.
//!
//! A [`Budget`] is set for the work of one binary by [`scope`], on the thread that does it;
//! the loops of that work [`charge`] it (the evaluator per instruction, searches per
//! function looked at, DWARF per entry read) and stop when it is spent, out of time or
//! cancelled (lrec stopping). What gave up says so: [`spent`] tells why. Outside a scope
//! nothing is charged (the unit tests and tools that read one known file).

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The work one binary may take.
#[derive(Debug, Clone)]
pub struct Budget {
    /// Units of work: an instruction evaluated or decoded, a function looked at, a
    /// debugging entry read.
    pub units: u64,
    /// CPU time of the thread doing the work (not wall time: lrec's learner yields to the
    /// target, and a busy machine must not cut its work short).
    pub time: Duration,
    /// Set by whoever waits for the work to end early (lrec's SIGINT/SIGTERM).
    pub cancel: Option<Arc<AtomicBool>>,
}

impl Budget {
    /// What lrec gives one binary: ~1-2 s of this machine's evaluator at most (the
    /// slowest of ~3,200 ELF files of a Debian system took 1.1 M units, 0.3 s).
    pub fn for_binary(cancel: Option<Arc<AtomicBool>>) -> Budget {
        Budget {
            units: 20_000_000,
            time: Duration::from_secs(3),
            cancel,
        }
    }
}

/// Why work stopped before its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spent {
    Units(u64),
    Time(Duration),
    Cancelled,
}

impl std::fmt::Display for Spent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Spent::Units(n) => write!(f, "its work budget ({n} steps) was spent"),
            Spent::Time(t) => write!(f, "its time budget ({:.1} s) ran out", t.as_secs_f64()),
            Spent::Cancelled => write!(f, "lrec was stopping"),
        }
    }
}

struct Meter {
    budget: Budget,
    used: u64,
    /// The thread's CPU time when the scope began.
    started: Duration,
    /// Units until the clock and the cancel flag are looked at again.
    until_check: u64,
    spent: Option<Spent>,
}

/// Units between two looks at the clock and the cancel flag (~1 ms of evaluation).
const CHECK_EVERY: u64 = 4096;

thread_local! {
    static METER: RefCell<Option<Meter>> = const { RefCell::new(None) };
}

/// Runs `f` with `budget` for the work it does on this thread; returns its result and, if
/// the budget ran out, why. Scopes do not nest: an inner one runs under the outer's.
pub fn scope<T>(budget: Budget, f: impl FnOnce() -> T) -> (T, Option<Spent>) {
    let outer = METER.with(|m| m.borrow().is_some());
    if outer {
        let t = f();
        return (t, spent());
    }
    METER.with(|m| {
        *m.borrow_mut() = Some(Meter {
            budget,
            used: 0,
            started: thread_cpu(),
            until_check: 0,
            spent: None,
        })
    });
    // The meter is taken down whatever `f` does (a panic included).
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            METER.with(|m| *m.borrow_mut() = None);
        }
    }
    let reset = Reset;
    let t = f();
    let why = spent();
    drop(reset);
    (t, why)
}

/// Charges `units` of work: false once the budget is spent (and from then on).
pub fn charge(units: u64) -> bool {
    METER.with(|m| {
        let mut m = m.borrow_mut();
        let Some(m) = m.as_mut() else {
            return true;
        };
        if m.spent.is_some() {
            return false;
        }
        m.used += units;
        if m.used > m.budget.units {
            m.spent = Some(Spent::Units(m.budget.units));
            return false;
        }
        if m.until_check > units {
            m.until_check -= units;
            return true;
        }
        m.until_check = CHECK_EVERY;
        if m.budget
            .cancel
            .as_ref()
            .is_some_and(|c| c.load(Ordering::Relaxed))
        {
            m.spent = Some(Spent::Cancelled);
        } else if thread_cpu().saturating_sub(m.started) > m.budget.time {
            m.spent = Some(Spent::Time(m.budget.time));
        }
        m.spent.is_none()
    })
}

/// Whether the budget of this thread's scope is spent.
pub fn exhausted() -> bool {
    !charge(0)
}

/// The calling thread's CPU time.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime into a local; the thread's CPU clock always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Why this thread's scope stopped its work, if it did.
pub fn spent() -> Option<Spent> {
    METER.with(|m| m.borrow().as_ref().and_then(|m| m.spent))
}

/// The units used so far in this thread's scope.
pub fn used() -> u64 {
    METER.with(|m| m.borrow().as_ref().map_or(0, |m| m.used))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_stops_its_work_and_says_why() {
        let b = Budget {
            units: 100,
            time: Duration::from_secs(60),
            cancel: None,
        };
        let (n, why) = scope(b, || (0..1000).take_while(|_| charge(1)).count());
        assert_eq!((n, why), (100, Some(Spent::Units(100))));
        // Outside a scope nothing is charged.
        assert!(charge(1_000_000_000) && spent().is_none());
        let cancel = Arc::new(AtomicBool::new(true));
        let b = Budget {
            units: u64::MAX,
            time: Duration::from_secs(60),
            cancel: Some(cancel),
        };
        let (_, why) = scope(b, || while charge(1) {});
        assert_eq!(why, Some(Spent::Cancelled));
    }
}
