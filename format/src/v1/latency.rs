//! Records of timed calls (`lrec --latency`, `--node-loop`): what was timed, histograms of
//! durations per thread aggregated in BPF, and, with `--latency-events`, each call.
//!
//! Durations are kept in log-linear buckets, as HdrHistogram does: exact below
//! [`LATENCY_EXACT`] ns, then 32 buckets per power of two, so that a bucket is at most
//! 1/32 (3.1 %) of its values wide. ebpf/latency.h computes the same index
//! ([`latency_bucket`] is its reference; tests/tests/latency.rs checks the percentiles read
//! from BPF's buckets against the workloads' own measurements).

use serde::{Deserialize, Serialize};

/// Durations below this many ns have a bucket each.
pub const LATENCY_EXACT: u64 = 64;
/// Buckets per power of two above [`LATENCY_EXACT`] (log2: 5).
pub const LATENCY_SUB_BITS: u32 = 5;
/// The largest power of two kept apart; longer durations share its buckets (2^48 ns is
/// 78 hours).
pub const LATENCY_MAX_LOG2: u32 = 47;
/// Number of buckets.
pub const LATENCY_BUCKETS: u16 =
    (LATENCY_EXACT + ((LATENCY_MAX_LOG2 - 5) as u64) * (1 << LATENCY_SUB_BITS)) as u16;

/// The bucket of a duration of `ns` nanoseconds.
pub fn latency_bucket(ns: u64) -> u16 {
    if ns < LATENCY_EXACT {
        return ns as u16;
    }
    let log2 = 63 - ns.leading_zeros();
    // Longer than the last power of two kept apart: the last bucket.
    if log2 > LATENCY_MAX_LOG2 {
        return LATENCY_BUCKETS - 1;
    }
    let sub = (ns >> (log2 - LATENCY_SUB_BITS)) & ((1 << LATENCY_SUB_BITS) - 1);
    (LATENCY_EXACT + u64::from(log2 - 6) * (1 << LATENCY_SUB_BITS) + sub) as u16
}

/// The durations of bucket `b`: `lo..hi` ns (`hi` exclusive; the last bucket is open).
pub fn latency_bucket_range(b: u16) -> (u64, u64) {
    let b = u64::from(b);
    if b < LATENCY_EXACT {
        return (b, b + 1);
    }
    let log2 = (b - LATENCY_EXACT) / (1 << LATENCY_SUB_BITS) + 6;
    let sub = (b - LATENCY_EXACT) % (1 << LATENCY_SUB_BITS);
    let width = 1u64 << (log2 - u64::from(LATENCY_SUB_BITS));
    let lo = (1u64 << log2) + sub * width;
    (lo, lo + width)
}

/// What one timed thing is.
pub mod latency_kind {
    /// A function, from its entry to its return (`--latency SPEC`).
    pub const FUNCTION: u8 = 0;
    /// A phase of a loop, from one boundary event to the next (`--node-loop`).
    pub const PHASE: u8 = 1;
    /// A whole loop iteration (`--node-loop`).
    pub const ITERATION: u8 = 2;
}

/// One thing lrec timed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct LatencyProbe {
    /// Its number in [`LatencyHistogram::probe`] and [`LatencyCall::probe`].
    pub id: u32,
    /// What reports call it: `uv__io_poll`, `libfoo.so:bar`, `node loop: poll`.
    pub name: String,
    /// [`latency_kind`].
    pub kind: u8,
    /// The `--latency` argument it came from (`--node-loop` for the preset).
    pub spec: String,
    /// Where it is: the binary's path as the target mapped it, its build-id, and the
    /// function's address (SVMA) and file offset in it (0 for phases and iterations).
    pub binary: String,
    pub build_id: Option<Vec<u8>>,
    pub address: u64,
    pub file_offset: u64,
    /// How it is measured, in words (for phases: between which events).
    pub how: String,
    /// Calls (entries) seen, including those not timed.
    pub hits: u64,
    /// Returns that matched no entry (the call began before lrec attached, or its entry
    /// was not kept): counted, never paired with another call's entry.
    pub unmatched_returns: u64,
    /// Entries whose return was never seen: the thread left the function another way
    /// (longjmp, exceptions, a coroutine switch of stacks), or exited.
    pub abandoned: u64,
    /// Entries still waiting for their return when the recording ended.
    pub open: u64,
    /// Entries not kept: the thread was more than lrec's nesting limit deep in timed calls
    /// (or BPF could not allocate its shadow stack).
    pub too_deep: u64,
    /// Durations not counted because BPF's histogram table was full.
    pub dropped: u64,
    /// Probing stopped at this CLOCK_MONOTONIC time because the function was called
    /// `stopped_rate` times a second, above `--latency-max-rate`.
    pub stopped_ns: Option<u64>,
    pub stopped_rate: u64,
}

/// The durations of one probe's calls in one thread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct LatencyHistogram {
    pub probe: u32,
    pub pid: u32,
    pub tid: u32,
    pub count: u64,
    pub sum_ns: u64,
    pub min_ns: u64,
    pub max_ns: u64,
    /// (bucket, count) for each non-empty bucket ([`latency_bucket`]), in bucket order.
    pub buckets: Vec<(u16, u64)>,
}

/// Everything `--latency` or `--node-loop` measured, written when the recording ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Latency {
    /// `--latency-max-rate` (0: no limit).
    pub max_rate: u64,
    pub probes: Vec<LatencyProbe>,
    pub histograms: Vec<LatencyHistogram>,
    /// `--latency` specs that matched no function in any target binary, with why.
    pub unresolved: Vec<String>,
}

/// One timed call (`--latency-events`): CLOCK_MONOTONIC start and duration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct LatencyCall {
    pub probe: u32,
    pub pid: u32,
    pub tid: u32,
    pub start_ns: u64,
    pub duration_ns: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_narrow() {
        let mut prev_hi = 0;
        for b in 0..LATENCY_BUCKETS {
            let (lo, hi) = latency_bucket_range(b);
            assert_eq!(lo, prev_hi, "bucket {b}");
            assert_eq!(latency_bucket(lo), b);
            assert_eq!(latency_bucket(hi - 1), b);
            if lo >= LATENCY_EXACT {
                assert!((hi - lo) * 32 <= lo, "bucket {b} is {lo}..{hi}");
            }
            prev_hi = hi;
        }
        assert_eq!(latency_bucket(u64::MAX), LATENCY_BUCKETS - 1);
        assert_eq!(latency_bucket(1_000_000), latency_bucket(1_000_001));
    }
}
