//! Harness of the end-to-end tests: runs the release `lrec` and `lanalyze` on the fixture
//! workloads and scores the stacks against the workloads' true call chains.
//!
//! The tests need root (BPF). Outside CI they skip, loudly, when not root; under
//! `CI=true` they fail instead.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};

use regex::Regex;

mod bounded;
mod lua;
mod nginx;
mod tshark;
pub use bounded::*;
pub use lua::*;
pub use nginx::*;
pub use tshark::*;

/// Recordings share two cores: run them one at a time so they do not skew each other.
static SERIAL: Mutex<()> = Mutex::new(());

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A binary of the build this test belongs to (lrec, lanalyze, `examples/sweep`): beside
/// the test's own executable (`…/release/deps/TEST`), wherever the build put it
/// (`target/release`, or `target/TRIPLE/release` for `make build`'s static one).
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .map_or_else(|| root().join("target/release"), Path::to_path_buf);
    let p = dir.join(name);
    assert!(p.exists(), "{} is missing: run `make build`", p.display());
    p
}

/// A fixture workload built by `make fixtures` (fixtures/build).
pub fn fixture(name: &str) -> PathBuf {
    made_fixture("fixtures/build", name)
}

fn made_fixture(dir: &str, name: &str) -> PathBuf {
    let p = root().join(dir).join(name);
    assert!(
        p.exists(),
        "{} is missing: run `make fixtures`",
        p.display()
    );
    p
}

/// A fixture runtime built by `make fixtures` (fixtures/bin).
pub fn fixture_bin(name: &str) -> PathBuf {
    made_fixture("fixtures/bin", name)
}

/// A program installed by `make setup` (e.g. Debian's `luajit`), or None after saying
/// so loudly; under CI its absence is a failure.
pub fn installed(path: &str, why: &str) -> Option<PathBuf> {
    if Path::new(path).exists() {
        return Some(PathBuf::from(path));
    }
    if in_ci() {
        panic!("{path} is missing ({why}): `make setup` installs it");
    }
    eprintln!("\n!!!!!!!!!! SKIPPED {why}: {path} is missing. Run `make setup`. !!!!!!!!!!\n");
    None
}

/// `lrec -p PID -F HZ -d SECS -q -o CAPTURE ARGS…`: records a running process.
pub fn record_pid(capture: &Path, pid: u32, hz: u32, secs: u32, args: &[&str]) -> Output {
    run(Command::new(bin("lrec"))
        .args(["-p", &pid.to_string(), "-F", &hz.to_string()])
        .args(["-d", &secs.to_string(), "-q", "-o"])
        .arg(capture)
        .args(args))
}

/// Under CI (`CI=true`) a test that cannot run fails instead of skipping.
fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Says loudly that test `name` cannot run here (`why`) and skips it; under CI this is a
/// failure instead.
pub fn cannot_run(name: &str, why: &str) {
    if in_ci() {
        panic!("{name}: {why}");
    }
    eprintln!("\n!!!!!!!!!! SKIPPED {name}: {why} !!!!!!!!!!\n");
}

/// Takes the recording lock, or returns None (after saying why, loudly) when this is not
/// root outside CI. Under CI a missing privilege is a failure, not a skip.
pub fn bpf_test(name: &str) -> Option<MutexGuard<'static, ()>> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        if in_ci() {
            panic!("{name}: end-to-end tests must run as root in CI");
        }
        eprintln!(
            "\n!!!!!!!!!! SKIPPED {name}: not root, so no BPF. Run `sudo make test`. !!!!!!!!!!\n"
        );
        return None;
    }
    Some(SERIAL.lock().unwrap_or_else(|e| e.into_inner()))
}

pub fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `lrec -F HZ -q -o CAPTURE -- COMMAND…`: records a command until it exits.
pub fn record_command(capture: &Path, hz: u32, command: &[&std::ffi::OsStr]) -> Output {
    run(Command::new(bin("lrec"))
        .args(["-F", &hz.to_string(), "-q", "-o"])
        .arg(capture)
        .arg("--")
        .args(command))
}

/// `lanalyze CAPTURE --folded ARGS…` as (frames root→leaf, count), thread name first.
pub fn folded(capture: &Path, args: &[&str]) -> (Vec<(Vec<String>, u64)>, String) {
    let out = run(Command::new(bin("lanalyze"))
        .arg(capture)
        .arg("--folded")
        .args(args));
    let text = String::from_utf8(out.stdout).unwrap();
    let stacks = parse_folded(&text);
    (stacks, String::from_utf8_lossy(&out.stderr).into_owned())
}

