//! `lanalyze --pprof` read by `go tool pprof`: over the committed captures, analysed with
//! `--offline`, `go tool pprof -top` lists the functions of `lanalyze --top` with the same
//! self (flat) and total (cum) sample counts, and `-lines` shows each Lua function at its
//! chunk and current line with the self counts of `lanalyze --top --lines`.
//!
//! Needs `go` (Debian: `apt-get install golang-go`; `go tool pprof` is prebuilt there and
//! works offline). Without it the test fails when CI=true and otherwise skips, loudly.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Self and total samples by function name.
type Counts = BTreeMap<String, (u64, u64)>;

fn capture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/captures")
        .join(name)
}

fn checked(output: Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{what} failed: {}\n{stderr}\n{stdout}",
        output.status
    );
    stdout
}

fn lanalyze(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_lanalyze"))
        .args(args)
        .output()
        .expect("run lanalyze");
    checked(out, &format!("lanalyze {args:?}"))
}

/// Whether `go` runs. When it does not: a failure with CI=true, a loud skip otherwise.
fn go_installed() -> bool {
    let ok = Command::new("go")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "go is not installed and CI=true: apt-get install golang-go (make setup installs it)"
        );
        // Straight to stderr: the test harness captures eprintln! of passing tests.
        let _ = writeln!(
            std::io::stderr(),
            "\n!!!!!!!!!! SKIPPED: go not installed (apt-get install golang-go) !!!!!!!!!!\n"
        );
    }
    ok
}

/// Runs `go tool pprof ARGS FILE` in `dir` with an environment that works as root in CI:
/// a cache and home of its own if none is set, and no toolchain download.
fn go_pprof(dir: &Path, args: &[&str], file: &Path) -> String {
    let mut cmd = Command::new("go");
    cmd.current_dir(dir)
        .args(["tool", "pprof"])
        .args(args)
        .arg(file)
        .env("GOTOOLCHAIN", "local");
    for var in ["GOCACHE", "HOME"] {
        if std::env::var_os(var).is_none() {
            cmd.env(var, dir);
        }
    }
    let out = cmd.output().expect("run go tool pprof");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = checked(out, &format!("go tool pprof {args:?}"));
    // Every name is in the profile: pprof must not look for binaries to symbolize.
    assert!(!stderr.contains("symboliz"), "{stderr}");
    stdout
}

/// The first `n` whitespace-separated columns of a line and the rest (a name, which may
/// hold spaces).
fn columns(line: &str, n: usize) -> Option<(Vec<&str>, &str)> {
    let mut rest = line.trim_start();
    let mut cols = Vec::with_capacity(n);
    for _ in 0..n {
        let end = rest.find(char::is_whitespace)?;
        cols.push(&rest[..end]);
        rest = rest[end..].trim_start();
    }
    Some((cols, rest))
}

/// `lanalyze --top` rows: `SELF SELF% TOTAL TOTAL%  FUNCTION`.
fn parse_lanalyze_top(text: &str) -> Counts {
    text.lines()
        .skip(1)
        .filter(|l| !l.starts_with('('))
        .map(|l| {
            let (c, name) = columns(l, 4).unwrap_or_else(|| panic!("bad row {l:?}"));
            (
                name.to_owned(),
                (c[0].parse().unwrap(), c[2].parse().unwrap()),
            )
        })
        .collect()
}

/// `go tool pprof -top` rows after the `flat flat% sum% cum cum%` heading.
fn parse_pprof_top(text: &str) -> Counts {
    let mut rows = Counts::new();
    let body = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("flat "))
        .skip(1);
    for l in body {
        let (c, name) = columns(l, 5).unwrap_or_else(|| panic!("bad row {l:?}"));
        let counts = (c[0].parse().unwrap(), c[3].parse().unwrap());
        assert!(
            rows.insert(name.to_owned(), counts).is_none(),
            "{name} listed twice"
        );
    }
    assert!(!rows.is_empty(), "no rows in\n{text}");
    rows
}

