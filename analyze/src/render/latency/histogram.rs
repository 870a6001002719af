//! Histograms of durations: merged over threads, their percentiles, and rows to draw.

use std::collections::BTreeMap;

use lrec_format::{latency_bucket_range, LatencyHistogram};

/// The durations of calls to one probe (of one thread, or merged over threads): count,
/// sum, extremes, and the count per log-linear bucket ([`lrec_format::latency_bucket`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Durations {
    pub count: u64,
    pub sum_ns: u64,
    /// 0 when empty.
    pub min_ns: u64,
    pub max_ns: u64,
    /// Count per bucket, by bucket.
    pub buckets: BTreeMap<u16, u64>,
}

impl Durations {
    /// The durations of `histograms`, merged.
    pub fn of<'a>(histograms: impl IntoIterator<Item = &'a LatencyHistogram>) -> Durations {
        let mut d = Durations::default();
        for h in histograms {
            d.add(h);
        }
        d
    }

    /// Adds one thread's histogram (empty ones change nothing).
    pub fn add(&mut self, h: &LatencyHistogram) {
        if h.count == 0 && h.buckets.is_empty() {
            return;
        }
        self.min_ns = match self.count {
            0 => h.min_ns,
            _ => self.min_ns.min(h.min_ns),
        };
        self.max_ns = self.max_ns.max(h.max_ns);
        self.count += h.count;
        self.sum_ns += h.sum_ns;
        for &(bucket, n) in &h.buckets {
            *self.buckets.entry(bucket).or_default() += n;
        }
    }

    /// The mean duration, in ns (0 when empty).
    pub fn mean_ns(&self) -> f64 {
        match self.count {
            0 => 0.0,
            n => self.sum_ns as f64 / n as f64,
        }
    }

    /// The `q` quantile (0.5 for the median) in ns, from the buckets: the value of rank
    /// ⌈q·count⌉, placed inside its bucket's `lo..hi` by its position among the bucket's
    /// values, within `min_ns..=max_ns`. 0 when empty. A bucket is at most 1/32 of its
    /// values wide, so the error is under 3.2 %.
    pub fn percentile(&self, q: f64) -> u64 {
        let total: u64 = self.buckets.values().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut below = 0;
        for (&bucket, &n) in &self.buckets {
            if below + n >= rank {
                let (lo, hi) = latency_bucket_range(bucket);
                // The bucket's values spread evenly over it, the rank's in the middle of
                // its share (so that a bucket of one nanosecond gives its own value).
                let position = ((rank - below) as f64 - 0.5) / n as f64;
                let value = lo + ((hi - lo) as f64 * position) as u64;
                return value.clamp(self.min_ns, self.max_ns.max(self.min_ns));
            }
            below += n;
        }
        self.max_ns
    }

    /// The buckets merged into rows to draw, `lo..hi` ns with their count: one row per
    /// power of two, or per quarter of one when the durations span 4 powers of two or
    /// fewer; empty rows before the first and after the last value are left out.
    pub fn rows(&self) -> Vec<Row> {
        let (Some((&first, _)), Some((&last, _))) = (
            self.buckets.iter().find(|(_, &n)| n > 0),
            self.buckets.iter().rev().find(|(_, &n)| n > 0),
        ) else {
            return Vec::new();
        };
        let octave = |b: u16| log2(latency_bucket_range(b).0);
        let quarters = octave(last) - octave(first) < 4;
        let row_of = |lo: u64| row_range(lo, quarters);
        let mut rows: Vec<Row> = Vec::new();
        let mut lo = row_of(latency_bucket_range(first).0).0;
        let end = row_of(latency_bucket_range(last).0).1;
        while lo < end {
            let (row_lo, hi) = row_of(lo);
            rows.push(Row {
                lo_ns: row_lo,
                hi_ns: hi,
                count: 0,
            });
            lo = hi;
        }
        for (&bucket, &n) in &self.buckets {
            let lo = latency_bucket_range(bucket).0;
            if let Some(row) = rows.iter_mut().rev().find(|r| r.lo_ns <= lo) {
                row.count += n;
            }
        }
        rows
    }
}

/// One row of a drawn histogram: the durations `lo_ns..hi_ns` and how many calls took them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    pub lo_ns: u64,
    pub hi_ns: u64,
    pub count: u64,
}

/// ⌊log2(ns)⌋, with 0 for 0.
fn log2(ns: u64) -> u32 {
    63u32.saturating_sub(ns.leading_zeros())
}

/// The row holding the duration `ns`: its power of two, or the quarter of it (powers of
/// two of 4 ns and more; bucket edges fall on these quarters).
fn row_range(ns: u64, quarters: bool) -> (u64, u64) {
    if ns == 0 {
        return (0, 1);
    }
    let k = log2(ns);
    let base = 1u64 << k;
    if !quarters || !(2..63).contains(&k) {
        return (base, base.saturating_mul(2));
    }
    let width = base >> 2;
    let lo = base + (ns - base) / width * width;
    (lo, lo + width)
}

/// A bar of `count / max` of `width` characters, in eighths of a character; a count above
/// zero shows at least an eighth.
pub fn bar(count: u64, max: u64, width: usize) -> String {
    const EIGHTHS: [char; 8] = [' ', '▏', '▎', '▍', '▌', '▋', '▊', '▉'];
    if max == 0 {
        return String::new();
    }
    let eighths = (count as f64 / max as f64 * (width * 8) as f64).round() as usize;
    let eighths = if count > 0 { eighths.max(1) } else { 0 };
    let mut bar = "█".repeat(eighths / 8);
    if eighths % 8 > 0 {
        bar.push(EIGHTHS[eighths % 8]);
    }
    bar
}

