//! PUC Lua stacks against ground truth (fixtures/workloads/lua/chains.lua and kinds.lua):
//! Debian's `lua5.1` … `lua5.4` (the core linked into the interpreter, stripped, with and
//! without the `-dbg` packages' symbols), the Lua 5.5 interpreter and a stripped Lua 5.4
//! interpreter built by `make fixtures`, each attached with `lrec -p` after it started; a
//! stripped host with one VM per thread; and a VM that never calls the C API after attach.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use lrec_e2e::*;

/// Where lrec looks for no separate debug files: as if no `-dbg` package were installed.
const NO_DEBUG: &[&str] = &["--debug-dir", "/nonexistent"];

/// kinds.lua's chains, but for the one 5.1 cannot run (a yield inside pcall).
fn kinds_truth_51() -> Vec<Vec<u32>> {
    kinds_truth()
        .into_iter()
        .filter(|t| t.last() != Some(&18))
        .collect()
}

fn debian(version: &str) -> Option<PathBuf> {
    installed(
        &format!("/usr/bin/lua{version}"),
        &format!("Debian lua{version}"),
    )
}

fn chains(what: &str, lua: PathBuf, lrec_args: &[&str]) {
    lua_is_exact(what, &lua, &[], "chains.lua", &chains_truth(), lrec_args);
}

fn kinds(what: &str, lua: PathBuf, truths: &[Vec<u32>], lrec_args: &[&str]) {
    lua_is_exact(what, &lua, &[], "kinds.lua", truths, lrec_args);
}

/// chains.lua and kinds.lua under Debian's `lua5.X`, with the `-dbg` package's symbols
/// and without (`--debug-dir` elsewhere: luaV_execute is then the largest function).
macro_rules! debian_tests {
    ($version:literal, $kinds:expr, $chains:ident, $kinds_test:ident, $chains_nodbg:ident, $kinds_nodbg:ident) => {
        #[test]
        fn $chains() {
            if let Some(lua) = debian($version) {
                chains(concat!("lua", $version, " chains"), lua, &[]);
            }
        }

        #[test]
        fn $kinds_test() {
            if let Some(lua) = debian($version) {
                kinds(concat!("lua", $version, " kinds"), lua, &$kinds, &[]);
            }
        }

        #[test]
        fn $chains_nodbg() {
            if let Some(lua) = debian($version) {
                chains(concat!("lua", $version, " chains no dbg"), lua, NO_DEBUG);
            }
        }

        #[test]
        fn $kinds_nodbg() {
            if let Some(lua) = debian($version) {
                kinds(
                    concat!("lua", $version, " kinds no dbg"),
                    lua,
                    &$kinds,
                    NO_DEBUG,
                );
            }
        }
    };
}

debian_tests!(
    "5.1",
    kinds_truth_51(),
    lua51_chains,
    lua51_kinds,
    lua51_chains_no_dbg,
    lua51_kinds_no_dbg
);
// Debian has no -dbg package for 5.2: its tests run without symbols only.
#[test]
fn lua52_chains() {
    if let Some(lua) = debian("5.2") {
        chains("lua5.2 chains", lua, &[]);
    }
}

#[test]
fn lua52_kinds() {
    if let Some(lua) = debian("5.2") {
        kinds("lua5.2 kinds", lua, &kinds_truth(), &[]);
    }
}
debian_tests!(
    "5.3",
    kinds_truth(),
    lua53_chains,
    lua53_kinds,
    lua53_chains_no_dbg,
    lua53_kinds_no_dbg
);
debian_tests!(
    "5.4",
    kinds_truth(),
    lua54_chains,
    lua54_kinds,
    lua54_chains_no_dbg,
    lua54_kinds_no_dbg
);

#[test]
fn lua55_chains() {
    chains("lua5.5 chains", fixture_bin("lua5.5"), &[]);
}

#[test]
fn lua55_kinds() {
    kinds("lua5.5 kinds", fixture_bin("lua5.5"), &kinds_truth(), &[]);
}

