//! lrec keeps its promises in hosts that map many big libraries: `-d` is honored, every
//! VM is found, nothing else is taken for one. Debian's `tshark` runs a Lua tap
//! (fixtures/workloads/hosts/tshark.lua; Lua 5.2 from the stripped, shared liblua5.2 among
//! ~60 libraries, libwireshark's 110 MB among them), and lua-host-shared runs LuaJIT VMs
//! after loading libwireshark; lrec attaches to each 20 times for 2 s.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use lrec_e2e::*;

const RUNS: usize = 20;
/// The most lrec's start may take, to its first sample (issue 53's bound).
const START_MAX: f64 = 3.0;
/// Each recording's -d.
const SECS: u32 = 2;

/// Attaches `lrec -d SECS` to `pid` RUNS times: each capture's last sample must come SECS
/// − 0.1 s to SECS + 0.3 s after lrec's start (`-d` counts from it), its first within
/// [`START_MAX`] (the BPF programs load meanwhile, the binaries are learned beside),
/// and name exactly the binaries of `vms` as holding a Lua VM (the first validated and
/// running), and most of
/// its samples must have Lua frames of `chunk`.
fn twenty_recordings(what: &str, pid: u32, dir: &Path, vms_wanted: &[&str], chunk: &str) {
    let mut spans = Vec::new();
    let mut bare_traces = (0u64, 0u64);
    for run in 0..RUNS {
        let cap = dir.join(format!("{run}.lrec"));
        record_pid(&cap, pid, 499, SECS, &[]);
        let c = contents(&cap);
        spans.push(c.from_start());
        let info = String::from_utf8(lanalyze(&[cap.as_os_str(), "--info".as_ref()])).unwrap();
        let vms: Vec<&str> = info
            .lines()
            .skip_while(|l| !l.starts_with("Lua VMs"))
            .skip(1)
            .take_while(|l| !l.is_empty())
            .collect();
        // The first VM runs the program and is proved; the others may stay idle (a
        // library that brings its own Lua along), listed with their layout unproved.
        let found = |(i, want): (usize, &&str)| {
            vms.iter().any(|l| {
                l.contains(want)
                    && !l.contains("native stacks only")
                    && (i > 0 || (l.contains(" running)") && !l.contains("not proved")))
            })
        };
        assert!(
            vms.len() == vms_wanted.len() && vms_wanted.iter().enumerate().all(found),
            "{what} run {run}: Lua VMs {vms:?}"
        );
        let (stacks, _) = folded(&cap, &["--offline"]);
        let with_lua: u64 = stacks
            .iter()
            .filter(|(f, _)| f.iter().any(|x| is_lua_frame(x, chunk)))
            .map(|(_, n)| n)
            .sum();
        let all: u64 = stacks.iter().map(|(_, n)| n).sum();
        assert!(
            with_lua as f64 >= 0.7 * all as f64,
            "{what} run {run}: {with_lua} of {all} samples with Lua frames"
        );
        // No Lua frame misplaced in any run. Compiled code without a Lua frame is rare
        // (a few samples in 2,900 of a 3 s run) but comes in bursts on a loaded machine
        // (37 in one 3 s run of a CI): bounded over the twenty runs at 0.5 %, each run at
        // 3 % (~60 of the ~2,000 samples of a 2 s run, as 2 % of a 3 s run's were).
        let p = lua_placement(&stacks, chunk, &[]);
        assert_eq!(p.misplaced, 0, "{what} run {run}: {:#?}", p.examples);
        let (bare, of) = traces_without_lua(&stacks, chunk);
        eprintln!("{what} run {run}: {bare} of {of} samples in compiled code without a Lua frame");
        assert!(
            bare as f64 <= 0.03 * of as f64,
            "{what} run {run}: {bare} of {of}"
        );
        bare_traces.0 += bare;
        bare_traces.1 += of;
        std::fs::remove_file(&cap).unwrap();
    }
    let (bare, of) = bare_traces;
    eprintln!("{what}: {bare} of {of} samples in compiled code without a Lua frame");
    assert!(bare as f64 <= 0.005 * of as f64, "{what}: {bare} of {of}");
    let (first, min, max) = spans.iter().fold((0f64, f64::MAX, 0f64), |(f, a, b), s| {
        (f.max(s.0), a.min(s.1), b.max(s.1))
    });
    eprintln!(
        "{what}: {RUNS} recordings of -d {SECS}: first sample at most {first:.3} s after \
         lrec's start, last {min:.3}–{max:.3} s"
    );
    let secs = f64::from(SECS);
    assert!(
        first <= START_MAX && min >= secs - 0.1 && max <= secs + 0.3,
        "{what}: (first, last) samples {spans:?}"
    );
}

#[test]
fn tshark_lua_tap() {
    let Some(_guard) = bpf_test("tshark lua tap") else {
        return;
    };
    let Some(tshark) = installed("/usr/bin/tshark", "tshark (a big host with Lua 5.2)") else {
        return;
    };
    let dir = tempfile_dir("tshark");
    // ~1 ms of Lua per packet: long enough for all the recordings.
    let target = start_tshark(&tshark, &dir, 400_000);
    std::thread::sleep(Duration::from_secs(2));
    twenty_recordings(
        "tshark",
        target.0.id(),
        &dir,
        &["liblua5.2.so"],
        "tshark.lua",
    );
    drop(target);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn luajit_host_with_big_libraries() {
    let what = "luajit host with libwireshark";
    let Some(_guard) = bpf_test(what) else {
        return;
    };
    let Some(lib) = installed(
        "/usr/lib/x86_64-linux-gnu/libwireshark.so.16",
        "libwireshark (big libraries in a LuaJIT host)",
    ) else {
        return;
    };
    let dir = tempfile_dir("luajit-big");
    let target = Killed(
        Command::new(fixture_bin("lua-host-shared"))
            .arg("600")
            .arg("2")
            .arg(&lib)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_secs(2));
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", target.0.id())).unwrap();
    let files: std::collections::BTreeSet<&str> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| p.starts_with('/'))
        .collect();
    eprintln!("{what}: {} files mapped", files.len());
    assert!(files.len() >= 40, "only {} files mapped", files.len());
    // libwireshark brings Lua 5.2 along: a process with two kinds of VM, LuaJIT running.
    let vms = ["libluajit-5.1.so.2", "liblua5.2.so"];
    twenty_recordings(what, target.0.id(), &dir, &vms, "host/worker.lua");
    drop(target);
    std::fs::remove_dir_all(&dir).unwrap();
}
