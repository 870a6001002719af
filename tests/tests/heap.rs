//! Lua heap snapshots (`lrec --lua-heap`, `lanalyze --heap`) against ground truth:
//! fixtures/workloads/lua/heap.lua builds strings, a closure's upvalue and a coroutine's
//! stack whose paths and sizes are known, under upstream LuaJIT GC64 and GC32 and
//! Debian's (OpenResty's) luajit: every object must be found at its path with the size
//! lj_str.c/lj_func.c give, the census must match the collector's count (1 % frozen, 5 %
//! live), and `--diff` must rank the grown cache first with its exact growth. nginx's two
//! workers (fixtures/nginx/lua/heapmod.lua) must each hold exactly the strings of the
//! requests it served.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use lrec_e2e::*;

/// Strings in the cache at first, their length, and how many the workload adds.
const N: u64 = 20_000;
const LEN: u64 = 100;
const GROW: u64 = 10_000;

/// LuaJIT's string size (lj_str_size): the GCstr header, then the bytes and a NUL,
/// rounded up to 4.
fn str_size(gc64: bool, len: u64) -> u64 {
    (if gc64 { 24 } else { 20 }) + ((len + 4) & !3)
}

/// heap.lua running under a LuaJIT, its output read line by line.
struct Workload {
    child: Child,
    lines: Receiver<String>,
    go: PathBuf,
}

impl Workload {
    fn start(luajit: &Path, dir: &Path) -> Workload {
        let go = dir.join("go");
        let mut child = Command::new(luajit)
            .arg(lua_workload("heap.lua"))
            .args([N, LEN, GROW].map(|n| n.to_string()))
            .arg(&go)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Workload { child, lines, go }
    }