pub fn parse_folded(text: &str) -> Vec<(Vec<String>, u64)> {
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (stack, n) = l.rsplit_once(' ').expect("folded line has a count");
            (
                stack.split(';').map(str::to_string).collect(),
                n.parse().expect("folded count is a number"),
            )
        })
        .collect()
}

/// The true chains of a workload: for each of its functions that can be a leaf, a regex
/// the `;`-joined frames from the root function (main or a thread's function) to the
/// leaf must match.
pub struct Truth {
    pub roots: Vec<&'static str>,
    pub leaves: BTreeMap<&'static str, Regex>,
}

impl Truth {
    pub fn new(roots: &[&'static str], rules: &[(&'static str, &str)]) -> Truth {
        Truth {
            roots: roots.to_vec(),
            leaves: rules
                .iter()
                .map(|(leaf, re)| (*leaf, Regex::new(&format!("^(?:{re})$")).unwrap()))
                .collect(),
        }
    }
}

#[derive(Debug, Default)]
pub struct Score {
    /// Samples whose leaf is a workload function.
    pub judged: u64,
    pub exact: u64,
    /// Judged samples per leaf function.
    pub per_leaf: BTreeMap<String, u64>,
    /// Some wrong stacks, for the failure message.
    pub wrong: Vec<(String, u64)>,
}

impl Score {
    pub fn fraction(&self) -> f64 {
        self.exact as f64 / self.judged.max(1) as f64
    }
}

/// Scores folded stacks: a sample counts when its leaf is one of the workload's
/// functions, and is exact when the chain from the root function matches the truth.
pub fn score(stacks: &[(Vec<String>, u64)], truth: &Truth) -> Score {
    let mut s = Score::default();
    for (frames, n) in stacks {
        let leaf = frames.last().map(String::as_str).unwrap_or("");
        let Some(rule) = truth.leaves.get(leaf) else {
            continue;
        };
        s.judged += n;
        *s.per_leaf.entry(leaf.to_string()).or_default() += n;
        let from_root = frames
            .iter()
            .position(|f| truth.roots.contains(&f.as_str()))
            .map(|i| frames[i..].join(";"));
        match from_root {
            Some(chain) if rule.is_match(&chain) => s.exact += n,
            _ => s.wrong.push((frames.join(";"), *n)),
        }
    }
    s.wrong.sort_by_key(|w| std::cmp::Reverse(w.1));
    s.wrong.truncate(10);
    s
}

/// Asserts that at least 99 % of the samples with a workload leaf are exact, after
/// printing the score.
pub fn assert_exact(score: &Score, what: &str) {
    eprintln!(
        "{what}: {}/{} samples exact ({:.2} %), per leaf {:?}",
        score.exact,
        score.judged,
        100.0 * score.fraction(),
        score.per_leaf
    );
    assert!(score.judged > 0, "{what}: no sample had a workload leaf");
    assert!(
        score.fraction() >= 0.99,
        "{what}: only {:.2} % exact; wrong stacks: {:#?}",
        100.0 * score.fraction(),
        score.wrong
    );
}

/// fixtures/workloads/native.c's true chains.
pub fn native_truth() -> Truth {
    // Frames inside libc between qsort and the callback (qsort_r, msort_with_tmp, …)
    // are real frames; they must be libc frames, and there must be at least one.
    let libc = r"(?:;(?:[A-Za-z_][A-Za-z0-9_.]*|libc\.so\.6\+0x[0-9a-f]+))+";
    let chain = "main;run_chain;chain_a;chain_b;chain_c";
    let rec = "main;run_recursion(?:;recurse){1,120}";
    Truth::new(
        &["main", "worker_main"],
        &[
            ("chain_d", &format!("{chain};chain_d")),
            ("chain_c", chain),
            ("chain_b", "main;run_chain;chain_a;chain_b"),
            ("chain_a", "main;run_chain;chain_a"),
            ("run_chain", "main;run_chain"),
            (
                "compare_ints",
                &format!("main;run_sort;[A-Za-z_]*qsort[A-Za-z_]*{libc};compare_ints"),
            ),
            ("run_sort", "main;run_sort"),
            (
                "recurse_leaf",
                "main;run_recursion(?:;recurse){120};recurse_leaf",
            ),
            ("recurse", rec),
            ("run_recursion", "main;run_recursion"),
            ("tail_callee", "main;tail_callee"),
            ("tail_caller", "main;tail_caller"),
            ("worker_c", "worker_main;worker_a;worker_b;worker_c"),
            ("worker_b", "worker_main;worker_a;worker_b"),
            ("worker_a", "worker_main;worker_a"),
            ("worker_main", "worker_main"),
            ("main", "main"),
        ],
    )
}

