//! The `lanalyze` command line: modes, errors, and damaged captures.

use assert_cmd::Command;
use lrec_format::{CaptureWriter, End, Header, Record, Sample, ThreadName};

fn lanalyze() -> Command {
    Command::cargo_bin("lanalyze").unwrap()
}

/// A capture with two kernel-thread samples (no user registers, no mappings).
fn small_capture(with_end: bool) -> Vec<u8> {
    let header = Header {
        arch: "x86_64".into(),
        tool_version: "lrec test".into(),
        ..Header::default()
    };
    let mut w = CaptureWriter::new(Vec::new(), &header).unwrap();
    w.push(&Record::ThreadName(ThreadName {
        pid: 7,
        tid: 7,
        name: "kworker".into(),
    }))
    .unwrap();
    for t in 0..2 {
        w.push(&Record::Sample(Sample {
            time_ns: t,
            pid: 7,
            tid: 7,
            flags: lrec_format::sample_flags::NO_USER_REGS,
            ..Sample::default()
        }))
        .unwrap();
    }
    w.flush().unwrap();
    if with_end {
        w.push(&Record::End(End {
            samples: 2,
            reason: "duration".into(),
            ..End::default()
        }))
        .unwrap();
    }
    w.finish().unwrap()
}

fn write_temp(bytes: &[u8]) -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), bytes).unwrap();
    f
}

#[test]
fn cli_definition_is_valid_and_help_has_examples() {
    let out = lanalyze().arg("--help").assert().success();
    let text = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert!(text.contains("EXAMPLES"), "{text}");
    assert!(text.contains("--flamegraph"));
}

#[test]
fn not_a_capture_is_a_clear_error() {
    let f = write_temp(b"#!/bin/sh\necho this is not a capture\n");
    let out = lanalyze().arg(f.path()).assert().failure();
    let err = String::from_utf8(out.get_output().stderr.clone()).unwrap();
    assert!(err.contains("not an lrec capture"), "{err}");
    assert!(err.contains("hint:"), "{err}");
}

#[test]
fn missing_file_is_a_clear_error() {
    let out = lanalyze().arg("/nonexistent/x.lrec").assert().failure();
    let err = String::from_utf8(out.get_output().stderr.clone()).unwrap();
    assert!(
        err.contains("cannot read capture /nonexistent/x.lrec"),
        "{err}"
    );
}

#[test]
fn modes_are_exclusive() {
    let f = write_temp(&small_capture(true));
    lanalyze()
        .arg(f.path())
        .args(["--folded", "--info"])
        .assert()
        .failure();
}

#[test]
fn folded_of_a_complete_capture() {
    let f = write_temp(&small_capture(true));
    let out = lanalyze()
        .arg(f.path())
        .args(["--folded", "--offline"])
        .assert()
        .success();
    assert_eq!(
        String::from_utf8(out.get_output().stdout.clone()).unwrap(),
        "kworker 2\n"
    );
    let out = lanalyze()
        .arg(f.path())
        .args(["--folded", "--offline", "--no-thread-names"])
        .assert()
        .success();
    assert_eq!(
        String::from_utf8(out.get_output().stdout.clone()).unwrap(),
        "[unknown] 2\n"
    );
}

#[test]
fn capture_cut_short_still_succeeds_with_one_warning() {
    let mut bytes = small_capture(true);
    bytes.truncate(bytes.len() - 5); // inside the end record's chunk
    let f = write_temp(&bytes);
    let out = lanalyze()
        .arg(f.path())
        .args(["--folded", "--offline"])
        .assert()
        .success();
    let stdout = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    let stderr = String::from_utf8(out.get_output().stderr.clone()).unwrap();
    assert_eq!(stdout, "kworker 2\n");
    assert!(stderr.contains("cut short"), "{stderr}");
    assert_eq!(stderr.matches("no end record").count(), 1, "{stderr}");
}

#[test]
fn default_mode_is_a_summary_with_a_hint() {
    let f = write_temp(&small_capture(true));
    let out = lanalyze().arg(f.path()).arg("--offline").assert().success();
    let text = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert!(text.contains("total:         2"), "{text}");
    assert!(text.contains("kworker"), "{text}");
    assert!(text.contains("hint:"), "{text}");
}

#[test]
fn flamegraph_and_top_write_files() {
    let f = write_temp(&small_capture(true));
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("fg.svg");
    lanalyze()
        .arg(f.path())
        .args(["--flamegraph", "--offline", "-o"])
        .arg(&svg)
        .assert()
        .success();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("<svg") && text.contains("kworker"));
    let out = lanalyze()
        .arg(f.path())
        .args(["--top", "5", "--offline"])
        .assert()
        .success();
    let text = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert!(text.contains("FUNCTION"), "{text}");
}
