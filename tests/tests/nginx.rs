//! nginx with two workers and the lua module (Debian's nginx, libnginx-mod-http-lua and
//! luajit2) under wrk load, recorded with `lrec -p <master>`: both workers are sampled
//! and the samples in the hot Lua function show the exact handler chain under nginx's own
//! C frames (fixtures/nginx).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lrec_e2e::*;

/// Starts nginx from fixtures/nginx in `prefix`; returns the master's pid.
fn start_nginx(prefix: &Path, port: u16) -> u32 {
    let src = root().join("fixtures/nginx");
    std::fs::create_dir_all(prefix.join("lua")).unwrap();
    std::fs::create_dir_all(prefix.join("tmp")).unwrap();
    std::fs::copy(src.join("lua/handler.lua"), prefix.join("lua/handler.lua")).unwrap();
    let conf = std::fs::read_to_string(src.join("nginx.conf"))
        .unwrap()
        .replace("@PREFIX@", prefix.to_str().unwrap())
        .replace("@PORT@", &port.to_string());
    std::fs::write(prefix.join("nginx.conf"), conf).unwrap();
    run(Command::new("/usr/sbin/nginx")
        .arg("-p")
        .arg(prefix)
        .arg("-c")
        .arg(prefix.join("nginx.conf")));
    let pid_file = prefix.join("nginx.pid");
    let t0 = Instant::now();
    loop {
        if let Ok(pid) = std::fs::read_to_string(&pid_file) {
            if let Ok(pid) = pid.trim().parse() {
                return pid;
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "nginx did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn nginx_workers_show_the_handler_chain() {
    let Some(_guard) = bpf_test("nginx_workers_show_the_handler_chain") else {
        return;
    };
    if installed("/usr/sbin/nginx", "nginx + lua").is_none()
        || installed("/usr/lib/nginx/modules/ngx_http_lua_module.so", "nginx lua").is_none()
        || installed("/usr/bin/wrk", "wrk").is_none()
    {
        return;
    }
    let dir = tempfile_dir("nginx");
    let port = free_port();
    let master = start_nginx(&dir, port);
    let mut wrk = Command::new("/usr/bin/wrk")
        .args(["-t2", "-c8", "-d10s", &format!("http://127.0.0.1:{port}/")])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
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
