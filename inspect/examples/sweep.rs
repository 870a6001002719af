//! Runs what lrec runs when it meets a binary in a process, on every ELF file under the
//! directories given, one child process per file: its build-id read, its sections
//! embedded as in a capture (`elf::binary_record`, DWARF up to 32 MiB, compressed), and
//! [`lrec_inspect::lua::meet`] (the Lua VM, its layout learned, its proto free function)
//! within lrec's budget. Per file: the time, the child's peak RSS, and the outcome; then
//! the slowest and the largest, every budget that ran out, every failure:
//!
//! `cargo run --release -p lrec-inspect --example sweep -- [--sample N] [--list FILE] DIR…`
//!
//! `--sample N` meets every Nth file only (`make test` runs a bounded sample), `--list`
//! writes a line per file. A child that panics, is killed, or outlasts its limit (30 s,
//! 2 GiB of address space) is a failure; the exit status is 1 when there is one.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lrec_inspect::budget::Budget;
use lrec_inspect::elf::{self, DebugInfo};
use lrec_inspect::lua::meet::{meet, Met};

/// What one child may take before it counts as a failure.
const CHILD_SECS: u64 = 30;
const CHILD_BYTES: u64 = 2 << 30;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, path] = &args[..] {
        if flag == "--one" {
            one(Path::new(path));
            return;
        }
    }
    let mut sample = 1usize;
    let mut list: Option<PathBuf> = None;
    let mut dirs = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--sample" => sample = it.next().and_then(|n| n.parse().ok()).unwrap_or(1),
            "--list" => list = it.next().map(PathBuf::from),
            d => dirs.push(PathBuf::from(d)),
        }
    }
    let mut files = Vec::new();
    for d in &dirs {
        elf_files(d, &mut files, 0);
    }
    files.sort();
    files.dedup();
    let files: Vec<PathBuf> = files.into_iter().step_by(sample.max(1)).collect();
    std::process::exit(sweep(&files, list.as_deref()));
}

/// The ELF files under `path` (links not followed), to 16 levels.
fn elf_files(path: &Path, out: &mut Vec<PathBuf>, depth: u32) {
    // A path given is followed when it is a link; links found inside are not.
    let meta = match depth {
        0 => std::fs::metadata(path),
        _ => std::fs::symlink_metadata(path),
    };
    let Ok(meta) = meta else {
        return;
    };
    if meta.is_dir() && depth < 16 {
        let Ok(dir) = std::fs::read_dir(path) else {
            return;
        };
        for e in dir.flatten() {
            elf_files(&e.path(), out, depth + 1);
        }
    } else if meta.is_file() && meta.len() >= 64 {
        let mut head = [0u8; 4];
        let is_elf = std::fs::File::open(path)
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
            .is_ok()
            && head == *b"\x7fELF";
        if is_elf {
            out.push(path.to_path_buf());
        }
    }
}

/// One file's result, as the child printed it, with what its parent measured.
struct Row {
    path: PathBuf,
    secs: f64,
    peak_kib: u64,
    /// The child's line: `ok UNITS STOPPED|- LUA…`, or why it failed.
    line: String,
    failed: bool,
}

fn sweep(files: &[PathBuf], list: Option<&Path>) -> i32 {
    let exe = std::env::current_exe().expect("own path");
    let began = Instant::now();
    let mut rows: Vec<Row> = Vec::with_capacity(files.len());
    for (i, f) in files.iter().enumerate() {
        rows.push(child(&exe, f));
        if (i + 1) % 500 == 0 {
            eprintln!("sweep: {} of {} files", i + 1, files.len());
        }
    }
    let failed: Vec<&Row> = rows.iter().filter(|r| r.failed).collect();
    let stopped: Vec<&Row> = rows
        .iter()
        .filter(|r| r.line.contains(" stopped:"))
        .collect();
    let lua: Vec<&Row> = rows.iter().filter(|r| r.line.contains(" lua:")).collect();
    println!(
        "sweep: {} ELF files in {:.1} s: {} failed, {} budgets ran out (each said), {} hold \
         Lua",
        rows.len(),
        began.elapsed().as_secs_f64(),
        failed.len(),
        stopped.len(),
        lua.len()
    );
    let mut by_time: Vec<&Row> = rows.iter().collect();
    by_time.sort_by(|a, b| b.secs.total_cmp(&a.secs));
    println!("slowest:");
    for r in by_time.iter().take(5) {
        println!(
            "  {:7.3} s {:8} KiB  {}",
            r.secs,
            r.peak_kib,
            r.path.display()
        );
    }
    let mut by_rss: Vec<&Row> = rows.iter().collect();
    by_rss.sort_by_key(|r| std::cmp::Reverse(r.peak_kib));
    println!("largest:");
    for r in by_rss.iter().take(5) {
        println!(
            "  {:7.3} s {:8} KiB  {}",
            r.secs,
            r.peak_kib,
            r.path.display()
        );
    }
    for (what, rows) in [
        ("budget ran out", &stopped),
        ("FAILED", &failed),
        ("Lua", &lua),
    ] {
        if !rows.is_empty() {
            println!("{what}:");
        }
        for r in rows.iter() {
            println!("  {}: {}", r.path.display(), r.line);
        }
    }
    if let Some(path) = list {
        let mut out = std::fs::File::create(path).expect("create the list");
        for r in &rows {
            let _ = writeln!(
                out,
                "{:.4}\t{}\t{}\t{}",
                r.secs,
                r.peak_kib,
                r.path.display(),
                r.line
            );
        }
    }
    i32::from(!failed.is_empty())
}

