//! Issue 9, acceptance 3 and 4: `--diff` of two captures measures the change of a hot
//! function's share; `--strip` removes a secret the target held on its stack and changes
//! no stack; `--time` slices.

use std::path::Path;

use lrec_e2e::*;

/// The secret fixtures/workloads/share.c keeps on its stack.
const SECRET: &[u8] = b"LREC-SECRET-4f1d9a7c-do-not-share";

/// `lanalyze ARGS…`'s output, as text.
fn lanalyze_text(args: &[&std::ffi::OsStr]) -> String {
    String::from_utf8(lanalyze(args)).unwrap()
}

/// `share SECONDS HOT_PERCENT` recorded at 999 Hz (thousands of samples: the share of a
/// function is known to about a point).
fn record_share(cap: &Path, secs: &str, hot_percent: &str) {
    record_command(
        cap,
        999,
        &[
            fixture("share").as_ref(),
            secs.as_ref(),
            hot_percent.as_ref(),
        ],
    );
}

/// In how many chunks of the capture, inflated, `needle` occurs; and in how many bytes
/// of the file as stored.
fn occurrences(cap: &Path, needle: &[u8]) -> (usize, usize) {
    let count = |hay: &[u8]| hay.windows(needle.len()).filter(|w| *w == needle).count();
    let capture = lrec_format::Capture::open(cap).unwrap();
    let in_chunks = capture
        .chunks()
        .iter()
        .map(|c| count(&capture.inflate_chunk(c).expect("chunk inflates")))
        .sum();
    (in_chunks, count(&std::fs::read(cap).unwrap()))
}

#[test]
fn diff_top_measures_the_change_of_share() {
    let Some(_guard) = bpf_test("diff_top_measures_the_change_of_share") else {
        return;
    };
    let dir = tempfile_dir("diff");
    let (before, after) = (dir.join("before.lrec"), dir.join("after.lrec"));
    record_share(&before, "6", "30");
    record_share(&after, "6", "60");
    let top = lanalyze_text(&[
        "--diff".as_ref(),
        before.as_ref(),
        after.as_ref(),
        "--top".as_ref(),
        "10".as_ref(),
    ]);
    eprintln!("{top}");
    let hot = top
        .lines()
        .find(|l| l.ends_with(" hot"))
        .unwrap_or_else(|| panic!("no line for hot in:\n{top}"));
    // SELF%- SELF%+ ΔSELF TOTAL%- TOTAL%+ ΔTOTAL FUNCTION
    let delta: f64 = hot.split_whitespace().nth(2).unwrap()[..]
        .trim_end_matches("pt")
        .parse()
        .unwrap();
    assert!(
        (delta - 30.0).abs() <= 3.0,
        "hot moved from 30 % to 60 % of the CPU time, the diff says {delta:+.2} points"
    );
    let svg = dir.join("diff.svg");
    lanalyze_text(&[
        "--diff".as_ref(),
        before.as_ref(),
        after.as_ref(),
        "--flamegraph".as_ref(),
        "-o".as_ref(),
        svg.as_ref(),
    ]);
    let svg = std::fs::read_to_string(svg).unwrap();
    assert!(
        svg.contains("hot") && svg.contains("<svg"),
        "no differential flame graph"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn strip_removes_the_secret_and_keeps_every_stack() {
    let Some(_guard) = bpf_test("strip_removes_the_secret_and_keeps_every_stack") else {
        return;
    };
    let dir = tempfile_dir("strip");
    let (raw, shared) = (dir.join("raw.lrec"), dir.join("shared.lrec"));
    record_share(&raw, "2", "50");
    let (in_chunks, in_file) = occurrences(&raw, SECRET);
    eprintln!(
        "raw capture: the secret occurs {in_chunks} times in its inflated chunks, \
         {in_file} times in the file as stored"
    );
    assert!(in_chunks > 0, "the workload's secret was never recorded");
    eprintln!("raw capture mode {:o}", mode(&raw));

    lanalyze_text(&[
        raw.as_ref(),
        "--strip".as_ref(),
        "-o".as_ref(),
        shared.as_ref(),
    ]);
    assert_eq!(
        occurrences(&shared, SECRET),
        (0, 0),
        "the stripped capture holds the secret"
    );
    assert_eq!(
        mode(&shared),
        0o600,
        "a stripped capture is private to its owner"
    );
    eprintln!(
        "raw {} bytes, stripped {} bytes",
        std::fs::metadata(&raw).unwrap().len(),
        std::fs::metadata(&shared).unwrap().len()
    );

    for args in [
        &["--folded"][..],
        &["--folded", "--per-pid", "--lines"],
        &["--top", "20"],
        &["--folded", "--time", "0.5..1.5"],
        &["--info"],
        &["--pprof"],
        &["--speedscope"],
        &["--firefox"],
    ] {
        let of = |cap: &Path| {
            let mut a: Vec<&std::ffi::OsStr> = vec![cap.as_ref()];
            a.extend(args.iter().map(std::ffi::OsStr::new));
            lanalyze(&a)
        };
        let (a, b) = (of(&raw), of(&shared));
        assert!(!a.is_empty());
        assert_eq!(
            a, b,
            "lanalyze {args:?} differs between raw and stripped captures"
        );
    }

    // --time keeps the samples of its window, [FROM, TO) after recording started: of the
    // stripped capture, exactly those the raw one holds there (not half of a 2 s run: lrec
    // starts recording before the target runs, later on a loaded machine; 789 of 1997 once),
    // and the windows before, in and after it hold every sample once.
    let count = |time: Option<&str>| -> u64 {
        let mut a: Vec<&std::ffi::OsStr> = vec![shared.as_ref(), "--folded".as_ref()];
        if let Some(t) = time {
            a.push("--time".as_ref());
            a.push(t.as_ref());
        }
        parse_folded(&lanalyze_text(&a)).iter().map(|s| s.1).sum()
    };
    let truth = contents(&raw)
        .offsets_ns
        .iter()
        .filter(|t| (500_000_000..1_500_000_000).contains(*t))
        .count() as u64;
    let all = count(None);
    let (before, window, after) = (
        count(Some("..0.5")),
        count(Some("0.5..1.5")),
        count(Some("1.5..")),
    );
    eprintln!(
        "--time ..0.5 / 0.5..1.5 / 1.5..: {before} / {window} / {after} of {all} samples; \
         the capture holds {truth} in 0.5..1.5"
    );
    assert!(window > 0, "--time 0.5..1.5 kept no sample of a 2 s run");
    assert_eq!(
        window, truth,
        "--time 0.5..1.5 kept {window} samples, the capture holds {truth}"
    );
    assert_eq!(
        before + window + after,
        all,
        "--time ..0.5, 0.5..1.5 and 1.5.. do not split the samples"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
