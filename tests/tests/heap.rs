//! Lua heap snapshots (`lrec --lua-heap`, `lanalyze --heap`) against ground truth:
//! fixtures/workloads/lua/heap.lua builds strings, a closure's upvalue and a coroutine's
//! stack whose paths and sizes are known, under upstream LuaJIT GC64 and GC32 and
//! Debian's (OpenResty's) luajit, and PUC Lua 5.1–5.5: every object must be found at its path with the size
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

/// What a VM allocates for the workload's objects.
#[derive(Clone, Copy)]
struct Sizes {
    /// A string's header; LuaJIT rounds the bytes and their NUL up to 4 (lj_str_size),
    /// PUC Lua does not (sizelstring).
    str_header: u64,
    str_round4: bool,
    /// A Lua closure with one upvalue, and the upvalue.
    closure1: u64,
    upvalue: u64,
}

const GC64: Sizes = Sizes {
    str_header: 24,
    str_round4: true,
    closure1: 48,
    upvalue: 48,
};
const GC32: Sizes = Sizes {
    str_header: 20,
    str_round4: true,
    closure1: 24,
    upvalue: 24,
};
/// PUC Lua 5.2 and 5.4 (5.1's closures are 8 bytes bigger, 5.3's upvalues 8 smaller).
const PUC: Sizes = Sizes {
    str_header: 24,
    str_round4: false,
    closure1: 40,
    upvalue: 40,
};

fn str_size(s: Sizes, len: u64) -> u64 {
    match s.str_round4 {
        true => s.str_header + ((len + 4) & !3),
        false => s.str_header + len + 1,
    }
}

/// heap.lua running under a Lua, its output read line by line.
struct Workload {
    child: Child,
    lines: Receiver<String>,
    go: PathBuf,
}

