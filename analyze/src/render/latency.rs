//! What `lrec --latency` and `--node-loop` timed (`lanalyze CAPTURE --latency`): per
//! probe, the count and percentiles of its durations with a histogram drawn in the
//! terminal, how calls paired, and for Node.js where each thread's event loop spends its
//! iterations; or the same numbers as CSV.

mod histogram;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};

use lrec_format::{latency_kind, LatencyHistogram, LatencyProbe};

pub use histogram::{bar, Durations, Row};

use super::csv;
use crate::Latencies;

/// Characters of the widest bar of a drawn histogram.
const BAR_WIDTH: usize = 40;
/// The prefix of `--node-loop`'s probe names, left out in the loop's table.
const NODE_LOOP: &str = "node loop: ";

/// The durations of one row of the table: a probe, merged over its threads or of one
/// thread (`--per-thread`).
struct Line<'a> {
    probe: &'a LatencyProbe,
    /// (pid, tid), with `--per-thread`.
    thread: Option<(u32, u32)>,
    durations: Durations,
}

/// The probes in id order (a loop's phases in loop order), each merged over its threads
/// or, with `per_thread`, split by (pid, tid); a probe that timed nothing has one line.
fn lines(l: &Latencies, per_thread: bool) -> Vec<Line<'_>> {
    let mut probes: Vec<&LatencyProbe> = l.record.probes.iter().collect();
    probes.sort_by_key(|p| p.id);
    let mut lines = Vec::new();
    for probe in probes {
        let mut threads: BTreeMap<Option<(u32, u32)>, Durations> = BTreeMap::new();
        for h in l.record.histograms.iter().filter(|h| h.probe == probe.id) {
            let thread = per_thread.then_some((h.pid, h.tid));
            threads.entry(thread).or_default().add(h);
        }
        if threads.is_empty() {
            threads.insert(None, Durations::default());
        }
        lines.extend(threads.into_iter().map(|(thread, durations)| Line {
            probe,
            thread,
            durations,
        }));
    }
    lines
}

/// Writes the latency report: a table of probes with their percentiles, a histogram
/// under each function, how calls paired, and the Node.js event loop per thread.
pub fn write_latency(l: &Latencies, per_thread: bool, out: &mut dyn Write) -> io::Result<()> {
    let lines = lines(l, per_thread);
    let threads: BTreeSet<(u32, u32)> =
        l.record.histograms.iter().map(|h| (h.pid, h.tid)).collect();
    let calls: u64 = l.record.histograms.iter().map(|h| h.count).sum();
    writeln!(
        out,
        "{} timed by {} in {}",
        counted(calls, "call"),
        counted(l.record.probes.len() as u64, "probe"),
        counted(threads.len() as u64, "thread")
    )?;
    for u in &l.record.unresolved {
        writeln!(out, "warning: not timed: {u}")?;
    }
    let name_width = lines
        .iter()
        .map(|line| line.probe.name.chars().count())
        .max()
        .unwrap_or(0)
        .clamp(5, 48);
    let thread_width = l
        .thread_names
        .values()
        .map(|n| n.chars().count())
        .max()
        .unwrap_or(0)
        .clamp(6, 24);
    writeln!(out)?;
    write!(out, "{:<name_width$}", "PROBE")?;
    if per_thread {
        write!(
            out,
            " {:>8} {:>8}  {:<thread_width$}",
            "PID", "TID", "THREAD"
        )?;
    }
    writeln!(
        out,
        " {:>11} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "COUNT", "P50", "P90", "P99", "MAX", "MEAN"
    )?;
    for (i, line) in lines.iter().enumerate() {
        let d = &line.durations;
        write!(out, "{:<name_width$}", line.probe.name)?;
        if per_thread {
            let (pid, tid, name) = match line.thread {
                Some((pid, tid)) => {
                    let name = l.thread_names.get(&(pid, tid)).map_or("", String::as_str);
                    (pid.to_string(), tid.to_string(), name)
                }
                None => ("-".into(), "-".into(), "-"),
            };
            write!(out, " {pid:>8} {tid:>8}  {name:<thread_width$}")?;
        }
        let stat = |ns: f64| match d.count {
            0 => "-".to_string(),
            _ => format_ns(ns),
        };
        writeln!(
            out,
            " {:>11} {:>9} {:>9} {:>9} {:>9} {:>9}",
            count(d.count),
            stat(d.percentile(0.5) as f64),
            stat(d.percentile(0.9) as f64),
            stat(d.percentile(0.99) as f64),
            stat(d.max_ns as f64),
            stat(d.mean_ns())
        )?;
        if line.probe.kind == latency_kind::FUNCTION {
            write_histogram(d, out)?;
        }
        let last_of_probe = lines.get(i + 1).is_none_or(|n| n.probe.id != line.probe.id);
        if last_of_probe {
            write_pairing(line.probe, l, out)?;
            // A blank line after each function's histograms.
            if line.probe.kind == latency_kind::FUNCTION && d.count > 0 {
                writeln!(out)?;
            }
        }
    }
    write_node_loop(l, out)
}

