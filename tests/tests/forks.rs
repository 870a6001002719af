//! Lua VMs that their hosts compiled with their own struct layouts, against ground truth
//! (fixtures/workloads/lua/chains.lua and kinds.lua), each attached with `lrec -p` after it
//! started. No table of known releases fits them: lrec must learn each build's offsets
//! from the binary (DWARF, the VM's machine code, the C API's code) and prove them live.
//!
//! - LuaJIT patched by fixtures/forks/luajit.patch (global_State, lua_State and GCproto
//!   fields moved), GC64 and GC32, with .symtab and DWARF and stripped, JIT on and off;
//! - Debian's LuaJIT 2.1.0-beta3 (`luajit`, unpacked by `make fixtures`: it conflicts with
//!   the installed luajit2), stripped, the VM linked in;
//! - TeX Live's LuaJIT fork (Debian's libtexluajit2: 2.1.0-beta3, GC32, a stripped shared
//!   library) under a luajit-like host of ours (fixtures/luajit/standalone.c);
//! - Debian's tarantool, whose LuaJIT fork is linked in;
//! - PUC Lua 5.4.9 and 5.5.1 patched by fixtures/forks/lua-VERSION.patch (TString gains
//!   skynet's `id`, lua_State and CallInfo a field each), with DWARF and stripped, also run
//!   as skynet runs Lua (`-H`: on a thread C calls, coroutine.resume the host's own C).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use lrec_e2e::*;

/// LuaJIT's `-joff` (luajit, the fork builds, texluajit-host) when the JIT is to be off.
fn joff(jit_off: bool) -> &'static [&'static str] {
    if jit_off {
        &["-joff"]
    } else {
        &[]
    }
}

/// The bound of every test here: at least 97 % of the samples in hot functions exact.
const EXACT: f64 = 0.97;

fn chains(what: &str, interpreter: PathBuf, flags: &[&str]) {
    lua_is_exact_at(
        what,
        &interpreter,
        flags,
        "chains.lua",
        &chains_truth(),
        &[],
        EXACT,
    );
}

fn kinds(what: &str, interpreter: PathBuf, flags: &[&str]) {
    lua_is_exact_at(
        what,
        &interpreter,
        flags,
        "kinds.lua",
        &kinds_truth(),
        &[],
        EXACT,
    );
}

/// chains.lua under fixture LuaJIT `$bin`, JIT on and off.
macro_rules! luajit_fork_tests {
    ($bin:literal, $jit_on:ident, $jit_off:ident) => {
        #[test]
        fn $jit_on() {
            chains(concat!($bin, " jit on"), fixture_bin($bin), joff(false));
        }

        #[test]
        fn $jit_off() {
            chains(concat!($bin, " joff"), fixture_bin($bin), joff(true));
        }
    };
}

luajit_fork_tests!(
    "luajit-fork-gc64",
    fork_luajit_gc64_jit_on,
    fork_luajit_gc64_jit_off
);
luajit_fork_tests!(
    "luajit-fork-gc32",
    fork_luajit_gc32_jit_on,
    fork_luajit_gc32_jit_off
);
luajit_fork_tests!(
    "luajit-fork-gc64-stripped",
    fork_luajit_gc64_stripped_jit_on,
    fork_luajit_gc64_stripped_jit_off
);
luajit_fork_tests!(
    "luajit-fork-gc32-stripped",
    fork_luajit_gc32_stripped_jit_on,
    fork_luajit_gc32_stripped_jit_off
);
luajit_fork_tests!(
    "luajit-beta3",
    debian_luajit_beta3_jit_on,
    debian_luajit_beta3_jit_off
);
// TeX Live's library leaves the JIT on (luajittex turns it off in its own main): the host
// runs it as it comes, and with -joff.
luajit_fork_tests!("texluajit-host", texluajit_jit_on, texluajit_jit_off);

/// Tarantool runs `tarantool SCRIPT ARGS…` as luajit does (`arg[1]` is the first ARG);
/// it has no -j option, so `-e jit.off()` turns the JIT off before the script.
fn tarantool(what: &str, jit_off: bool) {
    let Some(tarantool) = installed("/usr/bin/tarantool", "Debian tarantool") else {
        return;
    };
    let flags: &[&str] = if jit_off { &["-e", "jit.off()"] } else { &[] };
    chains(what, tarantool, flags);
}

#[test]
fn tarantool_jit_on() {
    tarantool("tarantool jit on", false);
}

#[test]
fn tarantool_jit_off() {
    tarantool("tarantool joff", true);
}