#[test]
fn stripped_static_lua54_kinds() {
    kinds(
        "stripped lua5.4 kinds",
        fixture_bin("lua5.4-static"),
        &kinds_truth(),
        &[],
    );
}

#[test]
fn deep_frames_of_lua54_are_named_from_call_sites() {
    // Stripped: luaF_freeproto is found by its code, and its frees counted.
    let counted = "by no proto freed since (a uprobe on luaF_freeproto at 0x";
    let bin = fixture_bin("lua5.4-static");
    deep_frames_are_named_from_sites("lua5.4 deep", &bin, &[], counted, true);
}

#[test]
fn several_vms_in_a_stripped_static_puc_host() {
    several_vms_are_told_apart("puc-host", fixture_bin("puc-host"));
}

/// A VM that runs one Lua loop from before lrec attaches, never calling into C again: its
/// state is found all the same (≥ 95 % of the samples end in the loop's Lua function).
#[test]
fn a_vm_that_never_calls_c_after_attach() {
    let Some(_guard) = bpf_test("a_vm_that_never_calls_c_after_attach") else {
        return;
    };
    let Some(lua) = debian("5.4") else {
        return;
    };
    let dir = tempfile_dir("puc-loop");
    let cap = dir.join("loop.lrec");
    let mut target = Command::new(lua)
        .args([
            "-e",
            "local function spin() local x = 0 while true do x = x + 1 end end spin()",
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    record_pid(&cap, target.id(), 499, 4, &[]);
    target.kill().unwrap();
    target.wait().unwrap();

    let (stacks, _) = folded(&cap, &["--offline"]);
    let total: u64 = stacks.iter().map(|(_, n)| n).sum();
    let lua: u64 = stacks
        .iter()
        .filter(|(f, _)| f.last().is_some_and(|f| f.ends_with("(command line):1")))
        .map(|(_, n)| n)
        .sum();
    eprintln!("loop: {lua}/{total} samples with the Lua frame");
    assert!(total >= 1000, "only {total} samples");
    assert!(
        lua as f64 >= 0.95 * total as f64,
        "{lua}/{total}: {stacks:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A PUC Lua patch release lrec has no table for (the Lua 5.5 fixture, its version string
/// changed to 5.5.8): its layout is learned from the binary and proved, as any build's.
#[test]
fn a_release_without_a_table_is_learned() {
    let Some(_guard) = bpf_test("a_release_without_a_table") else {
        return;
    };
    let dir = tempfile_dir("puc-unknown");
    let lua = dir.join("lua5.5.8");
    let mut bytes = std::fs::read(fixture_bin("lua5.5")).unwrap();
    let ident = b"$LuaVersion: Lua 5.5.1";
    let at = bytes
        .windows(ident.len())
        .position(|w| w == ident)
        .expect("lua_ident in the fixture");
    bytes[at + ident.len() - 1] = b'8';
    std::fs::write(&lua, bytes).unwrap();
    std::fs::set_permissions(&lua, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    drop(_guard);
    lua_is_exact(
        "puc-unknown-run",
        &lua,
        &[],
        "chains.lua",
        &chains_truth(),
        &[],
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A stripped binary's separate debug file (Debian's -dbg package) names its static C
/// functions in the capture itself: `--offline` shows `luaB_coresume`, and without the
/// debug file the same frame is an address.
#[test]
fn debug_files_name_c_functions_offline() {
    let Some(_guard) = bpf_test("debug_files_name_c_functions_offline") else {
        return;
    };
    let Some(lua) = debian("5.4") else {
        return;
    };
    if installed("/usr/lib/debug/.build-id", "Debian's -dbg packages").is_none() {
        return;
    }
    for (lrec_args, named) in [(&[][..], true), (NO_DEBUG, false)] {
        let (dir, cap) = record_lua(
            "puc-offline-names",
            &lua,
            &[],
            "chains.lua",
            5,
            2,
            lrec_args,
        );
        let (stacks, _) = folded(&cap, &["--offline"]);
        let coresume = stacks
            .iter()
            .any(|(f, _)| f.iter().any(|f| f == "luaB_coresume"));
        assert_eq!(coresume, named, "with {lrec_args:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
