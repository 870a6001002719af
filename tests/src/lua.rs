//! Lua ground truth for the e2e tests: Lua chains of folded stacks scored against the
//! workloads' true chains, Lua frames checked to stand where an interpreter frame stands,
//! and the recordings of Lua workloads the suites share.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use regex::Regex;

use crate::{bin, bpf_test, folded, record_pid, root, tempfile_dir, Score};

/// The Lua functions of a folded stack from one chunk, as their LINEDEFINED, root first:
/// frames read `[NAME ]CHUNK:LINEDEFINED[@LINE]`.
pub fn lua_chain(frames: &[String], chunk: &str) -> Vec<u32> {
    let re = Regex::new(&format!(
        r"(?:^|\s)\S*{}:(\d+)(?:@\d+)?$",
        regex::escape(chunk)
    ))
    .unwrap();
    frames
        .iter()
        .filter_map(|f| re.captures(f).and_then(|c| c[1].parse().ok()))
        .collect()
}

/// Scores Lua stacks: a sample counts when its innermost Lua function of `chunk` is a
/// hot one (the last function of a true chain), and is exact when its Lua chain is one of
/// `truths`.
pub fn score_lua(stacks: &[(Vec<String>, u64)], chunk: &str, truths: &[Vec<u32>]) -> Score {
    let mut s = Score::default();
    for (frames, n) in stacks {
        let chain = lua_chain(frames, chunk);
        if !chain
            .last()
            .is_some_and(|leaf| truths.iter().any(|t| t.last() == Some(leaf)))
        {
            continue;
        }
        s.judged += n;
        let key = chain
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(">");
        *s.per_leaf
            .entry(key.chars().take(40).collect())
            .or_default() += n;
        if truths.contains(&chain) {
            s.exact += n;
        } else {
            s.wrong.push((frames.join(";"), *n));
        }
    }
    s.wrong.sort_by_key(|w| std::cmp::Reverse(w.1));
    s.wrong.truncate(10);
    s
}

/// Whether folded frame `frame` is a Lua function of `chunk` (`[NAME ]CHUNK:LINE[@LINE]`).
pub fn is_lua_frame(frame: &str, chunk: &str) -> bool {
    let name = frame.rsplit(' ').next().unwrap_or(frame);
    name.split_once(':').is_some_and(|(file, line)| {
        file.ends_with(chunk)
            && line
                .split('@')
                .next()
                .is_some_and(|l| l.parse::<u32>().is_ok())
    })
}

/// Frames that only a thread's or process's root can be: never above a Lua frame.
const THREAD_ROOTS: &[&str] = &[
    "_start",
    "clone",
    "clone3",
    "__GI___clone3",
    "start_thread",
    "main",
];

/// Where the Lua frames of `chunk` stand among a sample's native frames.
#[derive(Debug, Default)]
pub struct Placement {
    /// Samples with at least one Lua frame of the chunk.
    pub with_lua: u64,
    /// Of those, the ones whose Lua frames are printed outside the interpreter's native
    /// frames, and some of them.
    pub misplaced: u64,
    pub examples: Vec<String>,
}

/// Checks that no Lua frame of `chunk` is printed outside the interpreter's native frames:
/// each stack (thread name first) begins with native frames, none of the thread's root
/// frames (`_start`, `clone3`, `main`…) comes after a Lua frame, and, when `entries` are
/// given, one of them (the host's native call into Lua: `lua_pcall`, `lua_resume`…)
/// comes before the first one.
pub fn lua_placement(stacks: &[(Vec<String>, u64)], chunk: &str, entries: &[&str]) -> Placement {
    let mut p = Placement::default();
    for (frames, n) in stacks {
        let Some(first) = frames.iter().position(|f| is_lua_frame(f, chunk)) else {
            continue;
        };
        p.with_lua += n;
        let root_after = frames[first..]
            .iter()
            .any(|f| THREAD_ROOTS.contains(&f.as_str()));
        let entered = entries.is_empty()
            || frames[..first]
                .iter()
                .any(|f| entries.contains(&f.as_str()));
        if first < 2 || root_after || !entered {
            p.misplaced += n;
            if p.examples.len() < 5 {
                p.examples.push(frames.join(";"));
            }
        }
    }
    p
}