/// fixtures/workloads/signals.c's true chains: a SIGPROF handler's frames sit on whatever
/// the signal interrupted (a prefix of the main chain, or the clock read in main's loop),
/// with the signal trampoline between them.
pub fn signals_truth() -> Truth {
    let chain = "main(?:;run_chain(?:;chain_a(?:;chain_b(?:;chain_c(?:;chain_d)?)?)?)?)?";
    let clock = r"(?:;(?:[A-Za-z_]*time[A-Za-z0-9_]*|(?:libc\.so\.6|\[vdso\])\+0x[0-9a-f]+))*";
    let handler = format!(r"{chain}{clock};(?:__restore_rt|libc\.so\.6\+0x[0-9a-f]+);on_signal");
    Truth::new(
        &["main"],
        &[
            ("signal_work", &format!("{handler};signal_work")),
            ("on_signal", &handler),
            ("chain_d", "main;run_chain;chain_a;chain_b;chain_c;chain_d"),
            ("chain_c", "main;run_chain;chain_a;chain_b;chain_c"),
            ("chain_b", "main;run_chain;chain_a;chain_b"),
            ("chain_a", "main;run_chain;chain_a"),
            ("run_chain", "main;run_chain"),
            ("main", "main"),
        ],
    )
}

/// What a capture holds, read with the format crate.
#[derive(Debug)]
pub struct Contents {
    pub samples: u64,
    pub lost: u64,
    /// When lrec started writing the capture, right after its own start (the header's
    /// clock), and the times of the first and last sample (`u64::MAX` and 0 without
    /// samples).
    pub start_ns: u64,
    pub first_ns: u64,
    pub last_ns: u64,
    /// Each sample's time after recording started (the header's clock), in record order.
    pub offsets_ns: Vec<u64>,
    /// The end record's reason.
    pub end: Option<String>,
    pub warnings: Vec<String>,
}

impl Contents {
    /// Seconds from the first sample to the last.
    pub fn secs(&self) -> f64 {
        (self.last_ns - self.first_ns) as f64 / 1e9
    }

    /// Seconds from lrec's start to its first sample, and to its last.
    pub fn from_start(&self) -> (f64, f64) {
        let s = |ns: u64| ns.saturating_sub(self.start_ns) as f64 / 1e9;
        (s(self.first_ns), s(self.last_ns))
    }
}

pub fn contents(path: &Path) -> Contents {
    let cap = lrec_format::Capture::open(path).expect("capture opens");
    let (records, warnings) = cap.read_all();
    let mut c = Contents {
        samples: 0,
        lost: 0,
        start_ns: 0,
        first_ns: u64::MAX,
        last_ns: 0,
        offsets_ns: Vec::new(),
        end: None,
        warnings: warnings.iter().map(|w| w.to_string()).collect(),
    };
    for r in records {
        match r {
            lrec_format::Record::Header(h) => c.start_ns = h.monotonic_start_ns,
            lrec_format::Record::Sample(s) => {
                c.offsets_ns.push(s.time_ns.saturating_sub(c.start_ns));
                c.samples += 1;
                c.first_ns = c.first_ns.min(s.time_ns);
                c.last_ns = c.last_ns.max(s.time_ns);
            }
            lrec_format::Record::Lost(l) => c.lost += l.count,
            lrec_format::Record::End(e) => c.end = Some(e.reason),
            _ => {}
        }
    }
    c
}

/// Lost samples and sample count of a capture, read with the format crate.
pub fn capture_totals(path: &Path) -> (u64, u64, Vec<String>) {
    let c = contents(path);
    (c.samples, c.lost, c.warnings)
}

/// `lanalyze ARGS…`: its standard output.
pub fn lanalyze(args: &[&std::ffi::OsStr]) -> Vec<u8> {
    run(Command::new(bin("lanalyze")).args(args)).stdout
}

/// A file's permission bits.
pub fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// A fresh directory under the system temp dir.
/// A TCP port on 127.0.0.1 nobody listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

pub fn tempfile_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lrec-e2e-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truth_accepts_callbacks_under_libc() {
        let t = native_truth();
        let s = "native;_start;__libc_start_main;libc.so.6+0x2724a;main;run_sort;qsort_r;libc.so.6+0x3f9c1;libc.so.6+0x3fbf4;compare_ints 80";
        let sc = score(&parse_folded(s), &t);
        assert_eq!(sc.exact, 80, "{:?}", t.leaves["compare_ints"]);
    }
}
