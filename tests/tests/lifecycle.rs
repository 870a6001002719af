//! Acceptance 4: a target that exits before -d ends, a thread created after attach and a
//! library dlopen'ed after attach are all sampled, unwound and symbolized.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lrec_e2e::*;

#[test]
fn late_threads_dlopen_and_early_exit() {
    let Some(_guard) = bpf_test("late_threads_dlopen_and_early_exit") else {
        return;
    };
    let dir = tempfile_dir("lifecycle");
    let cap = dir.join("lifecycle.lrec");
    let mut target = Command::new(fixture("lifecycle"))
        .arg(fixture("libplugin.so"))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let out = run(Command::new(bin("lrec"))
        .args([
            "-F",
            "499",
            "-d",
            "15",
            "-q",
            "-p",
            &target.id().to_string(),
            "-o",
        ])
        .arg(&cap));
    let took = started.elapsed();
    assert!(target.wait().unwrap().success());
    eprintln!(
        "lrec stopped after {took:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        took < Duration::from_secs(10),
        "lrec did not stop when the target exited"
    );

    let (stacks, _) = folded(&cap, &["--offline"]);
    let truth = Truth::new(
        &["main", "late_main"],
        &[
            ("late_work", "late_main;late_work"),
            ("plugin_leaf", "main;run_plugin;plugin_entry;plugin_leaf"),
            ("plugin_entry", "main;run_plugin;plugin_entry"),
        ],
    );
    let s = score(&stacks, &truth);
    eprintln!(
        "lifecycle: {}/{} exact, {:?}",
        s.exact, s.judged, s.per_leaf
    );
    for leaf in ["late_work", "plugin_leaf"] {
        assert!(
            s.per_leaf.get(leaf).copied().unwrap_or(0) >= 50,
            "{leaf} barely sampled: {:?}",
            s.per_leaf
        );
    }
    assert!(s.fraction() >= 0.99, "wrong stacks: {:#?}", s.wrong);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A process that lives 0.15 s: lrec must still see the libraries ld.so maps at start
/// (through its uprobe on _dl_debug_state), so its stacks unwind through libc.
#[test]
fn short_lived_process_keeps_its_libraries() {
    let Some(_guard) = bpf_test("short_lived_process_keeps_its_libraries") else {
        return;
    };
    let dir = tempfile_dir("short");
    for round in 0..3 {
        let cap = dir.join(format!("short-{round}.lrec"));
        record_command(&cap, 999, &[fixture("native").as_ref(), "0.15".as_ref()]);
        let info = run(Command::new(bin("lanalyze"))
            .arg(&cap)
            .args(["--info", "--offline"]))
        .stdout;
        let info = String::from_utf8(info).unwrap();
        assert!(
            info.contains("libc.so.6"),
            "round {round}: libc missing:\n{info}"
        );
        let (stacks, _) = folded(&cap, &["--offline"]);
        let s = score(&stacks, &native_truth());
        assert!(s.judged > 0, "round {round}: nothing sampled");
        assert!(
            s.fraction() >= 0.95,
            "round {round}: {}/{} exact: {:#?}",
            s.exact,
            s.judged,
            s.wrong
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Ctrl-C (SIGINT) and SIGTERM end a recording early and leave a complete capture.
#[test]
fn signals_finish_the_capture() {
    let Some(_guard) = bpf_test("signals_finish_the_capture") else {
        return;
    };
    let dir = tempfile_dir("signals");
    for (name, sig) in [("SIGINT", libc::SIGINT), ("SIGTERM", libc::SIGTERM)] {
        let cap = dir.join(format!("{name}.lrec"));
        let mut target = Command::new(fixture("native"))
            .arg("10")
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let mut lrec = Command::new(bin("lrec"))
            .args(["-F", "199", "-q", "-p", &target.id().to_string(), "-o"])
            .arg(&cap)
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        // SAFETY: signals a child process of this test.
        unsafe { libc::kill(lrec.id() as i32, sig) };
        let status = lrec.wait().unwrap();
        target.kill().unwrap();
        target.wait().unwrap();
        assert!(status.success(), "{name}: lrec exited with {status}");
        let (samples, _, warnings) = capture_totals(&cap);
        assert!(samples > 100, "{name}: only {samples} samples");
        assert!(
            warnings.is_empty(),
            "{name}: capture not finished: {warnings:?}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// dlclose then dlopen of another library at the same address: lrec must record the
/// second library's mapping, and lanalyze must name each phase after its own library.
#[test]
fn a_library_loaded_where_another_was_is_told_apart() {
    let Some(_guard) = bpf_test("a_library_loaded_where_another_was_is_told_apart") else {
        return;
    };
    let dir = tempfile_dir("reload");
    let cap = dir.join("reload.lrec");
    let libs = fixture("libswap_a.so").parent().unwrap().to_path_buf();
    record_command(&cap, 499, &[fixture("reload").as_ref(), libs.as_ref()]);
    let (stacks, _) = folded(&cap, &["--offline"]);
    let truth = Truth::new(
        &["main"],
        &[
            ("swap_leaf_a", "main;phase;swap_work_a;swap_leaf_a"),
            ("swap_leaf_b", "main;phase;swap_work_b;swap_leaf_b"),
        ],
    );
    let s = score(&stacks, &truth);
    eprintln!("reload: {}/{} exact, {:?}", s.exact, s.judged, s.per_leaf);
    assert!(s.fraction() >= 0.99, "wrong stacks: {:#?}", s.wrong);
    // Both run equally long: mislabelling shows as a lopsided split.
    let a = s.per_leaf.get("swap_leaf_a").copied().unwrap_or(0) as f64;
    let b = s.per_leaf.get("swap_leaf_b").copied().unwrap_or(0) as f64;
    assert!(a > 100.0 && b > 100.0, "a {a}, b {b}");
    assert!(
        (0.7..1.43).contains(&(a / b)),
        "a {a} vs b {b}: phases mislabelled"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Code without unwind info (a JIT's): stacks through it end there as [truncated]; none
/// may skip its caller (main;mid;<jit code> without jit_caller).
#[test]
fn code_without_unwind_info_ends_the_stack_truthfully() {
    let Some(_guard) = bpf_test("code_without_unwind_info_ends_the_stack_truthfully") else {
        return;
    };
    let dir = tempfile_dir("jit");
    let cap = dir.join("jit.lrec");
    record_command(&cap, 499, &[fixture("jit").as_ref(), "2".as_ref()]);
    let (stacks, _) = folded(&cap, &["--offline", "--no-thread-names"]);
    let mut in_jit = 0;
    for (frames, n) in &stacks {
        let line = frames.join(";");
        assert!(
            !line.contains("main;mid;[unknown]"),
            "a caller was skipped: {line} {n}"
        );
        if frames.contains(&"[unknown]".to_string()) {
            assert_eq!(frames[0], "[truncated]", "not marked truncated: {line}");
            in_jit += n;
        }
    }
    assert!(in_jit > 500, "only {in_jit} samples in the JIT code");
    std::fs::remove_dir_all(&dir).unwrap();
}
