//! Issue 11: `lrec --latency` and `--node-loop` against the truth the workloads measure
//! themselves (fixtures/workloads/latency.c, fixtures/workloads/node/loop.js).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use lrec_e2e::*;

/// `truth NAME k=v … tid=T` lines: (NAME, tid) → k → v.
fn truths(stdout: &[u8]) -> BTreeMap<(String, String), BTreeMap<String, String>> {
    let text = String::from_utf8_lossy(stdout);
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("truth ")) {
        let mut words = line.split_whitespace().skip(1);
        let name = words.next().unwrap().to_string();
        let kv: BTreeMap<String, String> = words
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let tid = kv.get("tid").cloned().unwrap_or_default();
        out.insert((name, tid), kv);
    }
    out
}

/// `lanalyze CAP --latency --csv [--per-thread]`: one map per row, by column name.
fn latency_csv(cap: &Path, per_thread: bool) -> Vec<BTreeMap<String, String>> {
    let mut args = vec![cap.as_os_str(), "--latency".as_ref(), "--csv".as_ref()];
    if per_thread {
        args.push("--per-thread".as_ref());
    }
    let text = String::from_utf8(lanalyze(&args)).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("a CSV header").split(',').collect();
    assert_eq!(
        header[..6],
        ["function", "count", "p50_us", "p90_us", "p99_us", "max_us"],
        "{text}"
    );
    lines
        .map(|l| {
            // Function names here hold no commas or quotes.
            header
                .iter()
                .zip(l.split(','))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

fn num(row: &BTreeMap<String, String>, key: &str) -> f64 {
    row[key]
        .parse()
        .unwrap_or_else(|_| panic!("{key} of {row:?}"))
}

fn within(got: f64, want: f64, tolerance: f64, what: &str) {
    eprintln!(
        "{what}: {got:.1} vs truth {want:.1} ({:+.2} %)",
        100.0 * (got - want) / want
    );
    assert!(
        (got - want).abs() <= tolerance * want,
        "{what}: {got} is not within {:.0} % of {want}",
        tolerance * 100.0
    );
}

/// A lrec summary line `lrec: latency NAME: …` as its text.
fn summary_line<'a>(stderr: &'a str, name: &str) -> &'a str {
    let prefix = format!("lrec: latency {name}: ");
    stderr
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no summary of {name} in: {stderr}"))
}

#[test]
fn c_function_latencies_match_the_truth_per_thread() {
    let Some(_guard) = bpf_test("c_function_latencies_match_the_truth_per_thread") else {
        return;
    };
    let dir = tempfile_dir("latency");
    let cap = dir.join("mixed.lrec");
    // slow_op is a local (static) symbol; recurse nests; escape_op never returns.
    let out = run(Command::new(bin("lrec"))
        .args(["-F", "99", "--latency", "slow_op", "--latency", "recurse"])
        .args(["--latency", "latency:escape_op", "-o"])
        .arg(&cap)
        .arg("--")
        .arg(fixture("latency"))
        .args(["mixed", "4"]));
    let truth = truths(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let rows = latency_csv(&cap, true);
    let mut threads = 0;
    for ((name, tid), t) in &truth {
        let function = match name.as_str() {
            "slow_op" => "slow_op",
            "recurse" => "recurse",
            _ => continue,
        };
        let row = rows
            .iter()
            .find(|r| r["function"] == function && r["tid"] == *tid)
            .unwrap_or_else(|| panic!("no row for {function} in thread {tid}: {rows:?}"));
        // Every call timed, each paired with its own entry: the counts are exact.
        assert_eq!(row["count"], t["calls"], "{function} calls in thread {tid}");
        for q in ["p50_us", "p99_us"] {
            let want: f64 = t[q].parse().unwrap();
            let what = format!("{function} {q} thread {tid}");
            // Medians that fall between two groups of equally many calls: recurse nests
            // calls of 1, 2, 3 and 4 ms (between the 2 and 3 ms ones), slow_op alternates
            // 1 and 10 ms. There one call the loaded machine stretched (a 2 ms call taking
            // 2.4 ms) moves the median far, in the workload's own timing or in lrec's,
            // whose histogram buckets span the gap (CI once read slow_op's as 1458 µs
            // against the workload's 1807). Between the two groups is right; so is
            // agreeing with the workload's own median when the load moved that out of the
            // band (CI once read recurse's as 4014 µs against its 4010).
            let gap = match (function, q) {
                ("recurse", "p50_us") => Some(1800.0..=3300.0),
                ("slow_op", "p50_us") => Some(900.0..=10500.0),
                _ => None,
            };
            if let Some(gap) = gap {
                let got = num(row, q);
                eprintln!("{what}: {got:.1} vs truth {want:.1} (in {gap:?} µs)");
                let agrees = (got - want).abs() <= 0.10 * want;
                assert!(agrees || gap.contains(&got), "{what}: {got}");
                continue;
            }
            within(num(row, q), want, 0.10, &what);
        }
        threads += usize::from(function == "slow_op");
    }
    assert_eq!(threads, 2, "two workers: {truth:?}");
    // Nothing mispaired: no return without its entry; every escape counted as never
    // returned (or still open when the target exited).
    let escapes: u64 = truth
        .iter()
        .filter(|((n, _), _)| n == "escape")
        .map(|(_, t)| t["calls"].parse::<u64>().unwrap())
        .sum();
    for name in ["slow_op", "recurse"] {
        let line = summary_line(&stderr, name);
        assert!(!line.contains("without their entry"), "{line}");
        assert!(!line.contains("never returned"), "{line}");
    }
    let line = summary_line(&stderr, "latency:escape_op");
    assert!(line.contains(": 0 calls timed"), "{line}");
    let lost: u64 = [" never returned", " still open"]
        .iter()
        .filter_map(|what| {
            let end = line.find(what)?;
            let start = line[..end].rfind(' ')? + 1;
            line[start..end].parse::<u64>().ok()
        })
        .sum();
    assert_eq!(lost, escapes, "{line}");
    // The table of all threads, with its histograms.
    let text = String::from_utf8(lanalyze(&[cap.as_os_str(), "--latency".as_ref()])).unwrap();
    assert!(
        text.contains("slow_op") && text.contains("recurse"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn stripped_code_is_timed_by_address() {
    let Some(_guard) = bpf_test("stripped_code_is_timed_by_address") else {
        return;
    };
    let nm = run(Command::new("nm").arg(fixture("latency")));
    let nm = String::from_utf8_lossy(&nm.stdout);
    let addr = nm
        .lines()
        .find(|l| l.ends_with(" slow_op"))
        .and_then(|l| u64::from_str_radix(l.split(' ').next()?, 16).ok())
        .expect("slow_op in latency's symbols");
    let dir = tempfile_dir("latency");
    let cap = dir.join("stripped.lrec");
    let out = run(Command::new(bin("lrec"))
        .arg("--latency")
        .arg(format!("latency-stripped:{addr:#x}"))
        .arg("--latency")
        .arg(format!("latency-stripped:{:#x}", addr + 1))
        .arg("-o")
        .arg(&cap)
        .arg("--")
        .arg(fixture("latency-stripped"))
        .args(["alternate", "41"]));
    let truth = truths(&out.stdout);
    let t = truth.values().next().expect("a truth line");
    let rows = latency_csv(&cap, false);
    let row = rows
        .iter()
        .find(|r| r["function"] == format!("latency-stripped:{addr:#x}"))
        .unwrap_or_else(|| panic!("{rows:?}"));
    assert_eq!(row["count"], t["calls"]);
    // 21 calls of 1 ms and 20 of 10 ms: the median is the longest 1 ms call. The workload
    // times each call around it, lrec between its probes inside it, so a preemption just
    // outside the function (a loaded CI machine once added 160 µs there) stretches the
    // truth's longest 1 ms call and not lrec's: the median lies between the 1 ms the
    // function spins and the truth's.
    let (got, want) = (num(row, "p50_us"), t["p50_us"].parse::<f64>().unwrap());
    eprintln!("p50_us: {got:.1} vs truth {want:.1} (between 960: 1 ms less a bucket, and the truth + 10 %)");
    assert!(
        (960.0..=want * 1.10).contains(&got),
        "p50_us: {got}, truth {want}"
    );
    within(
        num(row, "p99_us"),
        t["p99_us"].parse().unwrap(),
        0.10,
        "p99_us",
    );
    // An address inside a function is refused: a return probe there would corrupt the
    // target's stack.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no function begins at"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_hot_function_is_stopped_and_said_so() {
    let Some(_guard) = bpf_test("a_hot_function_is_stopped_and_said_so") else {
        return;
    };
    let dir = tempfile_dir("latency");
    let cap = dir.join("hot.lrec");
    let out = run(Command::new(bin("lrec"))
        .args(["--latency", "tiny", "-o"])
        .arg(&cap)
        .arg("--")
        .arg(fixture("latency"))
        .args(["hot", "3"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("above --latency-max-rate 10000"),
        "{stderr}"
    );
    assert!(
        summary_line(&stderr, "tiny").contains("STOPPED"),
        "{stderr}"
    );
    // In the capture too.
    let text = String::from_utf8(lanalyze(&[cap.as_os_str(), "--latency".as_ref()])).unwrap();
    assert!(text.contains("--latency-max-rate"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn node_loop_phases_match_the_truth() {
    let Some(_guard) = bpf_test("node_loop_phases_match_the_truth") else {
        return;
    };
    let Some(node) = installed("/usr/bin/node", "the node loop test") else {
        return;
    };
    let dir = tempfile_dir("latency");
    let cap = dir.join("node.lrec");
    let script = root().join("fixtures/workloads/node/loop.js");
    let out = run(Command::new(bin("lrec"))
        .args(["--node-loop", "-q", "-o"])
        .arg(&cap)
        .arg("--")
        .arg(node)
        .arg(script)
        .arg("4"));
    let truth = truths(&out.stdout);
    let get = |name: &str, key: &str| -> f64 {
        let (_, t) = truth
            .iter()
            .find(|((n, _), _)| n == name)
            .unwrap_or_else(|| panic!("no truth {name}: {truth:?}"));
        t[key].parse().unwrap()
    };
    let rows = latency_csv(&cap, false);
    let total_ms = |name: &str| -> f64 {
        let row = rows
            .iter()
            .find(|r| r["function"] == format!("node loop: {name}"))
            .unwrap_or_else(|| panic!("no node loop: {name} in {rows:?}"));
        num(row, "total_us") / 1000.0
    };
    // The callbacks' own time, measured inside them, against the phases that run them
    // (the phases also hold libuv's and node's work around the callbacks).
    within(
        total_ms("timers"),
        get("timers", "total_ms"),
        0.10,
        "timers ms",
    );
    within(
        total_ms("check"),
        get("check", "total_ms"),
        0.10,
        "check ms",
    );
    let phases: f64 = [
        "pending",
        "idle",
        "prepare",
        "poll",
        "pending (after poll)",
        "check",
        "closing",
        "timers",
    ]
    .iter()
    .map(|p| total_ms(p))
    .sum();
    within(phases, total_ms("iteration"), 0.05, "phases vs loop time");
    let _ = std::fs::remove_dir_all(&dir);
}
