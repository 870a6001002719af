//! LuaJIT stacks against ground truth (fixtures/workloads/lua/chains.lua): Debian's
//! `luajit` (OpenResty's luajit2, GC64) and upstream LuaJIT built GC64 and GC32, with the
//! JIT on and off, each attached with `lrec -p` after it started; the other kinds of calls
//! (fixtures/workloads/lua/kinds.lua); and a stripped host that links LuaJIT statically
//! and runs one VM per thread.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use lrec_e2e::*;

/// chains.lua's true Lua chains of `hot` (defined at line 12), root first.
fn chains_truth() -> Vec<Vec<u32>> {
    let mut recursion = vec![0, 39, 37];
    recursion.extend([33; 151]);
    recursion.push(12);
    vec![
        vec![0, 39, 19, 18, 17, 12],
        vec![0, 39, 20, 12],
        vec![0, 39, 22, 24, 12],
        vec![0, 39, 29, 27, 12],
        vec![0, 39, 32, 31, 12],
        recursion,
    ]
}

fn workload(name: &str) -> PathBuf {
    root().join("fixtures/workloads/lua").join(name)
}

/// kinds.lua's true Lua chains, one per hot function (the last line of each), root first.
fn kinds_truth() -> Vec<Vec<u32>> {
    let mut deep = vec![0, 58, 54];
    deep.extend([50; 251]);
    deep.push(25);
    vec![
        vec![0, 58, 26, 23, 16],
        vec![0, 58, 30, 28, 17],
        vec![0, 58, 37, 31, 33, 18],
        vec![0, 58, 38, 19],
        vec![0, 58, 40, 20],
        vec![0, 58, 42, 21],
        vec![0, 58, 44, 43, 22],
        vec![0, 58, 46, 47, 24],
        deep,
    ]
}

/// Runs `luajit [-joff] WORKLOAD RUN_SECS`, attaches `lrec -p` to it after 1 s for
/// `rec_secs`, and returns the test's directory and the capture.
fn record_lua(
    what: &str,
    luajit: &Path,
    jit_off: bool,
    file: &str,
    run_secs: u32,
    rec_secs: u32,
) -> (PathBuf, PathBuf) {
    let dir = tempfile_dir(&what.replace(' ', "-"));
    let cap = dir.join("lua.lrec");
    let mut cmd = Command::new(luajit);
    if jit_off {
        cmd.arg("-joff");
    }
    let mut target = cmd
        .arg(workload(file))
        .arg(run_secs.to_string())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    record_pid(&cap, target.id(), 499, rec_secs, &[]);
    target.kill().unwrap();
    target.wait().unwrap();
    (dir, cap)
}

