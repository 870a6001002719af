//! `lanalyze --latency` over a synthetic capture of `lrec --latency work --latency
//! parse,json --node-loop --latency-events` whose durations are known: the report, its
//! CSV (values within 3 % of the truth), `--per-thread`, stripped captures, `--info`,
//! `--firefox`, and the error for a capture without latency measurements.

use std::path::Path;

use assert_cmd::Command;
use lrec_format::{
    latency_bucket, latency_kind, CaptureWriter, End, Header, Latency, LatencyCall,
    LatencyHistogram, LatencyProbe, Record, ThreadName,
};

const START_NS: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;

fn lanalyze() -> Command {
    Command::cargo_bin("lanalyze").unwrap()
}

/// The histogram of `values` (ns) of probe `probe` in thread 7/`tid`, as lrec counts them.
fn histogram(probe: u32, tid: u32, values: impl IntoIterator<Item = u64>) -> LatencyHistogram {
    let mut h = LatencyHistogram {
        probe,
        pid: 7,
        tid,
        min_ns: u64::MAX,
        ..LatencyHistogram::default()
    };
    for v in values {
        h.count += 1;
        h.sum_ns += v;
        h.min_ns = h.min_ns.min(v);
        h.max_ns = h.max_ns.max(v);
        match h.buckets.iter_mut().find(|(b, _)| *b == latency_bucket(v)) {
            Some((_, n)) => *n += 1,
            None => h.buckets.push((latency_bucket(v), 1)),
        }
    }
    h.buckets.sort_unstable();
    h
}

fn probe(id: u32, name: &str, kind: u8) -> LatencyProbe {
    LatencyProbe {
        id,
        name: name.into(),
        kind,
        ..LatencyProbe::default()
    }
}

/// `work`: 500 calls of 1 ms in thread `app` (7/7) and 500 of 10 ms in `worker` (7/8);
/// `parse,json`: 1 µs to 1 ms in steps of 1 µs, stopped at 2.5 s; a Node.js loop in
/// `app` whose 100 iterations of 10 ms spend 1 ms in timers, 8 ms in poll, 0.5 ms in check.
fn latency() -> Latency {
    let mut work = probe(0, "work", latency_kind::FUNCTION);
    (work.hits, work.abandoned, work.open) = (1003, 2, 1);
    let mut parse = probe(1, "parse,json", latency_kind::FUNCTION);
    parse.hits = 1000;
    (parse.stopped_ns, parse.stopped_rate) = (Some(START_NS + 2_500 * MS), 48_000);
    let phase = |id, name, ns| {
        let p = probe(id, &format!("node loop: {name}"), latency_kind::PHASE);
        (p, histogram(id, 7, (0..100).map(move |_| ns)))
    };
    let phases = [
        phase(2, "timers", MS),
        phase(3, "poll", 8 * MS),
        phase(4, "check", MS / 2),
    ];
    let mut probes = vec![work, parse];
    probes.extend(phases.iter().map(|(p, _)| p.clone()));
    probes.push(probe(5, "node loop: iteration", latency_kind::ITERATION));
    let mut histograms = vec![
        histogram(0, 7, (0..500).map(|_| MS)),
        histogram(0, 8, (0..500).map(|_| 10 * MS)),
        histogram(1, 7, (1..=1000).map(|i| i * 1000)),
        histogram(5, 7, (0..100).map(|_| 10 * MS)),
    ];
    histograms.extend(phases.into_iter().map(|(_, h)| h));
    Latency {
        max_rate: 5000,
        probes,
        histograms,
        unresolved: vec!["nosuch: no function named nosuch in /usr/bin/app".into()],
    }
}

/// A capture without samples: header, thread names, two timed calls of `work` in thread
/// 7/9 (never sampled), the latency record (unless `with_latency` is false) and the end.
fn capture(with_latency: bool) -> tempfile::NamedTempFile {
    let header = Header {
        arch: "x86_64".into(),
        tool_version: "lrec test".into(),
        command_line: vec!["lrec".into(), "--latency".into(), "work".into()],
        monotonic_start_ns: START_NS,
        target_pid: 7,
        ..Header::default()
    };
    let mut w = CaptureWriter::new(Vec::new(), &header).unwrap();
    for (tid, name) in [(7, "app"), (8, "worker"), (9, "timer")] {
        let name = name.into();
        w.push(&ThreadName { pid: 7, tid, name }.into()).unwrap();
    }
    if with_latency {
        for start in [START_NS + MS, START_NS + 5 * MS] {
            let call = LatencyCall {
                probe: 0,
                pid: 7,
                tid: 9,
                start_ns: start,
                duration_ns: 2 * MS,
            };
            w.push(&Record::LatencyCall(call)).unwrap();
        }
        w.push(&Record::Latency(latency())).unwrap();
    }
    let end = End {
        reason: "duration".into(),
        ..End::default()
    };
    w.push(&end.into()).unwrap();
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), w.finish().unwrap()).unwrap();
    f
}

