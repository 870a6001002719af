//! Real hosts nobody here wrote, and the FFI, against ground truth: Debian's
//! `redis-server` (Lua 5.1 linked in, stripped: EVAL of fixtures/workloads/hosts/redis.lua),
//! `haproxy` (liblua5.3, two threads with a VM each, a new coroutine per request:
//! fixtures/workloads/hosts/haproxy.lua under wrk), LuaJIT's FFI both ways
//! (fixtures/workloads/lua/ffi.lua under Debian's luajit and upstream GC64/GC32, JIT on and
//! off) and a LuaJIT VM per thread in Debian's shared libluajit (fixtures/bin/lua-host-shared).
//! Each sample in a hot function must show its exact Lua chain above the host's native call
//! into Lua, and no Lua frame may stand anywhere else.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lrec_e2e::*;
use regex::Regex;

/// Waits until something listens on `port` (a server starting).
fn wait_for_port(port: u16, what: &str) {
    let start = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{what} did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A child process killed when the test ends, passing or not.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn workload(name: &str) -> PathBuf {
    root().join("fixtures/workloads").join(name)
}

/// The share of judged samples that are exact: those whose Lua chain of `chunk` ends in
/// one of `truths`' last functions are judged, and exact when the chain is that truth and
/// the whole stack matches `stack` (the host's native frames around it).
fn score_host(
    stacks: &[(Vec<String>, u64)],
    chunk: &str,
    truths: &[Vec<u32>],
    stack: &Regex,
) -> Score {
    let mut s = score_lua(stacks, chunk, truths);
    let mut exact = 0;
    for (frames, n) in stacks {
        if !truths.contains(&lua_chain(frames, chunk)) {
            continue;
        }
        let joined = frames.join(";");
        if stack.is_match(&joined) {
            exact += n;
        } else if s.wrong.len() < 10 {
            s.wrong.push((
                format!("(native frames around the chain wrong) {joined}"),
                *n,
            ));
        }
    }
    s.exact = exact;
    s
}

fn assert_exact(what: &str, s: &Score, min_judged: u64) {
    eprintln!(
        "{what}: {}/{} exact ({:.2} %), per chain {:?}",
        s.exact,
        s.judged,
        100.0 * s.fraction(),
        s.per_leaf
    );
    assert!(
        s.judged >= min_judged,
        "{what}: only {} samples judged",
        s.judged
    );
    assert!(
        s.fraction() >= 0.97,
        "{what}: only {:.2} % exact; wrong stacks: {:#?}",
        100.0 * s.fraction(),
        s.wrong
    );
}

#[test]
fn redis_eval() {
    let Some(_guard) = bpf_test("redis eval") else {
        return;
    };
    let (Some(server), Some(cli)) = (
        installed("/usr/bin/redis-server", "redis-server (EVAL)"),
        installed("/usr/bin/redis-cli", "redis-cli (EVAL)"),
    ) else {
        return;
    };
    let dir = tempfile_dir("redis");
    let port = free_port();
    let redis = Killed(
        Command::new(server)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(&dir)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for_port(port, "redis-server");
    // Scripts run one at a time: a client keeps one running (each takes ~0.5 s).
    let script = std::fs::read_to_string(workload("hosts/redis.lua")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let client = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let out = Command::new(&cli)
                    .args(["-p", &port.to_string(), "EVAL", &script, "0", "150"])
                    .output()
                    .unwrap();
                assert!(out.status.success(), "redis-cli: {out:?}");
            }
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    let cap = dir.join("redis.lrec");
    record_pid(&cap, redis.0.id(), 499, 5, &[]);
    stop.store(true, Ordering::Relaxed);
    client.join().unwrap();

    let (stacks, _) = folded(&cap, &["--offline"]);
    lua_is_placed("redis", &stacks, "user_script", &["lua_pcall"]);
    // main chunk (0) → top (7) → mid (6) → hot (1), called by redis for EVAL through
    // luaCallFunction and lua_pcall (luaD_* are static: named by offset).
    let truth = vec![vec![0, 7, 6, 1], vec![0, 7, 6]];
    let stack = Regex::new(
        r";evalGenericCommand;luaCallFunction;lua_pcall;(?:redis-check-rdb\+0x[0-9a-f]+;)+user_script:0;top user_script:7;mid user_script:6(?:;|$)",
    )
    .unwrap();
    assert_exact(
        "redis",
        &score_host(&stacks, "user_script", &truth, &stack),
        1500,
    );
    let info = String::from_utf8(lanalyze(&[cap.as_os_str(), "--info".as_ref()])).unwrap();
    assert!(
        info.contains("Lua 5.1.5 in /usr/bin/redis-check-rdb")
            && info.contains("luaV_execute by its opcode dispatch table"),
        "{info}"
    );
    drop(redis);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn haproxy_lua_service_per_thread() {
    let Some(_guard) = bpf_test("haproxy lua service") else {
        return;
    };
    let (Some(haproxy), Some(wrk)) = (
        installed("/usr/sbin/haproxy", "haproxy (Lua service)"),
        installed("/usr/bin/wrk", "wrk (load on haproxy)"),
    ) else {
        return;
    };
    let dir = tempfile_dir("haproxy");
    let port = free_port();
    let service = workload("hosts/haproxy.lua");
    let config = dir.join("haproxy.cfg");
    std::fs::write(
        &config,
        format!(
            "global\n  nbthread 2\n  lua-load-per-thread {}\n\
             defaults\n  mode http\n  timeout client 10s\n  timeout server 10s\n  timeout connect 1s\n\
             frontend work\n  bind 127.0.0.1:{port}\n  http-request use-service lua.work\n",
            service.display()
        ),
    )
    .unwrap();
    let server = Killed(
        Command::new(haproxy)
            .arg("-f")
            .arg(&config)
            .arg("-db")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for_port(port, "haproxy");
    let _load = Killed(
        Command::new(wrk)
            .args(["-t2", "-c4", "-d12s", &format!("http://127.0.0.1:{port}/")])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_secs(1));
    let cap = dir.join("haproxy.lrec");
    record_pid(&cap, server.0.id(), 499, 5, &[]);

    let (stacks, _) = folded(&cap, &["--offline"]);
    lua_is_placed("haproxy", &stacks, "haproxy.lua", &["lua_resume"]);
    // The service (8) → top (7) → mid (6) → hot (1), in a coroutine haproxy resumes from C
    // for each request (`resume` is gone when it tail-called luaV_execute).
    let truth = vec![vec![8, 7, 6, 1], vec![8, 7, 6]];
    let stack = Regex::new(
        r";hlua_applet_http_fct;(?:[^;]+;)*lua_resume;luaD_rawrunprotected;(?:resume;)?[^;]*haproxy\.lua:8;top [^;]*haproxy\.lua:7;mid [^;]*haproxy\.lua:6(?:;|$)",
    )
    .unwrap();
    let s = score_host(&stacks, "haproxy.lua", &truth, &stack);
    assert_exact("haproxy", &s, 1500);
    // Both threads ran their own VM's Lua.
    let threads: std::collections::BTreeSet<&str> = stacks
        .iter()
        .filter(|(f, _)| lua_chain(f, "haproxy.lua").last() == Some(&1))
        .map(|(f, _)| f[0].as_str())
        .collect();
    let info = String::from_utf8(lanalyze(&[cap.as_os_str(), "--info".as_ref()])).unwrap();
    let running = info
        .lines()
        .find(|l| l.contains("Lua 5.3"))
        .unwrap_or_default();
    assert!(running.contains("2 VMs running"), "{info}");
    eprintln!("haproxy: hot samples in threads {threads:?}; {running}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// ffi.lua under `luajit FLAGS`: C called from (compiled) Lua and Lua called back from C.
fn ffi_is_exact(what: &str, luajit: &Path, flags: &[&str]) {
    let Some(_guard) = bpf_test(what) else {
        return;
    };
    let lib = fixture("libffiwork.so");
    let dir = tempfile_dir(&what.replace(' ', "-"));
    let cap = dir.join("ffi.lrec");
    let target = Killed(
        Command::new(luajit)
            .args(flags)
            .arg(lua_workload("ffi.lua"))
            .arg("10")
            .arg(&lib)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_secs(1));
    record_pid(&cap, target.0.id(), 499, 6, &[]);
    drop(target);

    let (stacks, _) = folded(&cap, &["--offline"]);
    lua_is_placed(what, &stacks, "ffi.lua", &["lua_pcall"]);
    // Called back by qsort: main chunk (0) → sort_run (26) → [qsort…] → cmp (18) → hot (13).
    let back = vec![vec![0, 26, 18, 13], vec![0, 26, 18]];
    let stack = Regex::new(
        r";lua_pcall;[^;]*ffi\.lua:0;sort_run [^;]*ffi\.lua:26;(?:[^;]+;)*?[^;]*qsort[^;]*;(?:[^;]+;)*[^;]*ffi\.lua:18(?:;|$)",
    )
    .unwrap();
    assert_exact(
        &format!("{what} callback"),
        &score_host(&stacks, "ffi.lua", &back, &stack),
        300,
    );
    // No frame of the callback's callers above qsort.
    for (frames, n) in &stacks {
        if let Some(q) = frames.iter().position(|f| f.contains("qsort")) {
            let above = lua_chain(&frames[q..], "ffi.lua");
            assert!(
                above.iter().all(|l| [18, 13].contains(l)),
                "{what}: {n} samples with the callback's callers above qsort: {}",
                frames.join(";")
            );
        }
    }
    // Calling C: main chunk (0) → spin_run (32) → lrec_spin, from a trace or through
    // ffi.meta.__call when interpreted.
    let forward = Regex::new(
        r";lua_pcall;[^;]*ffi\.lua:0;spin_run [^;]*ffi\.lua:32;(?:[^;]+;)*lrec_spin(?:;[^;]*_\[k\])*$",
    )
    .unwrap();
    let spin: Vec<&(Vec<String>, u64)> = stacks
        .iter()
        .filter(|(f, _)| {
            f.iter()
                .rev()
                .find(|x| !x.ends_with("_[k]"))
                .is_some_and(|l| l == "lrec_spin")
        })
        .collect();
    let judged: u64 = spin.iter().map(|(_, n)| n).sum();
    let exact: u64 = spin
        .iter()
        .filter(|(f, _)| lua_chain(f, "ffi.lua") == [0, 32] && forward.is_match(&f.join(";")))
        .map(|(_, n)| n)
        .sum();
    eprintln!("{what} C from Lua: {exact}/{judged} exact");
    assert!(judged >= 200, "{what}: only {judged} samples in lrec_spin");
    assert!(
        exact as f64 >= 0.97 * judged as f64,
        "{what}: {exact}/{judged} in lrec_spin exact: {:#?}",
        spin.iter()
            .take(5)
            .map(|(f, n)| (f.join(";"), n))
            .collect::<Vec<_>>()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn ffi_debian_luajit_jit_on() {
    if let Some(lj) = installed("/usr/bin/luajit", "Debian luajit, FFI") {
        ffi_is_exact("ffi debian jit on", &lj, &[]);
    }
}

#[test]
fn ffi_debian_luajit_jit_off() {
    if let Some(lj) = installed("/usr/bin/luajit", "Debian luajit, FFI -joff") {
        ffi_is_exact("ffi debian joff", &lj, &["-joff"]);
    }
}

#[test]
fn ffi_gc64_jit_on() {
    ffi_is_exact("ffi gc64 jit on", &fixture_bin("luajit-gc64"), &[]);
}

#[test]
fn ffi_gc64_jit_off() {
    ffi_is_exact("ffi gc64 joff", &fixture_bin("luajit-gc64"), &["-joff"]);
}

#[test]
fn ffi_gc32_jit_on() {
    ffi_is_exact("ffi gc32 jit on", &fixture_bin("luajit-gc32"), &[]);
}

#[test]
fn ffi_gc32_jit_off() {
    ffi_is_exact("ffi gc32 joff", &fixture_bin("luajit-gc32"), &["-joff"]);
}

#[test]
fn luajit_vm_per_thread_in_a_shared_library() {
    let what = "luajit vm per thread (shared)";
    let Some(_guard) = bpf_test(what) else {
        return;
    };
    let dir = tempfile_dir("lua-host-shared");
    let cap = dir.join("host.lrec");
    let host = Killed(
        Command::new(fixture_bin("lua-host-shared"))
            .args(["8", "2"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_secs(1));
    record_pid(&cap, host.0.id(), 499, 5, &[]);
    drop(host);

    let (stacks, _) = folded(&cap, &["--offline"]);
    lua_is_placed(what, &stacks, "host/worker.lua", &["lua_pcall"]);
    // Thread vm-k: run (10) → work_k, called as f (4 + k) → hot_k (1 + k), JIT-compiled,
    // with every C frame down to the thread's start.
    let truths: Vec<Vec<u32>> = (0..2).map(|k| vec![10, 4 + k, 1 + k]).collect();
    let stack = Regex::new(
        r"^vm-(\d);(?:__GI___)?clone3;start_thread;worker;lua_pcall;host/worker\.lua:10;f host/worker\.lua:\d;hot_(\d) host/worker\.lua:\d(?:;|$)",
    )
    .unwrap();
    let mut s = score_host(&stacks, "host/worker.lua", &truths, &stack);
    // Each thread's samples name its own VM's function.
    let crossed: u64 = stacks
        .iter()
        .filter_map(|(f, n)| {
            let joined = f.join(";");
            let c = stack.captures(&joined)?;
            (c[1] != c[2]).then_some(*n)
        })
        .sum();
    s.exact -= crossed;
    assert_exact(what, &s, 1500);
    let info = String::from_utf8(lanalyze(&[cap.as_os_str(), "--info".as_ref()])).unwrap();
    let vm = info
        .lines()
        .find(|l| l.contains("LuaJIT 2.1 in"))
        .unwrap_or_default();
    assert!(
        vm.contains("libluajit-5.1.so.2") && vm.contains("2 VMs running"),
        "{info}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
