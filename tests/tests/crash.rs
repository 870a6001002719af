//! lrec killed (issue 40): `kill -9` of lrec mid-recording leaves the capture under its
//! temporary name, which `lanalyze c.lrec` finds and reads up to its last complete chunk,
//! and the command lrec started dies with it; `--keep-running` lets it run on.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lrec_e2e::*;

/// Whether process `pid` is gone (or a zombie nobody reaped yet).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

/// The pid of lrec's child (the command it started).
fn child_of(pid: u32) -> Option<u32> {
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    children.split_whitespace().next()?.parse().ok()
}

#[test]
fn a_killed_recording_is_read_where_the_user_looks_and_its_command_dies() {
    let Some(_guard) = bpf_test("a killed recording") else {
        return;
    };
    let dir = tempfile_dir("crash");
    let cap = dir.join("c.lrec");
    let mut lrec = Command::new(bin("lrec"))
        .args(["-F", "499", "-q", "-o"])
        .arg(&cap)
        .arg("--")
        .arg(fixture("native"))
        .arg("60")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(4));
    let child = child_of(lrec.id()).expect("lrec started its command");
    lrec.kill().unwrap();
    lrec.wait().unwrap();
    // The command does not outlive lrec.
    let killed = Instant::now();
    while !gone(child) && killed.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(gone(child), "the command ({child}) outlived lrec");
    assert!(
        !cap.exists(),
        "lrec had no time to put the capture in place"
    );

    // lanalyze c.lrec reads what lrec left, and says so.
    let out = run(Command::new(bin("lanalyze"))
        .arg(&cap)
        .args(["--folded", "--offline"]));
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("does not exist; reading") && said.contains(".partial"),
        "{said}"
    );
    let stacks = parse_folded(&String::from_utf8_lossy(&out.stdout));
    let s = score(&stacks, &native_truth());
    eprintln!(
        "killed after 4 s: {} samples read, {}/{} exact",
        stacks.iter().map(|(_, n)| n).sum::<u64>(),
        s.exact,
        s.judged
    );
    // Chunks are written every second or so: most of the 4 s of samples at 499 Hz.
    assert!(s.judged >= 500, "only {} samples judged", s.judged);
    assert_exact(&s, "killed recording");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn keep_running_lets_the_command_run_on() {
    let Some(_guard) = bpf_test("--keep-running") else {
        return;
    };
    let dir = tempfile_dir("keep-running");
    let cap = dir.join("c.lrec");
    let mut lrec = Command::new(bin("lrec"))
        .args(["-F", "99", "-q", "-d", "1", "--keep-running", "-o"])
        .arg(&cap)
        .arg("--")
        .arg(fixture("native"))
        .arg("30")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let child = child_of(lrec.id()).expect("lrec started its command");
    assert!(lrec.wait().unwrap().success());
    std::thread::sleep(Duration::from_millis(500));
    assert!(!gone(child), "the command ended with lrec");
    // SAFETY: signals the command this test had lrec start.
    unsafe { libc::kill(child as i32, libc::SIGKILL) };
    assert!(cap.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}