/// Runs `lanalyze CAPTURE --offline ARGS`, which must succeed, and returns its stdout.
fn run(capture: &Path, args: &[&str]) -> String {
    let out = lanalyze()
        .arg(capture)
        .arg("--offline")
        .args(args)
        .assert()
        .success();
    String::from_utf8(out.get_output().stdout.clone()).unwrap()
}

/// Whether `field` (µs) is within 3 % of `want_us`.
fn near(field: &str, want_us: f64) -> bool {
    let got: f64 = field.parse().unwrap();
    (got - want_us).abs() <= 0.03 * want_us
}

#[test]
fn report_has_percentiles_histograms_pairing_and_the_node_loop() {
    let f = capture(true);
    let text = run(f.path(), &["--latency"]);
    eprintln!("{text}");
    assert!(
        text.starts_with("2,400 calls timed by 6 probes in 2 threads\n"),
        "{text}"
    );
    assert!(
        text.contains("warning: not timed: nosuch: no function"),
        "{text}"
    );
    let row = |name: &str| {
        let prefix = format!("{name} ");
        text.lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no row {name}: {text}"))
            .split_whitespace()
            .skip(name.split_whitespace().count())
            .collect::<Vec<_>>()
            .join(" ")
    };
    // count, p50, p90, p99, max, mean: the 500th of 1,000 is the last 1 ms.
    assert_eq!(row("work"), "1,000 1.02 ms 10.0 ms 10.0 ms 10.0 ms 5.50 ms");
    // Rows of a power of two, half the calls in the first and the last.
    let work = &text[text.find("\nwork ").unwrap()..text.find("\n  work:").unwrap()];
    let bars: Vec<&str> = work.lines().skip(2).collect();
    assert_eq!(bars.len(), 5, "{work}");
    for i in [0, 4] {
        assert!(
            bars[i].contains(&format!("{}  500   50.0 %", "█".repeat(40))),
            "{work}"
        );
    }
    assert!(bars[0].starts_with("     524 µs .. 1.05 ms "), "{work}");
    assert!(bars[1].ends_with("  0    0.0 %"), "{work}");
    assert!(
        text.contains(
            "  work: 1,003 calls seen; 2 entries never returned: longjmp/exception; \
             1 still running at the end\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "parse,json: probing stopped after 2.5 s: called 48,000 times/s, above \
             --latency-max-rate 5,000"
        ),
        "{text}"
    );
    let node = &text[text.find("Node.js event loop (per thread)").expect(&text)..];
    assert!(
        node.contains("app (pid 7, tid 7): 100 iterations, 10.0 ms each on average"),
        "{node}"
    );
    assert!(node.contains("timers "), "{node}");
    let phases: Vec<&str> = node.lines().skip(3).take(3).collect();
    assert!(phases[0].starts_with("    timers "), "{node}");
    assert!(phases[0].contains(" 100 ms  10.0 % "), "{node}");
    assert!(phases[1].starts_with("    poll "), "{node}");
    assert!(phases[2].starts_with("    check "), "{node}");
    assert!(
        node.contains("phases add up to 95.0 % of the loop time"),
        "{node}"
    );
}

#[test]
fn csv_has_the_documented_columns_and_values_within_3_percent() {
    let f = capture(true);
    let text = run(f.path(), &["--latency", "--csv"]);
    let mut lines = text.lines();
    assert_eq!(
        lines.next().unwrap(),
        "function,count,p50_us,p90_us,p99_us,max_us,min_us,mean_us,total_us,kind,pid,tid"
    );
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 6, "{text}");
    let work: Vec<&str> = rows[0].split(',').collect();
    assert_eq!(work[..2], ["work", "1000"]);
    assert!(
        near(work[2], 1000.0) && near(work[4], 10_000.0),
        "{}",
        rows[0]
    );
    assert_eq!(
        work[5..],
        [
            "10000.000",
            "1000.000",
            "5500.000",
            "5500000.000",
            "function",
            "",
            ""
        ]
    );
    // A name with a comma is quoted; 1 µs .. 1 ms, uniform.
    assert!(rows[1].starts_with("\"parse,json\",1000,"), "{}", rows[1]);
    let parse: Vec<&str> = rows[1]["\"parse,json\",".len()..].split(',').collect();
    assert!(near(parse[1], 500.0) && near(parse[2], 900.0) && near(parse[3], 990.0));
    assert!(rows[2].starts_with("node loop: timers,100,"), "{}", rows[2]);
    assert!(rows[2].ends_with(",100000.000,phase,,"), "{}", rows[2]);
    assert!(rows[5].contains(",iteration,"), "{}", rows[5]);
}