/// Writes the pprof of a committed capture and checks `go tool pprof -top` against
/// `lanalyze --top`; the pprof's path and `-top` output.
fn check_top(name: &str, dir: &Path) -> (PathBuf, String) {
    let path = capture(name);
    let path = path.to_str().unwrap();
    let pprof = dir.join(format!("{name}.pb.gz"));
    lanalyze(&[path, "--offline", "--pprof", "-o", pprof.to_str().unwrap()]);
    eprintln!(
        "{name}: {} bytes of pprof",
        std::fs::metadata(&pprof).unwrap().len()
    );
    let expected = parse_lanalyze_top(&lanalyze(&[path, "--offline", "--top", "100000"]));
    let top_args = [
        "-top",
        "-nodecount=100000",
        "-nodefraction=0",
        "-edgefraction=0",
        "-sample_index=samples",
    ];
    let text = go_pprof(dir, &top_args, &pprof);
    let listed = parse_pprof_top(&text);
    for (function, &(self_n, total)) in &expected {
        match listed.get(function) {
            Some(&counts) => assert_eq!(counts, (self_n, total), "{function}:\n{text}"),
            // pprof may leave out functions it has nothing to show for.
            None => assert_eq!(self_n, 0, "{function} missing from\n{text}"),
        }
    }
    for (function, &(flat, _)) in &listed {
        assert!(
            expected.contains_key(function) || flat == 0,
            "{function} is not in lanalyze --top:\n{text}"
        );
    }
    assert!(expected.values().any(|c| c.0 > 0));
    (pprof, text)
}

#[test]
fn go_pprof_top_lists_the_functions_and_self_counts_of_lanalyze_top() {
    if !go_installed() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_, native) = check_top("native-small.lrec", dir.path());
    assert!(native.contains("worker_c"), "{native}");
    let (pprof, lua) = check_top("luajit-small.lrec", dir.path());
    assert!(lua.contains("fixtures/workloads/lua/chains.lua"), "{lua}");

    // -lines: a Lua function `F` running line L is `F CHUNK:L` (`F CHUNK` when the line
    // is unknown), where lanalyze --lines names it `F@L`.
    let args = [
        "-lines",
        "-top",
        "-nodecount=100000",
        "-nodefraction=0",
        "-edgefraction=0",
        "-sample_index=samples",
    ];
    let text = go_pprof(dir.path(), &args, &pprof);
    let listed = parse_pprof_top(&text);
    let capture = capture("luajit-small.lrec");
    let by_line = parse_lanalyze_top(&lanalyze(&[
        capture.to_str().unwrap(),
        "--offline",
        "--lines",
        "--top",
        "100000",
    ]));
    let mut lua_rows = 0;
    for (name, &(self_n, _)) in &by_line {
        // Lua names end in `CHUNK:FIRST@LINE` (native ones may hold `@` too: `f@@GLIBC`).
        let number = |s: &str| s.parse::<u32>().is_ok();
        let Some((function, line)) = name.rsplit_once('@').filter(|(_, l)| number(l)) else {
            continue;
        };
        let Some((chunk, _)) = function
            .rsplit(' ')
            .next()
            .and_then(|s| s.rsplit_once(':'))
            .filter(|(_, first)| number(first))
        else {
            continue;
        };
        let row = match line {
            "0" => format!("{function} {chunk}"),
            _ => format!("{function} {chunk}:{line}"),
        };
        let flat = listed.get(&row).map_or(0, |c| c.0);
        assert_eq!(flat, self_n, "{row} (lanalyze: {name}):\n{text}");
        lua_rows += 1;
    }
    assert!(lua_rows > 0, "no Lua lines in lanalyze --lines");
    let hot = "hot fixtures/workloads/lua/chains.lua:12 fixtures/workloads/lua/chains.lua:14";
    assert!(
        listed.get(hot).is_some_and(|c| c.0 > 0),
        "{hot} missing:\n{text}"
    );
}