/// Runs a Lua workload under `luajit` for 10 s, attaches after 1 s for `secs`, and checks
/// that ≥ 95 % of the samples whose innermost Lua function is a hot one (the last line of
/// a true chain) show its exact chain, and that every chain is seen.
fn lua_is_exact(what: &str, luajit: PathBuf, jit_off: bool, file: &str, truths: &[Vec<u32>]) {
    let Some(_guard) = bpf_test(what) else {
        return;
    };
    let (dir, cap) = record_lua(what, &luajit, jit_off, file, 10, 8);

    let (stacks, _) = folded(&cap, &["--offline"]);
    let total = score_lua(&stacks, file, truths);
    eprintln!(
        "{what}: {}/{} samples in hot functions exact ({:.2} %), per chain {:?}",
        total.exact,
        total.judged,
        100.0 * total.fraction(),
        total.per_leaf
    );
    assert!(
        total.judged >= 500,
        "{what}: only {} samples judged",
        total.judged
    );
    assert!(
        total.fraction() >= 0.95,
        "{what}: only {:.2} % exact; wrong stacks: {:#?}",
        100.0 * total.fraction(),
        total.wrong
    );
    // Every chain shows up: a failure of one kind cannot hide in the average.
    for truth in truths {
        let seen: u64 = stacks
            .iter()
            .filter(|(f, _)| lua_chain(f, file) == *truth)
            .map(|(_, n)| n)
            .sum();
        assert!(seen >= 10, "{what}: chain {truth:?} seen {seen} times");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn chains_are_exact(what: &str, luajit: PathBuf, jit_off: bool) {
    lua_is_exact(what, luajit, jit_off, "chains.lua", &chains_truth());
}

fn kinds_are_exact(what: &str, luajit: PathBuf, jit_off: bool) {
    lua_is_exact(what, luajit, jit_off, "kinds.lua", &kinds_truth());
}

#[test]
fn debian_luajit_jit_on() {
    if let Some(lj) = installed("/usr/bin/luajit", "Debian luajit, JIT on") {
        chains_are_exact("debian luajit jit on", lj, false);
    }
}

#[test]
fn debian_luajit_jit_off() {
    if let Some(lj) = installed("/usr/bin/luajit", "Debian luajit, -joff") {
        chains_are_exact("debian luajit joff", lj, true);
    }
}

#[test]
fn upstream_gc64_jit_on() {
    chains_are_exact("gc64 jit on", fixture_bin("luajit-gc64"), false);
}

#[test]
fn upstream_gc64_jit_off() {
    chains_are_exact("gc64 joff", fixture_bin("luajit-gc64"), true);
}

#[test]
fn upstream_gc32_jit_on() {
    chains_are_exact("gc32 jit on", fixture_bin("luajit-gc32"), false);
}

#[test]
fn upstream_gc32_jit_off() {
    chains_are_exact("gc32 joff", fixture_bin("luajit-gc32"), true);
}

#[test]
fn kinds_debian_luajit_jit_on() {
    if let Some(lj) = installed("/usr/bin/luajit", "Debian luajit, kinds") {
        kinds_are_exact("kinds debian luajit jit on", lj, false);
    }
}

#[test]
fn kinds_gc64_jit_off() {
    kinds_are_exact("kinds gc64 joff", fixture_bin("luajit-gc64"), true);
}

#[test]
fn kinds_gc32_jit_on() {
    kinds_are_exact("kinds gc32 jit on", fixture_bin("luajit-gc32"), false);
}

#[test]
fn kinds_gc32_jit_off() {
    kinds_are_exact("kinds gc32 joff", fixture_bin("luajit-gc32"), true);
}

/// fixtures/workloads/lua/reload.lua recreates its functions continually (load() of new
/// text, modules re-required, collectgarbage()): ≥ 99 % of the samples in them name the
/// chunk and line that ran.
fn reloaded_code_is_named_right(what: &str, luajit: PathBuf, jit_off: bool) {
    let Some(_guard) = bpf_test(what) else {
        return;
    };
    let (dir, cap) = record_lua(what, &luajit, jit_off, "reload.lua", 8, 6);

    let (stacks, _) = folded(&cap, &["--offline"]);
    let gen = regex::Regex::new(r"(?:^|\s)gen_(\d+):(\d+)$").unwrap();
    let module = regex::Regex::new(r"reload_([ab])\.lua:(\d+)$").unwrap();
    let (mut judged, mut right) = (0, 0);
    let mut wrong = Vec::new();
    for (frames, n) in &stacks {
        // The innermost frame of recreated code: generated chunks, the modules, or
        // a function lrec could not name.
        let Some(leaf) = frames.iter().rev().find(|f| {
            gen.is_match(f) || module.is_match(f) || f.contains("[unknown Lua function]")
        }) else {
            continue;
        };
        judged += n;
        let ok = if let Some(c) = gen.captures(leaf) {
            let (chunk, line): (u32, u32) = (c[1].parse().unwrap(), c[2].parse().unwrap());
            line == 0 || line == 1 + chunk % 7
        } else if let Some(c) = module.captures(leaf) {
            let line: u32 = c[2].parse().unwrap();
            line == 0 || line == if &c[1] == "a" { 3 } else { 6 }
        } else {
            false
        };
        if ok {
            right += n;
        } else {
            wrong.push((leaf.clone(), *n));
        }
    }
    eprintln!(
        "{what}: {right}/{judged} samples in recreated code named right ({:.2} %)",
        100.0 * right as f64 / judged.max(1) as f64
    );
    assert!(
        judged >= 500,
        "{what}: only {judged} samples in recreated code"
    );
    assert!(
        right as f64 >= 0.99 * judged as f64,
        "{what}: {right}/{judged}; wrong: {wrong:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn reload_gc64_jit_on() {
    reloaded_code_is_named_right("reload gc64 jit on", fixture_bin("luajit-gc64"), false);
}

#[test]
fn reload_gc32_jit_off() {
    reloaded_code_is_named_right("reload gc32 joff", fixture_bin("luajit-gc32"), true);
}

#[test]
fn reload_debian_luajit_jit_on() {
    if let Some(lj) = installed("/usr/bin/luajit", "Debian luajit, reload") {
        reloaded_code_is_named_right("reload debian luajit jit on", lj, false);
    }
}

/// fixtures/bin/lua-host: stripped, LuaJIT linked in, three threads with a VM each.
/// Thread vm-k runs run (line 10) → work_k (4 + k) → hot_k (1 + k); a thread's samples
/// must all name its own VM's functions.
#[test]
fn several_vms_in_a_stripped_static_host() {
    let Some(_guard) = bpf_test("several_vms_in_a_stripped_static_host") else {
        return;
    };
    let dir = tempfile_dir("lua-host");
    let cap = dir.join("host.lrec");
    let mut target = Command::new(fixture_bin("lua-host"))
        .args(["8", "3"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    record_pid(&cap, target.id(), 499, 5, &[]);
    target.kill().unwrap();
    target.wait().unwrap();

    let (stacks, _) = folded(&cap, &["--offline"]);
    let truths: Vec<Vec<u32>> = (0..3).map(|k| vec![10, 4 + k, 1 + k]).collect();
    let mut judged = 0;
    let mut exact = 0;
    let mut hot_of_thread: std::collections::BTreeMap<String, std::collections::BTreeSet<u32>> =
        Default::default();
    for (frames, n) in &stacks {
        let chain = lua_chain(frames, "host/worker.lua");
        let Some(&leaf) = chain.last().filter(|&&l| (1..=3).contains(&l)) else {
            continue;
        };
        judged += n;
        if truths.contains(&chain) {
            exact += n;
        }
        hot_of_thread
            .entry(frames[0].clone())
            .or_default()
            .insert(leaf);
    }
    eprintln!("lua-host: {exact}/{judged} exact; hot functions per thread {hot_of_thread:?}");
    assert!(judged >= 300, "only {judged} samples in the hot functions");
    assert!(
        exact as f64 >= 0.95 * judged as f64,
        "{exact}/{judged} exact"
    );
    // Thread vm-k runs VM k: its samples name hot_k only.
    for k in 0..3u32 {
        let want = std::collections::BTreeSet::from([1 + k]);
        assert_eq!(
            hot_of_thread.get(&format!("vm-{k}")),
            Some(&want),
            "VMs mixed up or missing: {hot_of_thread:?}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A LuaJIT whose layout is none of the known ones (built without the JIT compiler, its
/// global state differs): one clear line from lrec and lanalyze, and native stacks only,
/// never guessed Lua frames.
#[test]
fn an_unknown_layout_gives_one_line_and_native_stacks() {
    let Some(_guard) = bpf_test("an_unknown_layout") else {
        return;
    };
    let dir = tempfile_dir("unknown-layout");
    let cap = dir.join("nojit.lrec");
    let out = Command::new(bin("lrec"))
        .args(["-F", "499", "-o"])
        .arg(&cap)
        .arg("--")
        .arg(fixture_bin("luajit-nojit"))
        .arg(workload("chains.lua"))
        .arg("3")
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("matches none of the known ones"))
        .collect();
    assert_eq!(lines.len(), 1, "lrec said: {stderr}");
    assert!(
        lines[0].contains("recording native stacks only"),
        "{stderr}"
    );

    let (stacks, warnings) = folded(&cap, &["--offline"]);
    let samples: u64 = stacks.iter().map(|(_, n)| n).sum();
    assert!(samples >= 500, "only {samples} samples");
    let lua = stacks
        .iter()
        .filter(|(f, _)| f.iter().any(|f| f.contains(".lua:")))
        .count();
    assert_eq!(lua, 0, "Lua frames without a known layout");
    assert!(
        warnings.contains("matches none of the known ones"),
        "lanalyze said: {warnings}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