impl Workload {
    fn start(lua: &Path, dir: &Path) -> Workload {
        let go = dir.join("go");
        let mut child = Command::new(lua)
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
    detail: String,
}

/// The quoted fields at the end of a CSV row (RFC 4180: `""` is a quote).
fn quoted_fields(mut rest: &str) -> Vec<String> {
    let mut fields = Vec::new();
    while let Some(r) = rest.strip_prefix('"') {
        let mut field = String::new();
        let mut chars = r.char_indices().peekable();
        let mut end = r.len();
        while let Some((i, c)) = chars.next() {
            if c == '"' {
                if chars.peek().is_some_and(|&(_, n)| n == '"') {
                    field.push('"');
                    chars.next();
                    continue;
                }
                end = i + 1;
                break;
            }
            field.push(c);
        }
        fields.push(field);
        rest = r[end..].strip_prefix(',').unwrap_or("");
    }
    fields
}

fn objects(capture: &Path) -> Vec<Row> {
    let csv = lanalyze(&[capture.as_os_str(), "--heap".as_ref(), "--csv".as_ref()]);
    csv.lines()
        .skip(1)
        .map(|line| {
            let f: Vec<&str> = line.splitn(7, ',').collect();
            let [path, detail] = <[String; 2]>::try_from(quoted_fields(f[6])).unwrap();
            Row {
                pid: f[0].parse().unwrap(),
                kind: f[4].into(),
                size: f[5].parse().unwrap(),
                path,
                detail,
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

fn heap_is_exact(what: &str, lua: &Path, sizes: Sizes) {
    let Some(_guard) = bpf_test(what) else {
        return;
    };
    let dir = tempfile_dir(&what.replace(' ', "-"));
    let w = Workload::start(lua, &dir);
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
        str_size(sizes, LEN),
    );
    // The upvalue is named with its closure's definition (the chunk as the VM holds it).
    let pool = rows
        .iter()
        .map(|r| r.path.as_str())
        .find(|p| p.starts_with("_G.handler<upvalue pool of ") && p.ends_with("heap.lua:39>"))
        .unwrap_or_else(|| panic!("{what}: no _G.handler<upvalue pool of …heap.lua:39>"))
        .to_string();
    let pool = pool.as_str();
    assert_all(
        &format!("{what}: {pool}[*]"),
        &sizes_at(&rows, &format!("{pool}[*]"), "string"),
        100,
        str_size(sizes, 200),
    );
    // The closure (one upvalue) and its upvalue.
    let func = sizes_at(&rows, "_G.handler", "function");
    assert_eq!(func, [sizes.closure1], "{what}");
    let handler = rows.iter().find(|r| r.path == "_G.handler").unwrap();
    assert!(
        handler.detail.ends_with("heap.lua:39"),
        "{what}: the handler is defined at heap.lua:39, not {}",
        handler.detail
    );
    assert_eq!(sizes_at(&rows, pool, "upvalue"), [sizes.upvalue], "{what}");
    assert_eq!(sizes_at(&rows, pool, "table").len(), 1, "{what}: the pool");
    assert_all(
        &format!("{what}: _G.co<stack>[*]"),
        &sizes_at(&rows, "_G.co<stack>[*]", "string"),
        50,
        str_size(sizes, 100),
    );
    assert_eq!(sizes_at(&rows, "_G.co", "thread").len(), 1, "{what}");
    assert_all(
        &format!("{what}: _G.sessions[*].data"),
        &sizes_at(&rows, "_G.sessions[*].data", "string"),
        100,
        str_size(sizes, 300),
    );
    assert_eq!(
        sizes_at(&rows, "_G.sessions[*]", "table").len(),
        100,
        "{what}: sessions"
    );
    assert_eq!(
        sizes_at(&rows, "_G.co<stack>", "table").len(),
        1,
        "{what}: the table held"
    );

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
        str_size(sizes, LEN),
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
    stripped_keeps_the_report(what, &dir, &after);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--strip` keeps a heap capture's census and paths (the same report), not its memory:
/// none of the workload's strings is in the copy.
fn stripped_keeps_the_report(what: &str, dir: &Path, capture: &Path) {
    let stripped = dir.join("stripped.lrec");
    lanalyze(&[
        capture.as_os_str(),
        "--strip".as_ref(),
        "-o".as_ref(),
        stripped.as_os_str(),
    ]);
    let report = |c: &Path| lanalyze(&[c.as_os_str(), "--heap".as_ref()]);
    assert_eq!(
        report(capture),
        report(&stripped),
        "{what}: stripped report"
    );
    let bytes = std::fs::read(&stripped).unwrap();
    assert!(
        bytes.len() < 256 << 10,
        "{what}: {} bytes stripped",
        bytes.len()
    );
    // The capture is compressed: look in its records, as lanalyze reads them.
    let folded = lanalyze(&[stripped.as_os_str(), "--heap".as_ref(), "--folded".as_ref()]);
    assert!(
        !folded.contains("00000000001"),
        "{what}: a string's contents in the stripped capture"
    );
}

#[test]
fn upstream_gc64_heap() {
    heap_is_exact("heap gc64", &fixture_bin("luajit-gc64"), GC64);
}

#[test]
fn upstream_gc32_heap() {
    heap_is_exact("heap gc32", &fixture_bin("luajit-gc32"), GC32);
}

#[test]
fn upstream_nojit_heap() {
    heap_is_exact("heap nojit", &fixture_bin("luajit-nojit"), GC64);
}

#[test]
fn debian_luajit_heap() {
    if let Some(lj) = installed("/usr/bin/luajit", "Debian luajit heap") {
        heap_is_exact("heap debian luajit", &lj, GC64);
    }
}

#[test]
fn puc_heaps() {
    let lua51 = Sizes {
        closure1: 48,
        ..PUC
    };
    let lua53 = Sizes { upvalue: 32, ..PUC };
    for (minor, sizes) in [(1, lua51), (2, PUC), (3, lua53), (4, PUC)] {
        let path = format!("/usr/bin/lua5.{minor}");
        if let Some(lua) = installed(&path, "Debian PUC Lua heap") {
            heap_is_exact(&format!("heap lua5.{minor}"), &lua, sizes);
        }
    }
    heap_is_exact("heap lua 5.4.9", &fixture_bin("lua5.4-static"), PUC);
    // 5.5's long strings (all the workload's: over 40 bytes) keep a pointer to their
    // bytes before them (luaS_sizelngstr).
    let lua55 = Sizes {
        str_header: 32,
        ..PUC
    };
    heap_is_exact("heap lua 5.5.1", &fixture_bin("lua5.5"), lua55);
}

/// The forks (fixtures/forks/*.patch): their layouts are learned from the binary, and
/// lanalyze's heap walkers read them from the capture. The LuaJIT forks keep upstream's
/// strings; the PUC forks' strings are 8 bytes longer (skynet's `id`).
#[test]
fn fork_heaps() {
    heap_is_exact(
        "heap luajit fork gc64",
        &fixture_bin("luajit-fork-gc64"),
        GC64,
    );
    heap_is_exact(
        "heap luajit fork gc32 stripped",
        &fixture_bin("luajit-fork-gc32-stripped"),
        GC32,
    );
    heap_is_exact(
        "heap luajit fork gc64 stripped",
        &fixture_bin("luajit-fork-gc64-stripped"),
        GC64,
    );
    let fork54 = Sizes {
        str_header: 32,
        ..PUC
    };
    heap_is_exact("heap lua 5.4 fork", &fixture_bin("lua5.4-fork"), fork54);
    let fork55 = Sizes {
        str_header: 40,
        ..PUC
    };
    heap_is_exact("heap lua 5.5 fork", &fixture_bin("lua5.5-fork"), fork55);
    heap_is_exact(
        "heap lua 5.4 fork stripped",
        &fixture_bin("lua5.4-fork-stripped"),
        fork54,
    );
    heap_is_exact(
        "heap lua 5.5 fork stripped",
        &fixture_bin("lua5.5-fork-stripped"),
        fork55,
    );
}

/// Hosts running one VM per thread (fixtures/workloads/lua_host.c, stripped, linking PUC
/// Lua 5.4 or LuaJIT statically): each VM found, and each census whole.
#[test]
fn hosts_with_a_vm_per_thread() {
    let Some(_guard) = bpf_test("hosts_with_a_vm_per_thread") else {
        return;
    };
    for host in ["puc-host", "lua-host"] {
        let dir = tempfile_dir(&format!("heap-{host}"));
        let mut child = Command::new(fixture_bin(host))
            .args(["30", "2"])
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(500));
        let capture = snapshot(&dir, "host.lrec", child.id(), true);
        let found = found_percent(&capture);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(found.len(), 2, "{host}: two VMs, one per thread: {found:?}");
        // These heaps are small (25 KB, 45 KB): LuaJIT's JIT compiler buffers (IR,
        // snapshots, the trace array; ~1 KB here), which the census does not count, are
        // 2 % of one.
        let bound = if host == "lua-host" { 3.0 } else { 1.0 };
        for f in found {
            assert!(
                (f - 100.0).abs() <= bound,
                "{host}: census {f} % of the collector's"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `lrec --lua-heap -d` also records CPU samples, and SIGUSR1 takes another snapshot.
#[test]
fn heap_snapshots_on_sigusr1_with_samples() {
    let Some(_guard) = bpf_test("heap_snapshots_on_sigusr1_with_samples") else {
        return;
    };
    let dir = tempfile_dir("heap-usr1");
    let w = Workload::start(&fixture_bin("luajit-gc64"), &dir);
    w.wait_for("ready 1");
    let capture = dir.join("usr1.lrec");
    let lrec = Command::new(bin("lrec"))
        .args([
            "-p",
            &w.child.id().to_string(),
            "--lua-heap",
            "-d",
            "3",
            "-q",
            "-o",
        ])
        .arg(&capture)
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    run(Command::new("kill").args(["-USR1", &lrec.id().to_string()]));
    let out = lrec.wait_with_output().unwrap();
    assert!(out.status.success(), "lrec failed");
    let report = lanalyze(&[capture.as_os_str(), "--heap".as_ref()]);
    for n in [0, 1] {
        assert!(
            report.contains(&format!("(snapshot {n})")),
            "snapshot {n} missing:\n{report}"
        );
    }
    let info = lanalyze(&[capture.as_os_str(), "--info".as_ref()]);
    assert!(
        info.contains("samples"),
        "the CPU samples' summary:\n{info}"
    );
    let _ = std::fs::remove_dir_all(&dir);
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
            str_size(GC64, 100),
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
    let _ = std::fs::remove_dir_all(&dir);
}
