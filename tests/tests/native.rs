//! Acceptance 1, 2, 3 and 5 of the native spine: exact stacks against ground truth, offline
//! analysis after the binary is gone, a recorder killed mid-way, no lost samples.

use std::process::{Command, Stdio};
use std::time::Duration;

use lrec_e2e::*;

/// 499 Hz for 5 s on a copy of the workload; then the copy is deleted and `--offline`
/// must give the very same folded stacks.
#[test]
fn native_stacks_are_exact_and_survive_deleting_the_binary() {
    let Some(_guard) = bpf_test("native_stacks_are_exact") else {
        return;
    };
    let dir = tempfile_dir("native");
    let exe = dir.join("native");
    std::fs::copy(fixture("native"), &exe).unwrap();
    let cap = dir.join("native.lrec");
    record_command(&cap, 499, &[exe.as_ref(), "5".as_ref()]);

    let (stacks, _) = folded(&cap, &["--offline"]);
    let exact = score(&stacks, &native_truth());
    assert_exact(&exact, "native at 499 Hz");
    for leaf in [
        "chain_d",
        "compare_ints",
        "recurse_leaf",
        "tail_callee",
        "worker_c",
    ] {
        assert!(
            exact.per_leaf.get(leaf).copied().unwrap_or(0) >= 20,
            "too few samples in {leaf}: {:?}",
            exact.per_leaf
        );
    }

    let with_file = run(Command::new(bin("lanalyze"))
        .arg(&cap)
        .args(["--folded", "--offline"]))
    .stdout;
    std::fs::remove_file(&exe).unwrap();
    let without = run(Command::new(bin("lanalyze"))
        .arg(&cap)
        .args(["--folded", "--offline"]))
    .stdout;
    assert_eq!(
        with_file, without,
        "--offline output changed when the binary was deleted"
    );
    // Without --offline, local debug files (e.g. libc6-dbg) may add names; the stacks
    // must be just as exact.
    let (stacks, _) = folded(&cap, &[]);
    assert_exact(
        &score(&stacks, &native_truth()),
        "native, local debug files allowed",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A signal handler's samples: its frames, the trampoline, then the interrupted stack
/// (unwound from the registers the kernel saved in the signal frame).
#[test]
fn stacks_continue_through_signal_handlers() {
    let Some(_guard) = bpf_test("stacks_continue_through_signal_handlers") else {
        return;
    };
    let dir = tempfile_dir("signals");
    let cap = dir.join("signals.lrec");
    record_command(&cap, 999, &[fixture("signals").as_ref(), "4".as_ref()]);
    for args in [&["--offline"][..], &[]] {
        let (stacks, _) = folded(&cap, args);
        let exact = score(&stacks, &signals_truth());
        assert_exact(&exact, &format!("signals {args:?}"));
        for leaf in ["signal_work", "chain_d"] {
            assert!(
                exact.per_leaf.get(leaf).copied().unwrap_or(0) >= 20,
                "too few samples in {leaf}: {:?}",
                exact.per_leaf
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// lrec SIGKILLed 4 s into a 20 s recording: the capture still holds those seconds.
#[test]
fn capture_of_a_killed_recorder_is_readable_and_exact() {
    let Some(_guard) = bpf_test("capture_of_a_killed_recorder") else {
        return;
    };
    let dir = tempfile_dir("killed");
    let cap = dir.join("killed.lrec");
    let mut target = Command::new(fixture("native"))
        .arg("30")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut lrec = Command::new(bin("lrec"))
        .args([
            "-F",
            "499",
            "-d",
            "20",
            "-q",
            "-p",
            &target.id().to_string(),
            "-o",
        ])
        .arg(&cap)
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(4));
    lrec.kill().unwrap(); // SIGKILL
    lrec.wait().unwrap();
    target.kill().unwrap();
    target.wait().unwrap();

    // Not complete, so not at its name: beside it, under the name lrec wrote it as.
    assert!(
        !cap.exists(),
        "an incomplete capture took the name asked for"
    );
    let partial: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".partial"))
        .collect();
    assert_eq!(partial.len(), 1, "{partial:?}");
    std::fs::rename(&partial[0], &cap).unwrap();
    let (samples, _, warnings) = capture_totals(&cap);
    eprintln!("killed capture: {samples} samples, warnings {warnings:?}");
    // Two busy threads at 499 Hz: ~1000 samples/s, and at most the last second is lost.
    assert!(samples >= 2000, "only {samples} samples survived");
    let (stacks, stderr) = folded(&cap, &[]);
    assert!(
        stderr.contains("cut short"),
        "no cut-short warning: {stderr}"
    );
    assert_exact(&score(&stacks, &native_truth()), "killed recorder");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// 999 Hz with two busy threads: nothing lost.
#[test]
fn no_samples_lost_at_999_hz() {
    let Some(_guard) = bpf_test("no_samples_lost_at_999_hz") else {
        return;
    };
    let dir = tempfile_dir("lost");
    let cap = dir.join("lost.lrec");
    record_command(&cap, 999, &[fixture("native").as_ref(), "3".as_ref()]);
    let (samples, lost, _) = capture_totals(&cap);
    eprintln!("999 Hz: {samples} samples, {lost} lost");
    assert_eq!(lost, 0);
    // ~2 busy threads × 999 Hz × 3 s, on a shared 2-core machine.
    assert!(samples >= 3000, "only {samples} samples");
    let info = run(Command::new(bin("lanalyze")).arg(&cap).arg("--info")).stdout;
    let info = String::from_utf8(info).unwrap();
    assert!(
        info.contains("lost"),
        "--info does not report lost samples:\n{info}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
