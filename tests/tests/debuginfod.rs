//! Names for stripped binaries through a real debuginfod server (Debian's `debuginfod`,
//! on 127.0.0.1, serving a directory of debug files): a stripped copy of the native
//! workload is named only through it, the download is cached and used afterwards with the
//! server gone, `--embed-symbols` carries the names to `--offline`, and servers that do
//! not answer cost one time-out and a one-line warning.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use lrec_e2e::*;

/// A `debuginfod -F DIR` on a free loopback port, killed when dropped.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    /// Starts serving `dir` and waits until it serves `build_id`'s debuginfo.
    fn start(dir: &Path, db: &Path, build_id: &str) -> Server {
        let port = free_port();
        let child = Command::new("debuginfod")
            .args(["-F", "-p", &port.to_string(), "-d"])
            .arg(db)
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting debuginfod");
        let server = Server {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        while status(port, &format!("/buildid/{build_id}/debuginfo")) != Some(200) {
            assert!(
                Instant::now() < deadline,
                "debuginfod did not serve {build_id} within 120 s"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        server
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The HTTP status of `GET path` on loopback `port`, None if it does not answer.
fn status(port: u16, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

fn build_id(path: &Path) -> Vec<u8> {
    let data = std::fs::read(path).unwrap();
    lrec_inspect::elf::build_id(&data).expect("the fixture has a build-id")
}

/// `lanalyze ARGS…` with `DEBUGINFOD_URLS=urls` and its cache in `cache`.
fn lanalyze_with(urls: &str, cache: &Path, timeout_s: u32, args: &[&std::ffi::OsStr]) -> Output {
    run(Command::new(bin("lanalyze"))
        .args(args)
        .env("DEBUGINFOD_URLS", urls)
        .env("DEBUGINFOD_CACHE_PATH", cache)
        .env("DEBUGINFOD_TIMEOUT", timeout_s.to_string()))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Copies capture `from` to `to` with the sections of the binary whose path ends in `/name`
/// dropped, as when lrec cannot read a binary.
fn without_sections(from: &Path, to: &Path, name: &str) {
    use lrec_format::{Capture, CaptureWriter, Record};
    let capture = Capture::open(from).unwrap();
    let (records, _) = capture.read_all();
    let Some(Record::Header(header)) = records.first() else {
        panic!("no header first in {}", from.display())
    };
    let mut w = CaptureWriter::new(std::fs::File::create(to).unwrap(), header).unwrap();
    for r in &records[1..] {
        match r {
            Record::Binary(b) if b.path.ends_with(&format!("/{name}")) => {
                let cut = lrec_format::Binary {
                    sections: Vec::new(),
                    error: Some("simulated: cannot read it".into()),
                    ..b.clone()
                };
                w.push(&Record::Binary(cut)).unwrap();
            }
            r => w.push(r).unwrap(),
        }
    }
    w.finish().unwrap();
}

/// A stripped copy of the native workload and, in `serve/`, its debug file.
fn stripped_native(dir: &Path) -> (PathBuf, PathBuf) {
    let exe = dir.join("native-stripped");
    let serve = dir.join("serve");
    std::fs::create_dir_all(&serve).unwrap();
    run(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(fixture("native"))
        .arg(serve.join("native.debug")));
    run(Command::new("strip")
        .arg("--strip-all")
        .arg("-o")
        .arg(&exe)
        .arg(fixture("native")));
    (exe, serve)
}

#[test]
fn stripped_binary_is_named_through_debuginfod_then_from_its_cache() {
    let Some(_guard) = bpf_test("stripped_binary_is_named_through_debuginfod") else {
        return;
    };
    if installed("/usr/bin/debuginfod", "the debuginfod tests").is_none() {
        return;
    }
    let dir = tempfile_dir("debuginfod");
    let (exe, serve) = stripped_native(&dir);
    // The executable too, for a capture that lacks its sections (below).
    std::fs::copy(&exe, serve.join("native-stripped")).unwrap();
    let id = lrec_inspect::debug_files::build_id_hex(&build_id(&exe));
    let server = Server::start(&serve, &dir.join("db.sqlite"), &id);
    let cap = dir.join("stripped.lrec");
    record_command(&cap, 499, &[exe.as_ref(), "4".as_ref()]);
    let cache = dir.join("cache");
    let folded_args = [cap.as_os_str(), "--folded".as_ref()];

    // Without debuginfod nothing names the workload's functions.
    let (before, _) = folded(&cap, &[]);
    let unnamed = score(&before, &native_truth());
    eprintln!(
        "stripped, no debuginfod: {} samples with a workload leaf",
        unnamed.judged
    );
    assert_eq!(
        unnamed.judged, 0,
        "names without debuginfod: {:?}",
        unnamed.per_leaf
    );
    // Nor with --offline, even with the server set: nothing is fetched.
    let offline = lanalyze_with(
        &server.url,
        &cache,
        10,
        &[&folded_args[..], &["--offline".as_ref()]].concat(),
    );
    assert!(
        !text(&offline.stderr).contains("debuginfod"),
        "{}",
        text(&offline.stderr)
    );
    assert!(!cache.exists(), "--offline fetched into the cache");

    // Through the server: exact, with a progress line, cached.
    let fetched = lanalyze_with(&server.url, &cache, 10, &folded_args);
    let stderr = text(&fetched.stderr);
    assert!(stderr.contains("fetching its debuginfo from"), "{stderr}");
    assert_exact(
        &score(&parse_folded(&text(&fetched.stdout)), &native_truth()),
        "stripped, names through debuginfod",
    );
    let cached_file = cache.join(&id).join("debuginfo");
    assert!(
        cached_file.exists(),
        "not cached at {}",
        cached_file.display()
    );
    let info = lanalyze_with(
        &server.url,
        &cache,
        10,
        &[cap.as_os_str(), "--info".as_ref()],
    );
    let info = text(&info.stdout);
    eprintln!("{info}");
    assert!(
        info.contains("names: DWARF, debuginfod, cached at"),
        "{info}"
    );
    assert!(
        info.contains(" 0 of its ") || info.contains("(0.0%) in functions without a name"),
        "{info}"
    );

    // A capture without the binary's sections (lrec could not read it), the file gone:
    // its unwind and symbol sections come from the server's /executable.
    let cut = dir.join("cut.lrec");
    without_sections(&cap, &cut, "native-stripped");
    let moved = dir.join("native-stripped.moved");
    std::fs::rename(&exe, &moved).unwrap();
    let from_exe = lanalyze_with(
        &server.url,
        &dir.join("cache2"),
        10,
        &[cut.as_os_str(), "--folded".as_ref()],
    );
    std::fs::rename(&moved, &exe).unwrap();
    let stderr = text(&from_exe.stderr);
    assert!(stderr.contains("fetching its executable from"), "{stderr}");
    assert_exact(
        &score(&parse_folded(&text(&from_exe.stdout)), &native_truth()),
        "binary's sections and names from debuginfod",
    );

    // The server gone: the cache answers, the same stacks.
    drop(server);
    let again = lanalyze_with("http://127.0.0.1:9", &cache, 2, &folded_args);
    assert_eq!(text(&again.stdout), text(&fetched.stdout));

    // --embed-symbols: a capture that names everything with --offline, elsewhere.
    let full = dir.join("full.lrec");
    let embedded = lanalyze_with(
        "http://127.0.0.1:9",
        &cache,
        2,
        &[
            cap.as_os_str(),
            "--embed-symbols".as_ref(),
            "-o".as_ref(),
            full.as_os_str(),
        ],
    );
    eprintln!("{}", text(&embedded.stderr));
    let (offline_full, _) = folded(&full, &["--offline"]);
    assert_exact(
        &score(&offline_full, &native_truth()),
        "--embed-symbols, --offline",
    );
    eprintln!(
        "capture {} bytes, with symbols {} bytes",
        std::fs::metadata(&cap).unwrap().len(),
        std::fs::metadata(&full).unwrap().len()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A closed port and a server that accepts but never answers: lanalyze ends within its
/// time-out (one per server, not per binary) with one warning line per server, and the
/// offsets.
#[test]
fn servers_that_do_not_answer_cost_one_time_out_each() {
    let Some(_guard) = bpf_test("servers_that_do_not_answer") else {
        return;
    };
    let dir = tempfile_dir("debuginfod-dead");
    let (exe, _) = stripped_native(&dir);
    let cap = dir.join("stripped.lrec");
    record_command(&cap, 199, &[exe.as_ref(), "2".as_ref()]);
    let closed = free_port();
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let held: Vec<_> = silent.incoming().collect();
        drop(held);
    });
    let urls = format!("http://127.0.0.1:{closed} http://127.0.0.1:{silent_port}");
    let started = Instant::now();
    let out = lanalyze_with(
        &urls,
        &dir.join("cache"),
        3,
        &[cap.as_os_str(), "--folded".as_ref()],
    );
    let took = started.elapsed();
    let stderr = text(&out.stderr);
    eprintln!("{stderr}took {took:?}");
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("did not answer"))
        .collect();
    assert_eq!(warnings.len(), 2, "one warning per server: {stderr}");
    assert!(
        text(&out.stdout).contains("native-stripped+0x"),
        "offsets kept"
    );
    // The silent server costs its 3 s time-out once; a loaded machine gets a wide margin,
    // but far less than a time-out per binary (and the process never hangs).
    assert!(took < Duration::from_secs(20), "took {took:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A real stripped Debian binary, /usr/bin/lua5.4, and libc: their debug files (from
/// liblua5.4-0-dbg and libc6-dbg) served by debuginfod instead of read from
/// /usr/lib/debug (`--debug-dir` elsewhere, for lrec and lanalyze alike).
#[test]
fn debian_lua_and_libc_are_named_through_debuginfod() {
    let Some(_guard) = bpf_test("debian_lua_and_libc_are_named_through_debuginfod") else {
        return;
    };
    let (Some(_), Some(lua)) = (
        installed("/usr/bin/debuginfod", "the debuginfod tests"),
        installed("/usr/bin/lua5.4", "Debian's Lua 5.4"),
    ) else {
        return;
    };
    let dir = tempfile_dir("debuginfod-lua");
    let serve = dir.join("serve");
    std::fs::create_dir_all(&serve).unwrap();
    let mut ids = Vec::new();
    for (binary, name) in [
        (lua.clone(), "lua5.4"),
        (
            PathBuf::from("/usr/lib/x86_64-linux-gnu/libc.so.6"),
            "libc.so.6",
        ),
    ] {
        let id = build_id(&binary);
        let debug = lrec_inspect::debug_files::build_id_path(Path::new("/usr/lib/debug"), &id)
            .expect("a build-id of 2 bytes or more");
        let id = lrec_inspect::debug_files::build_id_hex(&id);
        if installed(debug.to_str().unwrap(), "the -dbg packages").is_none() {
            return;
        }
        std::fs::copy(&debug, serve.join(format!("{name}.debug"))).unwrap();
        ids.push((name, id));
    }
    let server = Server::start(&serve, &dir.join("db.sqlite"), &ids[0].1);
    let cap = dir.join("lua.lrec");
    let nowhere = dir.join("no-debug-files");
    run(Command::new(bin("lrec"))
        .args(["-F", "499", "-q", "--debug-dir"])
        .arg(&nowhere)
        .arg("-o")
        .arg(&cap)
        .arg("--")
        .arg(&lua)
        .arg(root().join("fixtures/workloads/lua/chains.lua"))
        .arg("3"));
    let info = |urls: &str| {
        let out = lanalyze_with(
            urls,
            &dir.join("cache"),
            10,
            &[
                cap.as_os_str(),
                "--info".as_ref(),
                "--debug-dir".as_ref(),
                nowhere.as_os_str(),
            ],
        );
        text(&out.stdout)
    };
    let before = info("");
    let after = info(&server.url);
    for (name, _) in &ids {
        let (b, a) = (unnamed_share(&before, name), unnamed_share(&after, name));
        eprintln!("{name}: samples in functions without a name: {b:.1} % before, {a:.1} % after");
        assert!(b > 50.0, "{name} named without debuginfod:\n{before}");
        assert!(a < 1.0, "{name} unnamed through debuginfod:\n{after}");
    }
    assert!(after.contains("debuginfod http://127.0.0.1"), "{after}");
    drop(server);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// From `lanalyze --info`: the share of the samples in binary `name` that fell in
/// functions without a name.
fn unnamed_share(info: &str, name: &str) -> f64 {
    let mut lines = info
        .lines()
        .skip_while(|l| !l.trim_end().ends_with(&format!("/{name}")));
    let line = lines
        .find(|l| l.contains("in functions without a name"))
        .unwrap_or_else(|| panic!("no coverage line for {name}:\n{info}"));
    let (n, rest) = line.trim().split_once(" of its ").unwrap();
    let total: f64 = rest.split_whitespace().next().unwrap().parse().unwrap();
    100.0 * n.parse::<f64>().unwrap() / total
}
