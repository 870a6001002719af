//! lrec never harms the host it records (issue 53): what it runs when it meets a binary is
//! bounded whatever the binary (a sample of the machine's ELF files, every Lua binary
//! among them, met one child process each within a time and a memory limit), and it
//! answers SIGTERM at every moment of its start-up, leaving the target running and its
//! capture readable or none (and a line saying so). The whole sweep of the machine is in
//! `make bench`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lrec_e2e::*;

/// The sweep (inspect/examples/sweep.rs), built by `make build`.
fn sweep() -> PathBuf {
    bin("examples/sweep")
}

/// Every 20th ELF file of the system's program and library directories (a few hundred),
/// and every binary that holds a Lua VM here (Debian's, the fixtures', lupa's): each met
/// as lrec meets it, none failing (a panic, a signal, past 30 s or 2 GiB), every budget
/// that ran out said.
#[test]
fn a_sample_of_the_machines_binaries_is_met_within_bounds() {
    let lua_dirs = [
        "/usr/lib/x86_64-linux-gnu/liblua5.1.so.0",
        "/usr/lib/x86_64-linux-gnu/liblua5.2.so.0",
        "/usr/lib/x86_64-linux-gnu/liblua5.3.so.0",
        "/usr/lib/x86_64-linux-gnu/liblua5.4.so.0",
        "/usr/lib/x86_64-linux-gnu/libluajit-5.1.so.2",
        "/usr/bin/redis-check-rdb",
    ];
    let mut lua: Vec<PathBuf> = lua_dirs
        .iter()
        .filter_map(|p| installed(p, "a Debian Lua binary"))
        .collect();
    lua.push(root().join("fixtures/bin"));
    lua.push(root().join("fixtures/build/lupa/lib"));
    let dir = tempfile_dir("sweep");
    let list = dir.join("list.tsv");
    let began = Instant::now();
    let sample = run_sweep(
        &["--sample", "20", "--list"],
        &list,
        &["/usr/bin", "/usr/sbin", "/usr/lib"],
    );
    let all = run_sweep(
        &["--list"],
        &dir.join("lua.tsv"),
        &lua.iter().map(|p| p.to_str().unwrap()).collect::<Vec<_>>(),
    );
    eprintln!(
        "sweep: {:.1} s\n{sample}\n{all}",
        began.elapsed().as_secs_f64()
    );
    for out in [&sample, &all] {
        let head = out.lines().next().unwrap_or_default();
        assert!(head.contains(" 0 failed"), "{out}");
    }
    let files = |out: &str| -> u64 {
        out.split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    assert!(
        files(&sample) >= 100,
        "only {} files in the sample",
        files(&sample)
    );
    // The Lua binaries are found holding Lua, each learned or said why not.
    let holding = all.lines().filter(|l| l.contains(" lua: ")).count();
    assert!(holding >= 20, "only {holding} binaries hold Lua:\n{all}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The sweep's output (its summary first); it exits 0 only without a failure.
fn run_sweep(flags: &[&str], list: &Path, dirs: &[&str]) -> String {
    let out = Command::new(sweep())
        .args(flags)
        .arg(list)
        .args(dirs)
        .stderr(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "the sweep failed:\n{text}");
    text
}

/// SIGTERM 0.05, 0.2, 0.5, 1 and 2 s after lrec started on tshark (a Lua tap among ~60
/// libraries): lrec is gone within a second each time, tshark runs on, and the capture is
/// readable, or there is none and lrec said so.
#[test]
fn sigterm_at_every_moment_of_the_start_ends_lrec_within_a_second() {
    let Some(_guard) = bpf_test("sigterm at every moment") else {
        return;
    };
    let Some(tshark) = installed("/usr/bin/tshark", "tshark (a big host with Lua 5.2)") else {
        return;
    };
    let dir = tempfile_dir("sigterm");
    let target = start_tshark(&tshark, &dir, 200_000);
    std::thread::sleep(Duration::from_secs(2));
    let pid = target.0.id();
    for after in [0.05, 0.2, 0.5, 1.0, 2.0] {
        let cap = dir.join(format!("{after}.lrec"));
        let lrec = Command::new(bin("lrec"))
            .args(["-p", &pid.to_string(), "-d", "20", "-q", "-o"])
            .arg(&cap)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_secs_f64(after));
        let sent = Instant::now();
        // SAFETY: signals our own child.
        unsafe { libc::kill(lrec.id() as i32, libc::SIGTERM) };
        let out = lrec.wait_with_output().unwrap();
        let took = sent.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let alive = Path::new(&format!("/proc/{pid}")).exists();
        eprintln!(
            "SIGTERM {after} s after the start: gone {:.3} s later, {}, target alive: {alive}",
            took.as_secs_f64(),
            out.status
        );
        assert!(took < Duration::from_secs(1), "{after}: {took:?}; {stderr}");
        assert!(alive, "{after}: tshark is gone");
        if cap.exists() {
            let c = contents(&cap);
            assert!(c.warnings.is_empty(), "{after}: {:?}", c.warnings);
            assert!(c.end.is_some(), "{after}: the capture has no end");
        } else {
            assert!(stderr.contains("no capture written"), "{after}: {stderr}");
        }
        // Nothing left behind beside the capture (no .partial).
        let left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".partial"))
            .collect();
        assert!(left.is_empty(), "{after}: left {left:?}");
    }
    drop(target);
    std::fs::remove_dir_all(&dir).unwrap();
}