/// Samples whose leaf is in JIT-compiled code (`[unknown]`: anonymous memory) without any
/// Lua frame of `chunk`, and all samples.
pub fn traces_without_lua(stacks: &[(Vec<String>, u64)], chunk: &str) -> (u64, u64) {
    let mut bare = 0;
    let mut all = 0;
    for (frames, n) in stacks {
        all += n;
        let user_leaf = frames.iter().rev().find(|f| !f.ends_with("_[k]"));
        if user_leaf.is_some_and(|f| f == "[unknown]")
            && !frames.iter().any(|f| is_lua_frame(f, chunk))
        {
            bare += n;
        }
    }
    (bare, all)
}

/// Asserts [`lua_placement`] finds nothing misplaced, and (LuaJIT) that at most 0.5 % of
/// the samples are in compiled code without a Lua frame.
pub fn lua_is_placed(what: &str, stacks: &[(Vec<String>, u64)], chunk: &str, entries: &[&str]) {
    let p = lua_placement(stacks, chunk, entries);
    eprintln!(
        "{what}: {} samples with Lua frames, {} misplaced",
        p.with_lua, p.misplaced
    );
    assert_eq!(
        p.misplaced, 0,
        "{what}: Lua frames outside the interpreter's: {:#?}",
        p.examples
    );
    let (bare, all) = traces_without_lua(stacks, chunk);
    eprintln!("{what}: {bare} of {all} samples in compiled code without a Lua frame");
    assert!(
        bare as f64 <= 0.005 * all as f64,
        "{what}: {bare} of {all} samples in compiled code without a Lua frame"
    );
}

/// chains.lua's true Lua chains of `hot` (defined at line 12), root first.
pub fn chains_truth() -> Vec<Vec<u32>> {
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

/// A Lua workload of fixtures/workloads/lua.
pub fn lua_workload(name: &str) -> PathBuf {
    root().join("fixtures/workloads/lua").join(name)
}

/// kinds.lua's true Lua chains, one per hot function (the last line of each), root first.
pub fn kinds_truth() -> Vec<Vec<u32>> {
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
        // Recursion through pcall: each frame's function is the one below the C frame.
        vec![0, 58, 61, 60, 60, 60, 60, 59],
    ]
}

/// Starts `INTERPRETER FLAGS… WORKLOAD ARG` (stdout discarded) and gives it 1 s to start.
fn start_lua(interpreter: &Path, flags: &[&str], file: &str, arg: &str) -> std::process::Child {
    let target = Command::new(interpreter)
        .args(flags)
        .arg(lua_workload(file))
        .arg(arg)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    target
}

/// Runs `INTERPRETER FLAGS… WORKLOAD RUN_SECS`, attaches `lrec -p -F 499` to it after 1 s
/// for `rec_secs`, and returns the test's directory and the capture.
pub fn record_lua(
    what: &str,
    interpreter: &Path,
    flags: &[&str],
    file: &str,
    run_secs: u32,
    rec_secs: u32,
    lrec_args: &[&str],
) -> (PathBuf, PathBuf) {
    record_lua_at(
        what,
        interpreter,
        flags,
        file,
        (run_secs, rec_secs, 499),
        lrec_args,
    )
}

/// [`record_lua`] at its own rate: `(run_secs, rec_secs, hz)`.
fn record_lua_at(
    what: &str,
    interpreter: &Path,
    flags: &[&str],
    file: &str,
    (run_secs, rec_secs, hz): (u32, u32, u32),
    lrec_args: &[&str],
) -> (PathBuf, PathBuf) {
    let dir = tempfile_dir(&what.replace(' ', "-"));
    let cap = dir.join("lua.lrec");
    let mut target = start_lua(interpreter, flags, file, &run_secs.to_string());
    record_pid(&cap, target.id(), hz, rec_secs, lrec_args);
    target.kill().unwrap();
    target.wait().unwrap();
    (dir, cap)
}

/// How the ground-truth tests record a Lua workload: attached after 1 s, for 4 s at 999 Hz
/// (~3,800 samples of a single-threaded workload, as 8 s at 499 Hz took, in half the time:
/// some sixty tests record so).
pub const EXACT_SECS: u32 = 4;
pub const EXACT_HZ: u32 = 999;

/// Runs a Lua workload under an interpreter for 10 s, attaches after 1 s for EXACT_SECS at
/// EXACT_HZ, and checks that ≥ 95 % of the samples whose innermost Lua function is a hot one (the last
/// line of a true chain) show its exact chain, and that every chain is seen.
pub fn lua_is_exact(
    what: &str,
    interpreter: &Path,
    flags: &[&str],
    file: &str,
    truths: &[Vec<u32>],
    lrec_args: &[&str],
) {
    lua_is_exact_at(what, interpreter, flags, file, truths, lrec_args, 0.95);
}