#[cfg(test)]
mod tests {
    use super::*;
    use lrec_format::latency_bucket;

    /// A histogram of `values` (ns), as lrec's BPF program would count them.
    pub(crate) fn histogram(values: impl IntoIterator<Item = u64>) -> LatencyHistogram {
        let mut h = LatencyHistogram {
            min_ns: u64::MAX,
            ..LatencyHistogram::default()
        };
        let mut buckets: BTreeMap<u16, u64> = BTreeMap::new();
        for v in values {
            h.count += 1;
            h.sum_ns += v;
            h.min_ns = h.min_ns.min(v);
            h.max_ns = h.max_ns.max(v);
            *buckets.entry(latency_bucket(v)).or_default() += 1;
        }
        h.buckets = buckets.into_iter().collect();
        h
    }

    fn close(got: u64, want: u64) -> bool {
        (got as f64 - want as f64).abs() <= 0.03 * want as f64
    }

    #[test]
    fn percentiles_of_two_durations_fall_on_them() {
        let d = Durations::of([&histogram((0..1000).map(|i| {
            if i % 2 == 0 {
                1_000_000
            } else {
                10_000_000
            }
        }))]);
        assert_eq!(d.count, 1000);
        // The 500th value is the last 1 ms; the 501st the first 10 ms.
        assert!(close(d.percentile(0.5), 1_000_000), "{}", d.percentile(0.5));
        assert!(close(d.percentile(0.501), 10_000_000));
        // Clamped to the largest value.
        assert_eq!(d.percentile(0.99), 10_000_000);
        assert_eq!(d.percentile(1.0), 10_000_000);
        assert!(close(d.percentile(0.0), 1_000_000));
        assert_eq!(d.mean_ns(), 5_500_000.0);
    }

    #[test]
    fn percentiles_of_a_uniform_spread_are_within_a_bucket() {
        let values: Vec<u64> = (1..=10_000).map(|i| i * 1_000).collect();
        let d = Durations::of([&histogram(values.iter().copied())]);
        for q in [0.01, 0.1, 0.5, 0.9, 0.99, 0.999] {
            let want = values[(q * values.len() as f64).ceil() as usize - 1];
            let got = d.percentile(q);
            assert!(close(got, want), "p{q}: {got} ns, want {want} ns");
        }
        // Exact below 64 ns.
        let d = Durations::of([&histogram([5, 7, 7, 9])]);
        assert_eq!((d.percentile(0.5), d.percentile(0.75)), (7, 7));
        assert_eq!(Durations::default().percentile(0.5), 0);
    }

    #[test]
    fn merging_threads_adds_counts_and_keeps_extremes() {
        let a = histogram([100, 200]);
        let b = LatencyHistogram {
            tid: 2,
            ..histogram([50, 5_000])
        };
        let empty = LatencyHistogram::default();
        let d = Durations::of([&empty, &a, &b]);
        assert_eq!(
            (d.count, d.sum_ns, d.min_ns, d.max_ns),
            (4, 5_350, 50, 5_000)
        );
        assert_eq!(d.buckets.values().sum::<u64>(), 4);
        assert_eq!(d, Durations::of([&b, &a]));
    }

    #[test]
    fn rows_are_powers_of_two_or_quarters_of_them() {
        // 1 ms and 3 ms lie in 3 powers of two (2^19..2^21): quarters of them, from the
        // last quarter of 2^19 to the second of 2^21.
        let d = Durations::of([&histogram([1_000_000, 1_000_000, 3_000_000])]);
        let rows = d.rows();
        let edges = |r: &Row| (r.lo_ns, r.hi_ns, r.count);
        assert_eq!(rows.len(), 7);
        assert_eq!(edges(&rows[0]), (917_504, 1_048_576, 2));
        assert_eq!(edges(&rows[1]), (1_048_576, 1_310_720, 0));
        assert_eq!(edges(&rows[6]), (2_621_440, 3_145_728, 1));
        assert!(rows.windows(2).all(|w| w[0].hi_ns == w[1].lo_ns));
        // 1 ms and 10 ms lie in 5 (2^19..2^23): a row each.
        let d = Durations::of([&histogram([1_000_000, 10_000_000])]);
        assert_eq!(d.rows().len(), 5);
        // 1 µs to 1 s: one row per power of two, from 2^9 to 2^29.
        let d = Durations::of([&histogram([1_000, 1_000_000_000])]);
        let rows = d.rows();
        assert_eq!(rows.len(), 21);
        assert_eq!((rows[0].lo_ns, rows[0].hi_ns), (512, 1024));
        assert_eq!((rows[0].count, rows[20].count), (1, 1));
        assert!(rows[1..20].iter().all(|r| r.count == 0));
        assert!(Durations::default().rows().is_empty());
    }

    #[test]
    fn bars_are_drawn_in_eighths() {
        assert_eq!(bar(4, 4, 2), "██");
        assert_eq!(bar(1, 4, 2), "▌");
        assert_eq!(bar(1, 1000, 2), "▏");
        assert_eq!(bar(0, 1000, 2), "");
        assert_eq!(bar(5, 8, 1), "▋");
    }
}