/// The histogram of `d` in rows of a power of two (or a quarter of one), each with a bar,
/// its count and its share of all calls.
fn write_histogram(d: &Durations, out: &mut dyn Write) -> io::Result<()> {
    let rows = d.rows();
    let total: u64 = rows.iter().map(|r| r.count).sum();
    let most = rows.iter().map(|r| r.count).max().unwrap_or(0);
    let width = rows.iter().map(|r| count(r.count).len()).max().unwrap_or(1);
    for r in &rows {
        writeln!(
            out,
            "  {:>9} .. {:<9}  {:<BAR_WIDTH$}  {:>width$}  {:>5.1} %",
            format_ns(r.lo_ns as f64),
            format_ns(r.hi_ns as f64),
            bar(r.count, most, BAR_WIDTH),
            count(r.count),
            100.0 * r.count as f64 / total as f64
        )?;
    }
    Ok(())
}

/// How a probe's entries and returns paired, where it matters, and whether lrec stopped
/// probing it.
fn write_pairing(p: &LatencyProbe, l: &Latencies, out: &mut dyn Write) -> io::Result<()> {
    // For a phase, an "unmatched return" is its closing event after another than the one
    // that opens it (the first iteration, a loop left early): not timed.
    let unmatched = match p.kind {
        latency_kind::FUNCTION => "returns without a seen entry",
        _ => "ends not preceded by their start (not timed)",
    };
    let counts = [
        (p.hits, "calls seen"),
        (p.unmatched_returns, unmatched),
        (p.abandoned, "entries never returned: longjmp/exception"),
        (p.open, "still running at the end"),
        (p.too_deep, "too deeply nested to time"),
        (p.dropped, "dropped: lrec's histogram table was full"),
    ];
    let said: Vec<String> = counts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{} {what}", count(*n)))
        .collect();
    // Calls seen alone say nothing the count does not.
    if said.len() > 1 || p.hits == 0 && !said.is_empty() {
        writeln!(out, "  {}: {}", p.name, said.join("; "))?;
    }
    if let Some(stopped) = p.stopped_ns {
        writeln!(
            out,
            "  !!! {}: probing stopped after {:.1} s: called {} times/s, above \
             --latency-max-rate {}; later calls are not counted",
            p.name,
            stopped.saturating_sub(l.start_ns) as f64 / 1e9,
            count(p.stopped_rate),
            count(l.record.max_rate)
        )?;
    }
    Ok(())
}