    fn wait_for(&self, want: &str) {
        loop {
            match self.lines.recv_timeout(Duration::from_secs(60)) {
                Ok(line) if line == want => return,
                Ok(_) => {}
                Err(e) => panic!("heap.lua did not say {want:?}: {e}"),
            }
        }
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `lrec -p PID --lua-heap [--freeze]` into DIR/NAME.
fn snapshot(dir: &Path, name: &str, pid: u32, freeze: bool) -> PathBuf {
    let capture = dir.join(name);
    let mut cmd = Command::new(bin("lrec"));
    cmd.args(["-p", &pid.to_string(), "--lua-heap", "-q", "-o"])
        .arg(&capture);
    if freeze {
        cmd.arg("--freeze");
    }
    run(&mut cmd);
    capture
}

fn lanalyze(args: &[&std::ffi::OsStr]) -> String {
    let out = run(Command::new(bin("lanalyze")).args(args));
    String::from_utf8(out.stdout).unwrap()
}

/// One row of `--heap --csv`.
struct Row {
    pid: u32,
    kind: String,
    size: u64,
    path: String,
}

fn objects(capture: &Path) -> Vec<Row> {
    let csv = lanalyze(&[capture.as_os_str(), "--heap".as_ref(), "--csv".as_ref()]);
    csv.lines()
        .skip(1)
        .map(|line| {
            let f: Vec<&str> = line.splitn(7, ',').collect();
            let path = f[6].trim_matches('"').replace("\"\"", "\"");
            Row {
                pid: f[0].parse().unwrap(),
                kind: f[4].into(),
                size: f[5].parse().unwrap(),
                path,
            }
        })
        .collect()
}

/// The sizes of the objects of `kind` at `path`.
fn sizes_at(rows: &[Row], path: &str, kind: &str) -> Vec<u64> {
    rows.iter()
        .filter(|r| r.path == path && r.kind == kind)
        .map(|r| r.size)
        .collect()
}

/// Per VM of the summary: how much of the collector's count the census found (%).
fn found_percent(capture: &Path) -> Vec<f64> {
    let text = lanalyze(&[capture.as_os_str(), "--heap".as_ref()]);
    let re = regex::Regex::new(r"\(([0-9.]+) % of it found\)").unwrap();
    let found: Vec<f64> = re
        .captures_iter(&text)
        .map(|c| c[1].parse().unwrap())
        .collect();
    assert!(!found.is_empty(), "no census in:\n{text}");
    eprintln!("{text}");
    found
}

fn assert_all(what: &str, sizes: &[u64], count: u64, size: u64) {
    assert_eq!(
        sizes.len() as u64,
        count,
        "{what}: {} objects found, {count} expected",
        sizes.len()
    );
    assert!(
        sizes.iter().all(|&s| s == size),
        "{what}: sizes {:?}…, each should be {size}",
        &sizes[..sizes.len().min(5)]
    );
}

fn heap_is_exact(what: &str, luajit: &Path, gc64: bool) {
    let Some(_guard) = bpf_test(what) else {
        return;
    };
    let dir = tempfile_dir(&what.replace(' ', "-"));
    let w = Workload::start(luajit, &dir);
    w.wait_for("ready 1");
    let pid = w.child.id();
    let before = snapshot(&dir, "before.lrec", pid, true);
    let live = snapshot(&dir, "live.lrec", pid, false);

    let rows = objects(&before);
    let cache = r#"package.loaded["leaky"].cache"#;
    assert_all(
        &format!("{what}: {cache}[*]"),
        &sizes_at(&rows, &format!("{cache}[*]"), "string"),
        N,
        str_size(gc64, LEN),
    );
    let pool = "_G.handler<upvalue pool>";
    assert_all(
        &format!("{what}: {pool}[*]"),
        &sizes_at(&rows, &format!("{pool}[*]"), "string"),
        100,
        str_size(gc64, 200),
    );
    // The closure (one upvalue: sizeof(GCfuncL)) and its upvalue (sizeof(GCupval)).
    let (func, upval) = if gc64 { (48, 48) } else { (24, 24) };
    assert_eq!(sizes_at(&rows, "_G.handler", "function"), [func], "{what}");
    assert_eq!(sizes_at(&rows, pool, "upvalue"), [upval], "{what}");
    assert_eq!(sizes_at(&rows, pool, "table").len(), 1, "{what}: the pool");
    assert_all(
        &format!("{what}: _G.co<stack>[*]"),
        &sizes_at(&rows, "_G.co<stack>[*]", "string"),
        50,
        str_size(gc64, 100),
    );
    assert_eq!(sizes_at(&rows, "_G.co", "thread").len(), 1, "{what}");

    for (capture, bound) in [(&before, 1.0), (&live, 5.0)] {
        for found in found_percent(capture) {
            assert!(
                (found - 100.0).abs() <= bound,
                "{what}: the census holds {found} % of the collector's count (bound {bound} %)"
            );
        }
    }

    // The leak: GROW more strings in the cache.
    std::fs::write(&w.go, "").unwrap();
    w.wait_for("ready 2");
    let after = snapshot(&dir, "after.lrec", pid, true);
    let grown = sizes_at(&objects(&after), &format!("{cache}[*]"), "string");
    assert_all(
        &format!("{what}: after"),
        &grown,
        N + GROW,
        str_size(gc64, LEN),
    );
    let diff = lanalyze(&[
        "--diff".as_ref(),
        before.as_os_str(),
        after.as_os_str(),
        "--heap".as_ref(),
        "--top".as_ref(),
        "3".as_ref(),
    ]);
    eprintln!("{diff}");
    let first = diff
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("growth"))
        .nth(1)
        .unwrap_or_else(|| panic!("{what}: no rows in:\n{diff}"));
    assert!(
        first.ends_with(&format!("+{GROW}  {cache}")),
        "{what}: the cache should grow most, by {GROW} strings:\n{diff}"
    );
}

#[test]
fn upstream_gc64_heap() {
    heap_is_exact("heap gc64", &fixture_bin("luajit-gc64"), true);
}

#[test]
fn upstream_gc32_heap() {
    heap_is_exact("heap gc32", &fixture_bin("luajit-gc32"), false);
}

#[test]
fn debian_luajit_heap() {
    if let Some(lj) = installed("/usr/bin/luajit", "Debian luajit heap") {
        heap_is_exact("heap debian luajit", &lj, true);
    }
}

/// GET `path` from 127.0.0.1:`port`: the body.
fn get(port: u16, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: lrec\r\n\r\n").unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.trim().to_string())
        .unwrap_or_default()
}

#[test]
fn nginx_workers_heaps_are_separate() {
    let Some(_guard) = bpf_test("nginx_workers_heaps_are_separate") else {
        return;
    };
    if !nginx_installed() {
        return;
    }
    let dir = tempfile_dir("heap-nginx");
    let port = free_port();
    let master = start_nginx(&dir, port);
    // Each request keeps a string in the worker that served it, which answers its pid.
    let mut served: BTreeMap<u32, u64> = BTreeMap::new();
    for _ in 0..300 {
        *served
            .entry(get(port, "/keep").parse().unwrap())
            .or_default() += 1;
    }
    let capture = snapshot(&dir, "nginx.lrec", master, true);
    let rows = objects(&capture);
    let found = found_percent(&capture);
    let _ = Command::new("kill").arg(master.to_string()).status();
    let kept = r#"package.loaded["heapmod"].kept[*]"#;
    for (&worker, &n) in &served {
        let sizes: Vec<u64> = rows
            .iter()
            .filter(|r| r.pid == worker && r.path == kept && r.kind == "string")
            .map(|r| r.size)
            .collect();
        assert_all(
            &format!("nginx worker {worker}"),
            &sizes,
            n,
            str_size(true, 100),
        );
    }
    assert!(
        served.len() == 2 || served.len() == 1,
        "two workers: {served:?}"
    );
    for f in found {
        assert!(
            (f - 100.0).abs() <= 1.0,
            "nginx: census {f} % of the collector's"
        );
    }
}
