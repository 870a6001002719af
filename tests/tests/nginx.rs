//! nginx with two workers and the lua module (Debian's nginx, libnginx-mod-http-lua and
//! luajit2) under wrk load, recorded with `lrec -p <master>`: both workers are sampled
//! and the samples in the hot Lua function show the exact handler chain under nginx's own
//! C frames; with `--off-cpu`, requests waiting in ngx.sleep and in a cosocket read show
//! the handler chain that waits (fixtures/nginx).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use lrec_e2e::*;

/// nginx from fixtures/nginx, with wrk (WRK_ARGS) requesting PATH for 10 s, after 1 s of
/// it: (its prefix, the master's pid, wrk); None (said) when nginx, its lua module or wrk
/// is missing.
fn nginx_under_load(tag: &str, path: &str, wrk_args: &[&str]) -> Option<(PathBuf, u32, Child)> {
    if !nginx_installed() || installed("/usr/bin/wrk", "wrk").is_none() {
        return None;
    }
    let dir = tempfile_dir(tag);
    let port = free_port();
    let master = start_nginx(&dir, port);
    let wrk = Command::new("/usr/bin/wrk")
        .args(wrk_args)
        .args(["-d10s", &format!("http://127.0.0.1:{port}{path}")])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    Some((dir, master, wrk))
}

#[test]
fn nginx_workers_show_the_handler_chain() {
    let Some(_guard) = bpf_test("nginx_workers_show_the_handler_chain") else {
        return;
    };
    let Some((dir, master, mut wrk)) = nginx_under_load("nginx", "/", &["-t2", "-c8"]) else {
        return;
    };
    let cap = dir.join("nginx.lrec");
    record_pid(&cap, master, 499, 6, &[]);
    // SAFETY: signals the nginx master this test started.
    unsafe { libc::kill(master as i32, libc::SIGTERM) };
    let _ = wrk.kill();
    let _ = wrk.wait();

    let (stacks, _) = folded(&cap, &["--offline", "--per-pid", "--no-thread-names"]);
    let truth = vec![21, 15, 16, 9];
    let mut judged = 0;
    let mut exact = 0;
    let mut workers = std::collections::BTreeSet::new();
    let mut wrong = Vec::new();
    for (frames, n) in &stacks {
        let chain = lua_chain(frames, "handler.lua");
        if chain.last() != Some(&9) {
            continue;
        }
        judged += n;
        workers.insert(frames[0].clone());
        // Under nginx's own C frames, the lua module's thread runner, then the
        // content_by_lua_block's chunk, then the module's functions.
        let joined = frames.join(";");
        let under_nginx = joined.contains(";main;ngx_master_process_cycle;")
            && joined.contains(";ngx_http_lua_run_thread;content_by_lua(nginx.conf:");
        if chain == truth && under_nginx {
            exact += n;
        } else {
            wrong.push((joined, *n));
        }
    }
    eprintln!(
        "nginx: {exact}/{judged} samples in hot exact ({:.2} %), workers {workers:?}",
        100.0 * exact as f64 / judged.max(1) as f64
    );
    assert!(judged >= 300, "only {judged} samples in hot");
    assert!(workers.len() >= 2, "not both workers sampled: {workers:?}");
    wrong.sort_by_key(|w| std::cmp::Reverse(w.1));
    wrong.truncate(5);
    assert!(
        exact as f64 >= 0.95 * judged as f64,
        "{exact}/{judged} exact; wrong: {wrong:#?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Requests to /wait (fixtures/nginx/lua/waits.lua) spin, sleep 20 ms in ngx.sleep, spin,
/// and read from an upstream that answers after 30 ms: `--off-cpu` shows each wait under
/// the Lua chain that yielded, and `--wall` puts those waits next to the CPU samples.
#[test]
fn nginx_lua_waits_show_the_handler_chain() {
    let Some(_guard) = bpf_test("nginx_lua_waits_show_the_handler_chain") else {
        return;
    };
    let Some((dir, master, mut wrk)) = nginx_under_load("nginx-waits", "/wait", &["-t1", "-c4"])
    else {
        return;
    };
    let cap = dir.join("waits.lrec");
    record_pid(&cap, master, 499, 6, &["--off-cpu"]);
    // SAFETY: signals the nginx master this test started.
    unsafe { libc::kill(master as i32, libc::SIGTERM) };
    let _ = wrk.kill();
    let _ = wrk.wait();

    // Microseconds waited per Lua chain (LINEDEFINED in waits.lua, root first).
    let (stacks, _) = folded(&cap, &["--offline", "--off-cpu", "--no-thread-names"]);
    let (sleep, socket, upstream) = (vec![29, 15], vec![29, 19], vec![37]);
    let mut per_chain = std::collections::BTreeMap::<Vec<u32>, u64>::new();
    let mut total = 0;
    let mut wrong = Vec::new();
    for (frames, us) in &stacks {
        if frames.last().map(String::as_str) != Some("[coroutine yielded]") {
            continue;
        }
        total += us;
        let chain = lua_chain(frames, "waits.lua");
        let joined = frames.join(";");
        // The Lua frames replace lua_resume, under the module's thread runner.
        let placed = joined.contains(";ngx_http_lua_run_thread;content_by_lua(nginx.conf:")
            && !joined.contains("lua_resume");
        if placed && [&sleep, &socket, &upstream].contains(&&chain) {
            *per_chain.entry(chain).or_default() += us;
        } else {
            wrong.push((joined, *us));
        }
    }
    let exact: u64 = per_chain.values().sum();
    let ms = |chain: &Vec<u32>| per_chain.get(chain).copied().unwrap_or(0) as f64 / 1e3;
    eprintln!(
        "nginx waits: {exact}/{total} us under an exact chain; ngx.sleep {:.0} ms, \
         cosocket read {:.0} ms, upstream's ngx.sleep {:.0} ms",
        ms(&sleep),
        ms(&socket),
        ms(&upstream)
    );
    wrong.sort_by_key(|w| std::cmp::Reverse(w.1));
    wrong.truncate(5);
    assert!(total >= 1_000_000, "only {total} us of Lua waits recorded");
    assert!(
        exact as f64 >= 0.95 * total as f64,
        "{exact}/{total} us exact; wrong: {wrong:#?}"
    );
    // Each request sleeps 20 ms, then waits ~30 ms for the upstream, which sleeps 30 ms
    // (in either worker: one that serves only the upstream runs little Lua code).
    for (what, chain) in [("cosocket read", &socket), ("upstream's sleep", &upstream)] {
        let ratio = ms(chain) / ms(&sleep).max(1.0);
        assert!(
            (1.2..2.0).contains(&ratio),
            "{what}/ngx.sleep wait ratio {ratio:.2}, expected ~1.5"
        );
    }

    // --wall: the handler's CPU (spin) and its waits in one profile, under one root.
    let (stacks, _) = folded(&cap, &["--offline", "--wall", "--no-thread-names"]);
    let with_chain = |chain: &[u32], leaf: Option<&str>| {
        stacks
            .iter()
            .filter(|(f, _)| {
                lua_chain(f, "waits.lua") == chain
                    && leaf.is_none_or(|l| f.last().map(String::as_str) == Some(l))
            })
            .map(|(_, n)| n)
            .sum::<u64>()
    };
    let cpu = with_chain(&[29, 9], None);
    let waited = with_chain(&sleep, Some("[coroutine yielded]"));
    eprintln!("nginx --wall: run → spin {cpu} us on CPU, run → nap {waited} us waiting");
    assert!(
        cpu > 0 && waited > 0,
        "--wall lacks CPU ({cpu}) or waits ({waited})"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