/// Per thread that ran `--node-loop`'s iterations: their count and mean, and per phase its
/// total time, share of the loop's time, calls, mean, p50 and p99.
fn write_node_loop(l: &Latencies, out: &mut dyn Write) -> io::Result<()> {
    let kind = |h: &LatencyHistogram| {
        let probe = l.record.probes.iter().find(|p| p.id == h.probe);
        probe.map(|p| p.kind)
    };
    let threads: BTreeSet<(u32, u32)> = l
        .record
        .histograms
        .iter()
        .filter(|h| kind(h) == Some(latency_kind::ITERATION))
        .map(|h| (h.pid, h.tid))
        .collect();
    if threads.is_empty() {
        return Ok(());
    }
    let mut phases: Vec<&LatencyProbe> = l
        .record
        .probes
        .iter()
        .filter(|p| p.kind == latency_kind::PHASE)
        .collect();
    phases.sort_by_key(|p| p.id);
    let width = phases
        .iter()
        .map(|p| p.name.trim_start_matches(NODE_LOOP).chars().count())
        .max()
        .unwrap_or(0)
        .max(5);
    writeln!(out)?;
    writeln!(out, "Node.js event loop (per thread)")?;
    for (pid, tid) in threads {
        let of_thread = |h: &&LatencyHistogram| (h.pid, h.tid) == (pid, tid);
        let histograms = l.record.histograms.iter().filter(of_thread);
        let loops = Durations::of(histograms.filter(|h| kind(h) == Some(latency_kind::ITERATION)));
        let name = l.thread_names.get(&(pid, tid)).map_or("?", String::as_str);
        writeln!(
            out,
            "  {name} (pid {pid}, tid {tid}): {} iterations, {} each on average",
            count(loops.count),
            format_ns(loops.mean_ns())
        )?;
        writeln!(
            out,
            "    {:<width$} {:>9} {:>7} {:>11} {:>9} {:>9} {:>9}",
            "PHASE", "TOTAL", "LOOP", "CALLS", "MEAN", "P50", "P99"
        )?;
        let mut phase_total = 0;
        for p in &phases {
            let histograms = l.record.histograms.iter().filter(of_thread);
            let d = Durations::of(histograms.filter(|h| h.probe == p.id));
            phase_total += d.sum_ns;
            writeln!(
                out,
                "    {:<width$} {:>9} {:>7} {:>11} {:>9} {:>9} {:>9}",
                p.name.trim_start_matches(NODE_LOOP),
                format_ns(d.sum_ns as f64),
                share(d.sum_ns, loops.sum_ns),
                count(d.count),
                format_ns(d.mean_ns()),
                format_ns(d.percentile(0.5) as f64),
                format_ns(d.percentile(0.99) as f64)
            )?;
        }
        writeln!(
            out,
            "    phases add up to {} of the loop time",
            share(phase_total, loops.sum_ns)
        )?;
    }
    Ok(())
}

/// Writes one CSV row per probe (per probe and thread with `per_thread`), durations in
/// microseconds.
pub fn write_latency_csv(l: &Latencies, per_thread: bool, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "function,count,p50_us,p90_us,p99_us,max_us,min_us,mean_us,total_us,kind,pid,tid"
    )?;
    let us = |ns: f64| format!("{:.3}", ns / 1e3);
    for line in lines(l, per_thread) {
        let d = &line.durations;
        let stats = match d.count {
            0 => ",,,,,".to_string(),
            _ => [
                d.percentile(0.5) as f64,
                d.percentile(0.9) as f64,
                d.percentile(0.99) as f64,
                d.max_ns as f64,
                d.min_ns as f64,
                d.mean_ns(),
            ]
            .map(us)
            .join(","),
        };
        let (pid, tid) = line
            .thread
            .map_or((String::new(), String::new()), |(p, t)| {
                (p.to_string(), t.to_string())
            });
        writeln!(
            out,
            "{},{},{stats},{},{},{pid},{tid}",
            csv(&line.probe.name),
            d.count,
            us(d.sum_ns as f64),
            kind_name(line.probe.kind)
        )?;
    }
    Ok(())
}

fn kind_name(kind: u8) -> String {
    match kind {
        latency_kind::FUNCTION => "function".into(),
        latency_kind::PHASE => "phase".into(),
        latency_kind::ITERATION => "iteration".into(),
        k => format!("kind {k}"),
    }
}