/// Runs `exe --one FILE` under the child's limits; its line and peak RSS.
fn child(exe: &Path, file: &Path) -> Row {
    let began = Instant::now();
    let mut cmd = Command::new(exe);
    cmd.arg("--one")
        .arg(file)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    // SAFETY: setrlimit only, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: CHILD_BYTES,
                rlim_max: CHILD_BYTES,
            };
            libc::setrlimit(libc::RLIMIT_AS, &lim);
            Ok(())
        });
    }
    let row = |line: String, failed: bool, peak_kib: u64| Row {
        path: file.to_path_buf(),
        secs: began.elapsed().as_secs_f64(),
        peak_kib,
        line,
        failed,
    };
    let mut c = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return row(format!("not started: {e}"), true, 0),
    };
    let pid = c.id() as libc::pid_t;
    let stdout = c.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        line.trim_end().to_string()
    });
    // Waits for the child with its rusage, killing it past its time.
    let deadline = began + Duration::from_secs(CHILD_SECS);
    let mut killed = false;
    let (status, rusage) = loop {
        let mut status = 0;
        // SAFETY: wait4 on our own child, into locals.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
        if r == pid {
            break (status, ru);
        }
        if Instant::now() > deadline && !killed {
            // SAFETY: kills our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            killed = true;
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let line = reader.join().unwrap_or_default();
    let peak = rusage.ru_maxrss as u64;
    if killed {
        return row(format!("killed after {CHILD_SECS} s"), true, peak);
    }
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 && line.starts_with("ok");
    match ok {
        true => row(line, false, peak),
        false if libc::WIFSIGNALED(status) => row(
            format!("signal {} ({line})", libc::WTERMSIG(status)),
            true,
            peak,
        ),
        false => row(
            format!("status {} ({line})", libc::WEXITSTATUS(status)),
            true,
            peak,
        ),
    }
}

/// In the child: what lrec does with `path` when a process maps it, printed as one line.
fn one(path: &Path) {
    let file = std::fs::File::open(path).expect("open");
    // SAFETY: read-only mapping, as lrec maps a target's binary.
    let data = unsafe { memmap2::Mmap::map(&file) }.expect("map");
    let name = path.to_string_lossy();
    let t = Instant::now();
    let _ = elf::build_id(&data[..data.len().min(64 << 10)]);
    let binary = elf::binary_record(&name, &data, DebugInfo::IfSmall(32 << 20));
    let chunk = lrec_format::Chunk::encode(&[lrec_format::Record::Binary(binary)], 1);
    let embed = t.elapsed();
    drop(chunk);
    let met = meet(
        &name,
        &file,
        &data,
        Path::new("/usr/lib/debug"),
        Budget::for_binary(None),
    );
    println!(
        "ok embed {:.3} s, meet {:.3} s {} units{}{}",
        embed.as_secs_f64(),
        met.took.as_secs_f64(),
        met.units,
        met.stopped
            .map_or(String::new(), |s| format!(" stopped: {s}")),
        lua(&met)
    );
}

/// What `met` found of Lua, for the line.
fn lua(met: &Met) -> String {
    // A part's outcome: what it found, or why not.
    fn said<T, S: std::fmt::Display>(r: &Result<T, String>, what: impl Fn(&T) -> S) -> String {
        match r {
            Ok(t) => what(t).to_string(),
            Err(e) => format!("NOT ({e})"),
        }
    }
    if let Some(j) = &met.luajit {
        let learned = said(&j.learned, |l| l.summary());
        let free = said(&j.free, |f| f.found_by);
        return format!(" lua: LuaJIT; layout {learned}; free {free}");
    }
    if let Some(p) = &met.puc {
        let learned = said(&p.learned, |l| l.summary());
        let free = said(&p.free, |f| f.found_by);
        let exec = said(&p.execute, |e| e.2);
        let (minor, patch) = p.release;
        return format!(
            " lua: Lua 5.{minor}.{patch}; layout {learned}; luaV_execute {exec}; free {free}"
        );
    }
    met.luajit_api
        .as_ref()
        .map_or(String::new(), |w| format!(" lua: {w}"))
}