#[test]
fn per_thread_splits_rows_by_thread() {
    let f = capture(true);
    let csv = run(f.path(), &["--latency", "--csv", "--per-thread"]);
    let work: Vec<Vec<&str>> = csv
        .lines()
        .filter(|l| l.starts_with("work,"))
        .map(|l| l.split(',').collect())
        .collect();
    assert_eq!(work.len(), 2, "{csv}");
    assert_eq!((work[0][1], work[0][10], work[0][11]), ("500", "7", "7"));
    assert!(near(work[0][2], 1000.0) && near(work[0][4], 1000.0));
    assert_eq!((work[1][1], work[1][10], work[1][11]), ("500", "7", "8"));
    assert!(near(work[1][2], 10_000.0) && near(work[1][4], 10_000.0));

    let text = run(f.path(), &["--latency", "--per-thread"]);
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("work ")).collect();
    assert_eq!(rows.len(), 2, "{text}");
    assert!(rows[0].contains(" 7        7  app "), "{text}");
    assert!(rows[1].contains(" 7        8  worker "), "{text}");
    // --tid keeps one thread.
    let csv = run(f.path(), &["--latency", "--csv", "--tid", "8"]);
    assert!(
        csv.lines().nth(1).unwrap().starts_with("work,500,"),
        "{csv}"
    );
}

#[test]
fn stripped_captures_report_the_same_bytes() {
    let f = capture(true);
    let dir = tempfile::tempdir().unwrap();
    let stripped = dir.path().join("stripped.lrec");
    lanalyze()
        .arg(f.path())
        .args(["--offline", "--strip", "-o"])
        .arg(&stripped)
        .assert()
        .success();
    for args in [
        &["--latency"][..],
        &["--latency", "--per-thread"],
        &["--latency", "--csv", "--per-thread"],
    ] {
        assert_eq!(run(f.path(), args), run(&stripped, args), "{args:?}");
    }
}

#[test]
fn info_and_firefox_show_the_latencies() {
    let f = capture(true);
    let info = run(f.path(), &["--info"]);
    assert!(
        info.contains("latency (6 probes; --latency shows more)"),
        "{info}"
    );
    let work = info
        .lines()
        .find(|l| l.starts_with("  work "))
        .expect(&info);
    assert!(
        work.contains("1,000 calls  p50   1.02 ms  p99   10.0 ms"),
        "{info}"
    );

    let json = run(f.path(), &["--firefox"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let threads = v["threads"].as_array().unwrap();
    // Thread 9 was never sampled: a track is made for its timed calls.
    let timer = threads.iter().find(|t| t["tid"] == "9").expect(&json);
    assert_eq!(timer["name"], "timer");
    let markers = &timer["markers"];
    assert_eq!(markers["length"], 2);
    let name = markers["name"][0].as_u64().unwrap() as usize;
    assert_eq!(timer["stringArray"][name], "work");
    // 1 ms to 3 ms and 5 ms to 7 ms after the start, in milliseconds.
    assert_eq!(markers["startTime"], serde_json::json!([1.0, 5.0]));
    assert_eq!(markers["endTime"], serde_json::json!([3.0, 7.0]));
}

#[test]
fn a_capture_without_latency_says_how_to_record_it() {
    let f = capture(false);
    let out = lanalyze().arg(f.path()).arg("--latency").assert().failure();
    let err = String::from_utf8(out.get_output().stderr.clone()).unwrap();
    assert!(err.contains("holds no latency measurements"), "{err}");
    assert!(
        err.contains("lrec --latency SYMBOL") && err.contains("lrec --node-loop"),
        "{err}"
    );
    // --help says what --latency shows and what it needs.
    let out = lanalyze().arg("--help").assert().success();
    let help = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    for needed in [
        "--latency",
        "--per-thread",
        "`lrec --latency SYMBOL`",
        "`lrec --node-loop`",
    ] {
        assert!(help.contains(needed), "{needed}: {help}");
    }
    // --per-thread belongs to --latency, --csv to --states or --latency.
    lanalyze()
        .arg(f.path())
        .arg("--per-thread")
        .assert()
        .failure();
    lanalyze().arg(f.path()).arg("--csv").assert().failure();
}