/// [`lua_is_exact`] with its own bound: at least `min` of the samples exact.
pub fn lua_is_exact_at(
    what: &str,
    interpreter: &Path,
    flags: &[&str],
    file: &str,
    truths: &[Vec<u32>],
    lrec_args: &[&str],
    min: f64,
) {
    let Some(_guard) = bpf_test(what) else {
        return;
    };
    let how = (10, EXACT_SECS, EXACT_HZ);
    let (dir, cap) = record_lua_at(what, interpreter, flags, file, how, lrec_args);
    assert_lua_exact(what, &cap, file, truths, min);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Scores capture `cap` against the true chains of `file`: its Lua frames are placed
/// where interpreter frames stand, at least 500 samples in hot functions are judged, at
/// least `min` of them are exact, and every chain is seen (a failure of one kind cannot
/// hide in the average).
pub fn assert_lua_exact(what: &str, cap: &Path, file: &str, truths: &[Vec<u32>], min: f64) {
    let (stacks, _) = folded(cap, &["--offline"]);
    lua_is_placed(what, &stacks, file, &[]);
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
        total.fraction() >= min,
        "{what}: only {:.2} % exact; wrong stacks: {:#?}",
        100.0 * total.fraction(),
        total.wrong
    );
    for truth in truths {
        let seen: u64 = stacks
            .iter()
            .filter(|(f, _)| lua_chain(f, file) == *truth)
            .map(|(_, n)| n)
            .sum();
        assert!(seen >= 10, "{what}: chain {truth:?} seen {seen} times");
    }
}

