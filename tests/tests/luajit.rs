//! LuaJIT stacks against ground truth (fixtures/workloads/lua/chains.lua): Debian's
//! `luajit` (OpenResty's luajit2, GC64) and upstream LuaJIT built GC64 and GC32, with the
//! JIT on and off, each attached with `lrec -p` after it started; the other kinds of calls
//! (fixtures/workloads/lua/kinds.lua); and a stripped host that links LuaJIT statically
//! and runs one VM per thread.

use std::path::PathBuf;

use lrec_e2e::*;

/// `-joff` when the JIT compiler is to be off.
fn flags(jit_off: bool) -> &'static [&'static str] {
    if jit_off {
        &["-joff"]
    } else {
        &[]
    }
}

fn chains_are_exact(what: &str, luajit: PathBuf, jit_off: bool) {
    lua_is_exact(
        what,
        &luajit,
        flags(jit_off),
        "chains.lua",
        &chains_truth(),
        &[],
    );
}

fn kinds_are_exact(what: &str, luajit: PathBuf, jit_off: bool) {
    lua_is_exact(
        what,
        &luajit,
        flags(jit_off),
        "kinds.lua",
        &kinds_truth(),
        &[],
    );
}

#[test]
fn debian_luajit_jit_on() {
    if let Some(lj) = installed("/usr/bin/luajit", "Debian luajit, JIT on") {
        chains_are_exact("debian luajit jit on", lj, false);
    }
}

#[test]
fn debian_luajit_jit_off() {
    if let Some(lj) = installed("/usr/bin/luajit", "Debian luajit, -joff") {
        chains_are_exact("debian luajit joff", lj, true);
    }
}

#[test]
fn deep_frames_are_named_from_call_sites_jit_on_and_off() {
    let gc64 = fixture_bin("luajit-gc64");
    // The fixture keeps its symbols: lj_func_freeproto is named, and counted.
    let counted = "by no proto freed since (a uprobe on lj_func_freeproto at 0x";
    deep_frames_are_named_from_sites("gc64 deep jit on", &gc64, flags(false), counted, true);
    deep_frames_are_named_from_sites("gc64 deep jit off", &gc64, flags(true), counted, true);
}

#[test]
fn upstream_gc64_jit_on() {
    chains_are_exact("gc64 jit on", fixture_bin("luajit-gc64"), false);
}

#[test]
fn upstream_gc64_jit_off() {
    chains_are_exact("gc64 joff", fixture_bin("luajit-gc64"), true);
}

#[test]
fn upstream_gc32_jit_on() {
    chains_are_exact("gc32 jit on", fixture_bin("luajit-gc32"), false);
}

#[test]
fn upstream_gc32_jit_off() {
    chains_are_exact("gc32 joff", fixture_bin("luajit-gc32"), true);
}

#[test]
fn kinds_debian_luajit_jit_on() {
    if let Some(lj) = installed("/usr/bin/luajit", "Debian luajit, kinds") {
        kinds_are_exact("kinds debian luajit jit on", lj, false);
    }
}

#[test]
fn kinds_gc64_jit_off() {
    kinds_are_exact("kinds gc64 joff", fixture_bin("luajit-gc64"), true);
}

#[test]
fn kinds_gc32_jit_on() {
    kinds_are_exact("kinds gc32 jit on", fixture_bin("luajit-gc32"), false);
}

#[test]
fn kinds_gc32_jit_off() {
    kinds_are_exact("kinds gc32 joff", fixture_bin("luajit-gc32"), true);
}

/// fixtures/workloads/lua/reload.lua recreates its functions continually (load() of new
/// text, modules re-required, collectgarbage()): ≥ 99 % of the samples in them name the
/// chunk and line that ran.
fn reloaded_code_is_named_right(what: &str, luajit: PathBuf, jit_off: bool) {
    let Some(_guard) = bpf_test(what) else {
        return;
    };
    let (dir, cap) = record_lua(what, &luajit, flags(jit_off), "reload.lua", 8, 6, &[]);

    let (stacks, _) = folded(&cap, &["--offline"]);
    let gen = regex::Regex::new(r"(?:^|\s)gen_(\d+):(\d+)$").unwrap();
    let module = regex::Regex::new(r"reload_([ab])\.lua:(\d+)$").unwrap();
    let (mut judged, mut right) = (0, 0);
    let mut wrong = Vec::new();
    for (frames, n) in &stacks {
        // The innermost frame of recreated code: generated chunks, the modules, or
        // a function lrec could not name.
        let Some(leaf) = frames.iter().rev().find(|f| {
            gen.is_match(f) || module.is_match(f) || f.contains("[unknown Lua function]")
        }) else {
            continue;
        };
        judged += n;
        let ok = if let Some(c) = gen.captures(leaf) {
            let (chunk, line): (u32, u32) = (c[1].parse().unwrap(), c[2].parse().unwrap());
            line == 0 || line == 1 + chunk % 7
        } else if let Some(c) = module.captures(leaf) {
            let line: u32 = c[2].parse().unwrap();
            line == 0 || line == if &c[1] == "a" { 3 } else { 6 }
        } else {
            false
        };
        if ok {
            right += n;
        } else {
            wrong.push((leaf.clone(), *n));
        }
    }
    eprintln!(
        "{what}: {right}/{judged} samples in recreated code named right ({:.2} %)",
        100.0 * right as f64 / judged.max(1) as f64
    );
    assert!(
        judged >= 500,
        "{what}: only {judged} samples in recreated code"
    );
    assert!(
        right as f64 >= 0.99 * judged as f64,
        "{what}: {right}/{judged}; wrong: {wrong:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn reload_gc64_jit_on() {
    reloaded_code_is_named_right("reload gc64 jit on", fixture_bin("luajit-gc64"), false);
}

#[test]
fn reload_gc32_jit_off() {
    reloaded_code_is_named_right("reload gc32 joff", fixture_bin("luajit-gc32"), true);
}

#[test]
fn reload_debian_luajit_jit_on() {
    if let Some(lj) = installed("/usr/bin/luajit", "Debian luajit, reload") {
        reloaded_code_is_named_right("reload debian luajit jit on", lj, false);
    }
}

/// fixtures/bin/lua-host: stripped, LuaJIT linked in, three threads with a VM each.
#[test]
fn several_vms_in_a_stripped_static_host() {
    several_vms_are_told_apart("lua-host", fixture_bin("lua-host"));
}

/// LuaJIT built without the JIT compiler: its global state is laid out as no release
/// table says (no jit_State before the dispatch table), and its layout is learned from the
/// binary like any other build's.
#[test]
fn a_build_without_the_jit_is_learned() {
    chains_are_exact("nojit", fixture_bin("luajit-nojit"), false);
}
