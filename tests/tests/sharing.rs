//! Captures that leave the machine: the flight recorder's windows, a capture cut short by
//! a full disk, and the files' permissions (0600: they hold stack memory).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lrec_e2e::*;

/// CLOCK_MONOTONIC, the clock of sample times.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes into a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `(VmHWM, VmRSS)` of a process in KiB: its peak and current resident memory.
fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> u64 {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .unwrap()
    };
    (field("VmHWM:"), field("VmRSS:"))
}

fn sleep_until(start: Instant, secs: u64) {
    let at = start + Duration::from_secs(secs);
    std::thread::sleep(at.saturating_duration_since(Instant::now()));
}

/// `--flight 5` on a 30 s run with SIGUSR1 at 10 s and 20 s: two captures of the 5 s before
/// each signal and a third of the 5 s before the target's exit, all with exact stacks;
/// lrec's memory does not grow after the window has filled.
#[test]
fn flight_recorder_writes_the_last_seconds_on_demand() {
    let Some(_guard) = bpf_test("flight_recorder_writes_the_last_seconds_on_demand") else {
        return;
    };
    let dir = tempfile_dir("flight");
    let base = dir.join("flight.lrec");
    let started = Instant::now();
    let lrec = Command::new(bin("lrec"))
        .args(["-F", "499", "--flight", "5", "-q", "-o"])
        .arg(&base)
        .arg("--")
        .arg(fixture("native"))
        .arg("30")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut signalled = Vec::new();
    let mut memory = Vec::new();
    for at in [10, 20] {
        sleep_until(started, at);
        memory.push((at, memory_kib(lrec.id())));
        signalled.push(monotonic_ns());
        // SAFETY: signals a child process of this test.
        unsafe { libc::kill(lrec.id() as i32, libc::SIGUSR1) };
    }
    sleep_until(started, 29);
    memory.push((29, memory_kib(lrec.id())));
    let out = lrec.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "lrec failed: {stderr}");
    eprintln!("lrec said:\n{stderr}");
    eprintln!("lrec memory (s, (VmHWM KiB, VmRSS KiB)): {memory:?}");

    let dumps: Vec<PathBuf> = (1..=3)
        .map(|i| dir.join(format!("flight.{i}.lrec")))
        .collect();
    assert!(!dir.join("flight.4.lrec").exists(), "a dump too many");
    assert!(
        !base.exists(),
        "the flight recorder wrote the plain -o file"
    );
    for (i, dump) in dumps.iter().enumerate() {
        assert!(dump.exists(), "{} missing: {stderr}", dump.display());
        assert_eq!(mode(dump), 0o600, "{}", dump.display());
        assert!(
            stderr.contains(&format!("lrec: wrote {}:", dump.display())),
            "dump {} not announced: {stderr}",
            i + 1
        );
        let c = contents(dump);
        eprintln!(
            "dump {}: {} samples over {:.2} s, ended by {:?}",
            i + 1,
            c.samples,
            c.secs(),
            c.end
        );
        assert!(c.warnings.is_empty(), "dump {}: {:?}", i + 1, c.warnings);
        assert!(
            (4.5..=5.6).contains(&c.secs()),
            "dump {} spans {:.2} s, not the 5 s window",
            i + 1,
            c.secs()
        );
        let reason = c.end.as_deref().unwrap_or("");
        match signalled.get(i) {
            Some(&signal_ns) => {
                assert_eq!(reason, "SIGUSR1");
                // The window ends at the signal.
                let gap = c.last_ns as f64 / 1e9 - signal_ns as f64 / 1e9;
                assert!(
                    (-1.0..=1.0).contains(&gap),
                    "dump {}'s last sample is {gap:.2} s from its signal",
                    i + 1
                );
            }
            None => assert!(reason.starts_with("target exited"), "{reason}"),
        }
        // 499 Hz for 5 s of a workload that keeps about one CPU busy, on a shared machine.
        let (stacks, _) = folded(dump, &["--offline"]);
        let s = score(&stacks, &native_truth());
        eprintln!(
            "dump {}: {}/{} exact, per leaf {:?}",
            i + 1,
            s.exact,
            s.judged,
            s.per_leaf
        );
        assert!(s.judged >= 800, "dump {}: only {} judged", i + 1, s.judged);
        assert!(
            s.fraction() >= 0.99,
            "dump {}: wrong stacks {:#?}",
            i + 1,
            s.wrong
        );
    }
    // Bounded memory: once the window has filled (by 10 s), lrec's peak stays put.
    let (hwm10, _) = memory[0].1;
    let (hwm29, _) = memory[2].1;
    assert!(
        hwm29 <= hwm10 + (8 << 10),
        "lrec's peak memory grew from {hwm10} KiB at 10 s to {hwm29} KiB at 29 s"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, options: &str) -> std::io::Result<Tmpfs> {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        std::fs::create_dir_all(at)?;
        let target = CString::new(at.as_os_str().as_bytes()).unwrap();
        let options = CString::new(options).unwrap();
        // SAFETY: valid NUL-terminated strings for the duration of the call.
        let rc = unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                options.as_ptr().cast(),
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Tmpfs(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        use std::os::unix::ffi::OsStrExt;
        let target = std::ffi::CString::new(self.0.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid path; MNT_DETACH also unmounts a tmpfs that is still in use.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

/// lrec writing into a 2 MiB tmpfs that fills up after a few seconds: it stops with an
/// error naming the file, exits non-zero, and leaves a capture with exact stacks.
#[test]
fn a_full_disk_stops_lrec_and_leaves_a_readable_capture() {
    let name = "a_full_disk_stops_lrec_and_leaves_a_readable_capture";
    let Some(_guard) = bpf_test(name) else {
        return;
    };
    let dir = tempfile_dir("full-disk");
    let tmpfs = match Tmpfs::mount(&dir.join("tiny"), "size=2m") {
        Ok(t) => t,
        Err(e) => return cannot_run(name, &format!("cannot mount a tmpfs: {e}")),
    };
    // About 700 KiB stay free: the binaries and a few seconds of samples.
    std::fs::write(tmpfs.0.join("filler"), vec![0u8; 1350 << 10]).unwrap();
    let cap = tmpfs.0.join("cap.lrec");
    let started = Instant::now();
    let out = Command::new(bin("lrec"))
        .args(["-F", "999", "-q", "-o"])
        .arg(&cap)
        .arg("--")
        .arg(fixture("native"))
        .arg("30")
        .stdout(Stdio::null())
        .output()
        .unwrap();
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("lrec stopped after {took:?} with {}: {stderr}", out.status);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let said = format!(
        "lrec: error: cannot write {}: No space left on device (os error 28); the capture \
         is readable up to its last complete chunk",
        cap.display()
    );
    assert!(stderr.contains(&said), "{stderr}");
    assert!(took < Duration::from_secs(25), "lrec did not stop at once");
    assert_eq!(mode(&cap), 0o600);

    let c = contents(&cap);
    eprintln!(
        "full disk: {} samples over {:.1} s; {:?}",
        c.samples,
        c.secs(),
        c.warnings
    );
    assert!(c.end.is_none());
    assert!(c.samples >= 1000, "only {} samples", c.samples);
    let (stacks, warnings) = folded(&cap, &["--offline"]);
    assert!(warnings.contains("no end record"), "{warnings}");
    let s = score(&stacks, &native_truth());
    eprintln!("full disk: {}/{} exact", s.exact, s.judged);
    assert!(s.fraction() >= 0.99, "wrong stacks {:#?}", s.wrong);
    drop(tmpfs);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Every capture lrec creates is readable by its owner only, also one written over an
/// older, world-readable file.
#[test]
fn captures_are_created_private() {
    let Some(_guard) = bpf_test("captures_are_created_private") else {
        return;
    };
    let dir = tempfile_dir("private");
    let new = dir.join("new.lrec");
    let old = dir.join("old.lrec");
    // An older capture made readable to all: the new one replacing it is private again.
    record_command(&old, 99, &[fixture("native").as_ref(), "0.2".as_ref()]);
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).unwrap();
    for cap in [&new, &old] {
        record_command(cap, 99, &[fixture("native").as_ref(), "0.5".as_ref()]);
        assert_eq!(mode(cap), 0o600, "{}", cap.display());
        assert!(contents(cap).end.is_some());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