/// `850 ns`, `1.23 µs`, `12.3 ms`, `123 s`: a duration with three significant digits.
pub fn format_ns(ns: f64) -> String {
    let (value, unit) = match ns {
        n if n < 999.5 => (n, "ns"),
        n if n < 999_500.0 => (n / 1e3, "µs"),
        n if n < 999_500_000.0 => (n / 1e6, "ms"),
        n => (n / 1e9, "s"),
    };
    let decimals = match value {
        _ if unit == "ns" => 0,
        v if v < 9.995 => 2,
        v if v < 99.95 => 1,
        _ => 0,
    };
    format!("{value:.decimals$} {unit}")
}

/// `4,321`: a count with thousands separated.
pub(crate) fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `1 call`, `1,000 calls`.
fn counted(n: u64, what: &str) -> String {
    match n {
        1 => format!("1 {what}"),
        n => format!("{} {what}s", count(n)),
    }
}

/// `12.3 %` of `whole` (`-` when it is 0).
fn share(part: u64, whole: u64) -> String {
    match whole {
        0 => "-".into(),
        w => format!("{:.1} %", 100.0 * part as f64 / w as f64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lrec_format::{latency_bucket, Latency, LatencyHistogram};

    #[test]
    fn durations_have_three_significant_digits_and_counts_separators() {
        let cases = [
            (7.0, "7 ns"),
            (999.0, "999 ns"),
            (999.6, "1.00 µs"),
            (1_234.0, "1.23 µs"),
            (12_345.0, "12.3 µs"),
            (123_456.0, "123 µs"),
            (999_999.0, "1.00 ms"),
            (2_500_000_000.0, "2.50 s"),
            (4_000e9, "4000 s"),
        ];
        for (ns, text) in cases {
            assert_eq!(format_ns(ns), text);
        }
        assert_eq!(
            [0, 999, 1_000, 4_321_000].map(count),
            ["0", "999", "1,000", "4,321,000"]
        );
        assert_eq!(share(1, 3), "33.3 %");
        assert_eq!(share(1, 0), "-");
    }

    /// A probe that timed nothing still has its row; quotes in names are doubled.
    #[test]
    fn csv_rows_of_probes_without_calls_are_empty_and_names_are_quoted() {
        let l = Latencies {
            record: Latency {
                probes: vec![
                    LatencyProbe {
                        id: 1,
                        name: "say \"hi\"".into(),
                        ..LatencyProbe::default()
                    },
                    LatencyProbe {
                        id: 0,
                        name: "idle".into(),
                        kind: latency_kind::PHASE,
                        ..LatencyProbe::default()
                    },
                ],
                histograms: vec![LatencyHistogram {
                    probe: 1,
                    pid: 3,
                    tid: 4,
                    count: 1,
                    sum_ns: 1_500,
                    min_ns: 1_500,
                    max_ns: 1_500,
                    buckets: vec![(latency_bucket(1_500), 1)],
                }],
                ..Latency::default()
            },
            ..Latencies::default()
        };
        let mut out = Vec::new();
        write_latency_csv(&l, true, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let rows: Vec<&str> = text.lines().skip(1).collect();
        assert_eq!(
            rows,
            [
                "idle,0,,,,,,,0.000,phase,,",
                "\"say \"\"hi\"\"\",1,1.500,1.500,1.500,1.500,1.500,1.500,1.500,function,3,4"
            ]
        );
        let mut out = Vec::new();
        write_latency(&l, false, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let idle = text.lines().find(|l| l.starts_with("idle ")).unwrap();
        assert_eq!(
            idle.split_whitespace().collect::<Vec<_>>()[1..],
            ["0", "-", "-", "-", "-", "-"]
        );
        assert!(
            text.starts_with("1 call timed by 2 probes in 1 thread\n"),
            "{text}"
        );
        // No iterations: no event-loop section.
        assert!(!text.contains("Node.js"), "{text}");
    }
}