/// chains.lua run as `chains.lua` from its own directory, so that its chunk name,
/// "@chains.lua", is a short string: Lua 5.4 and 5.5 keep strings of up to 40 bytes apart
/// from longer ones (5.5 gives those a pointer to their text), and the other tests' chunk
/// names, absolute paths, are long. Then as lua_is_exact: attached after 1 s for EXACT_SECS
/// at EXACT_HZ.
fn chains_short_chunkname(what: &str, interpreter: PathBuf) {
    let Some(_guard) = bpf_test(what) else {
        return;
    };
    let dir = tempfile_dir(&what.replace(' ', "-"));
    let cap = dir.join("lua.lrec");
    let mut target = Command::new(&interpreter)
        .args(["chains.lua", "10"])
        .current_dir(lua_workload(""))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    record_pid(&cap, target.id(), EXACT_HZ, EXACT_SECS, &[]);
    target.kill().unwrap();
    target.wait().unwrap();

    assert_lua_exact(what, &cap, "chains.lua", &chains_truth(), EXACT);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// chains.lua (long and short chunk name) and kinds.lua under fixture PUC Lua `$bin`.
macro_rules! puc_fork_tests {
    ($bin:literal, $chains:ident, $short:ident, $kinds:ident) => {
        #[test]
        fn $chains() {
            chains(concat!($bin, " chains"), fixture_bin($bin), &[]);
        }

        #[test]
        fn $short() {
            chains_short_chunkname(concat!($bin, " chains short name"), fixture_bin($bin));
        }

        #[test]
        fn $kinds() {
            kinds(concat!($bin, " kinds"), fixture_bin($bin), &[]);
        }
    };
}

puc_fork_tests!(
    "lua5.4-fork",
    fork_lua54_chains,
    fork_lua54_chains_short_chunkname,
    fork_lua54_kinds
);
puc_fork_tests!(
    "lua5.4-fork-stripped",
    fork_lua54_stripped_chains,
    fork_lua54_stripped_chains_short_chunkname,
    fork_lua54_stripped_kinds
);
puc_fork_tests!(
    "lua5.5-fork",
    fork_lua55_chains,
    fork_lua55_chains_short_chunkname,
    fork_lua55_kinds
);
puc_fork_tests!(
    "lua5.5-fork-stripped",
    fork_lua55_stripped_chains,
    fork_lua55_stripped_chains_short_chunkname,
    fork_lua55_stripped_kinds
);

/// skynet's way of running Lua (fixtures/puc/standalone.c `-H`): the program runs on a
/// thread of its own that C calls while the main thread is idle, and coroutine.resume is
/// the host's own C closure calling lua_resume through a helper of its own. Each
/// coroutine's chain has its resumer's Lua frames below it, as the truths say.
macro_rules! host_resume_tests {
    ($bin:literal, $chains:ident, $kinds:ident) => {
        #[test]
        fn $chains() {
            chains(concat!($bin, " -H chains"), fixture_bin($bin), &["-H"]);
        }

        #[test]
        fn $kinds() {
            kinds(concat!($bin, " -H kinds"), fixture_bin($bin), &["-H"]);
        }
    };
}

host_resume_tests!(
    "lua5.5-fork",
    fork_lua55_host_resume_chains,
    fork_lua55_host_resume_kinds
);
host_resume_tests!(
    "lua5.5-fork-stripped",
    fork_lua55_stripped_host_resume_chains,
    fork_lua55_stripped_host_resume_kinds
);
host_resume_tests!(
    "lua5.4-fork-stripped",
    fork_lua54_stripped_host_resume_chains,
    fork_lua54_stripped_host_resume_kinds
);

/// A build whose layout lrec cannot prove: lua-host's twin on the LuaJIT fork, stripped
/// and exporting nothing (no code it keeps reads a prototype's chunk name, which the fork
/// moved), JIT on and off; and on the PUC Lua 5.4 fork, whose moved CallInfo no code reads
/// (its release's layout does not prove on the live VM). lrec says so in one line naming
/// the binary, `--info` too, no Lua frame is printed, and the native stacks stay whole:
/// ≥ 97 % of the samples reach the thread's first frame.
fn unprovable_layout(what: &str, host: &str, env: &[(&str, &str)]) {
    let Some(_guard) = bpf_test(what) else {
        return;
    };
    let dir = tempfile_dir(&what.replace(' ', "-"));
    let cap = dir.join("host.lrec");
    let host = fixture_bin(host);
    let mut target = Command::new(&host)
        .args(["10", "2"])
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let out = Command::new(bin("lrec"))
        .args(["-p", &target.id().to_string(), "-d", "5", "-F", "499", "-o"])
        .arg(&cap)
        .output()
        .unwrap();
    target.kill().unwrap();
    target.wait().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("recording native stacks only"))
        .collect();
    assert_eq!(said.len(), 1, "{what}: lrec said: {stderr}");
    let name = host.file_name().unwrap().to_string_lossy();
    assert!(said[0].contains(&*name), "{what}: {}", said[0]);
    let info = String::from_utf8_lossy(&lanalyze(&[
        "--info".as_ref(),
        "--offline".as_ref(),
        cap.as_os_str(),
    ]))
    .into_owned();
    assert!(
        info.contains("native stacks only"),
        "{what}: --info said: {info}"
    );

    let (stacks, _) = folded(&cap, &["--offline"]);
    let total: u64 = stacks.iter().map(|(_, n)| n).sum();
    let lua: u64 = stacks
        .iter()
        .filter(|(f, _)| f.iter().any(|f| f.contains(".lua")))
        .map(|(_, n)| n)
        .sum();
    // Complete: the thread's first frame is its root, and nothing is cut or unknown.
    let whole: u64 = stacks
        .iter()
        .filter(|(f, _)| {
            f.get(1)
                .is_some_and(|r| r.contains("clone3") || r.contains("_start"))
                && !f
                    .iter()
                    .any(|f| f.contains("[truncated]") || f.contains("[unknown]"))
        })
        .map(|(_, n)| n)
        .sum();
    eprintln!("{what}: {whole}/{total} samples whole, {lua} with Lua frames");
    assert!(total >= 500, "{what}: only {total} samples");
    assert_eq!(lua, 0, "{what}: Lua frames printed without a proved layout");
    assert!(
        whole as f64 >= 0.97 * total as f64,
        "{what}: only {whole} of {total} native stacks whole"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn unprovable_luajit_layout_jit_on() {
    unprovable_layout("unprovable luajit jit on", "lua-host-fork", &[]);
}

#[test]
fn unprovable_luajit_layout_jit_off() {
    unprovable_layout(
        "unprovable luajit jit off",
        "lua-host-fork",
        &[("LUA_HOST_JOFF", "1")],
    );
}

#[test]
fn unprovable_puc_layout() {
    unprovable_layout("unprovable puc", "puc-host-fork", &[]);
}