/// A stripped host with Lua linked in (fixtures/workloads/lua_host.c), three threads with
/// a VM each. Thread vm-k runs run (line 10) → work_k (4 + k) → hot_k (1 + k); a thread's
/// samples must all name its own VM's functions.
pub fn several_vms_are_told_apart(what: &str, host: PathBuf) {
    let Some(_guard) = bpf_test(what) else {
        return;
    };
    let dir = tempfile_dir(what);
    let cap = dir.join("host.lrec");
    let mut target = Command::new(host)
        .args(["8", "3"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    record_pid(&cap, target.id(), 499, 5, &[]);
    target.kill().unwrap();
    target.wait().unwrap();

    let (stacks, _) = folded(&cap, &["--offline"]);
    lua_is_placed(what, &stacks, "host/worker.lua", &[]);
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
    eprintln!("{what}: {exact}/{judged} exact; hot functions per thread {hot_of_thread:?}");
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

/// A Lua VM whose layout lrec does not know, running chains.lua: lrec says so in one line
/// (holding every one of `says`) and records native stacks only, never guessed Lua frames;
/// lanalyze repeats the warning. The caller holds the recording lock.
pub fn unknown_vm_is_said_once(what: &str, interpreter: &Path, says: &[&str]) {
    let dir = tempfile_dir(what);
    let cap = dir.join("unknown.lrec");
    let out = Command::new(bin("lrec"))
        .args(["-F", "499", "-o"])
        .arg(&cap)
        .arg("--")
        .arg(interpreter)
        .arg(lua_workload("chains.lua"))
        .arg("3")
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| says.iter().all(|s| l.contains(s)))
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
        says.iter().all(|s| warnings.contains(s)),
        "lanalyze said: {warnings}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Runs part 8's 200-deep chain of distinct functions (fixtures/workloads/lua/cost.lua),
/// records it for 3 s and checks that lrec's summary says ≥ 90 % of its Lua frames were
/// named from call sites remembered in earlier samples (98.8 % measured): the walk's cost
/// per frame depends on it, and two sites evicting each other from BPF's cache once
/// left one frame in four to be read at every sample, with every stack still right. The
/// summary also says how the sites were proved (`proved`: by counting the protos freed, in
/// a binary that names its free function, else by reading each site's proto), and (`memo`:
/// LuaJIT, PUC Lua 5.2+) that ≥ 50 % of the frames were taken from the CPU's last full walk
/// (LuaJIT 82-86 %, Lua 5.4 70 % measured) with no walk cut for want of it.
pub fn deep_frames_are_named_from_sites(
    what: &str,
    interpreter: &Path,
    flags: &[&str],
    proved: &str,
    memo: bool,
) {
    let Some(_guard) = bpf_test(what) else {
        return;
    };
    let dir = tempfile_dir(&what.replace(' ', "-"));
    let mut target = start_lua(interpreter, flags, "cost.lua", "200");
    let out = Command::new(bin("lrec"))
        .args(["-p", &target.id().to_string(), "-F", "999", "-d", "3", "-o"])
        .arg(dir.join("deep.lrec"))
        .output()
        .unwrap();
    target.kill().unwrap();
    target.wait().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what}: lrec failed: {err}");
    let named = Regex::new(r"Lua frames: (\d+), ([0-9.]+) % named from call sites")
        .unwrap()
        .captures(&err)
        .unwrap_or_else(|| panic!("{what}: no Lua frames line in lrec's summary:\n{err}"));
    let (frames, share): (u64, f64) = (named[1].parse().unwrap(), named[2].parse().unwrap());
    eprintln!("{what}: {frames} Lua frames, {share} % named from call sites");
    assert!(
        frames > 20_000,
        "{what}: {frames} Lua frames in 3 s of a 200-deep chain"
    );
    assert!(
        share >= 90.0,
        "{what}: {share} % of Lua frames named from call sites; lrec said:\n{err}"
    );
    let name = format!("{}: ", interpreter.file_name().unwrap().to_string_lossy());
    let said = err.lines().any(|l| {
        l.strip_prefix("lrec: Lua call sites in ")
            .and_then(|l| l.split_once(&name))
            .is_some_and(|(dir, how)| dir.ends_with('/') && how.starts_with(proved))
    });
    assert!(said, "{what}: no line on {name}{proved}; lrec said:\n{err}");
    if memo {
        // The frames below the innermost few are the same from one sample to the next,
        // taken from the CPU's last full walk once their words are compared, and every
        // walk that took them found them (ebpf/lua_memo.h, record/src/lua/memo.rs).
        let taken = Regex::new(
            r"Lua frames taken unchanged from their CPU's last full walk [^:]*: (\d+), ([0-9.]+) %; (\d+) walks cut",
        )
        .unwrap()
        .captures(&err)
        .unwrap_or_else(|| panic!("{what}: no line on frames taken from memos:\n{err}"));
        let (share, cut): (f64, u64) = (taken[2].parse().unwrap(), taken[3].parse().unwrap());
        eprintln!("{what}: {share} % of Lua frames taken from memos, {cut} walks cut");
        assert!(
            share >= 50.0,
            "{what}: {share} % taken from memos; lrec said:\n{err}"
        );
        assert_eq!(
            cut, 0,
            "{what}: walks cut for want of a memo; lrec said:\n{err}"
        );
    }
    std::fs::remove_dir_all(dir).ok();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_folded;

    #[test]
    fn lua_frames_before_the_root_or_the_entry_are_misplaced() {
        // The issue's redis stack: Lua frames printed before _start.
        let bad = "redis-server;user_script:9;mid user_script:6;hot user_script:1;_start;main;evalGenericCommand;luaCallFunction;lua_pcall;redis-check-rdb+0x158420 3";
        let good = "redis-server;_start;main;evalGenericCommand;luaCallFunction;lua_pcall;redis-check-rdb+0x158420;user_script:0;mid user_script:6;hot user_script:1 5";
        let stacks = parse_folded(&format!("{bad}\n{good}"));
        let p = lua_placement(&stacks, "user_script", &["lua_pcall"]);
        assert_eq!((p.with_lua, p.misplaced), (8, 3));
        // Without the entry on the stack, even well-formed frames are misplaced.
        let p = lua_placement(&parse_folded(good), "user_script", &["lua_resume"]);
        assert_eq!(p.misplaced, 5);
        assert!(is_lua_frame("hot /tmp/x/svc.lua:1@3", "svc.lua"));
        assert!(!is_lua_frame("luaV_execute", "svc.lua"));
        assert!(!is_lua_frame("libsvc.lua.so+0x10", "svc.lua"));
    }

    #[test]
    fn samples_in_traces_without_lua_frames_are_counted() {
        let s = parse_folded(
            "vm-0;[truncated];[unknown] 2\nvm-0;[truncated];[unknown];irq_[k] 1\nvm-0;clone3;host/worker.lua:10;[unknown] 7",
        );
        assert_eq!(traces_without_lua(&s, "host/worker.lua"), (3, 10));
    }
}
