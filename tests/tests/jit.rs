//! Samples in LuaJIT traces named by the snapshot that covers the sampled instruction:
//! the functions inlined into the trace and the current lines
//! (fixtures/workloads/lua/inlined.lua), and names that stay right while traces are
//! flushed and recompiled at the same numbers and addresses
//! (fixtures/workloads/lua/flush.lua). Debian's `luajit` (OpenResty's luajit2, GC64) and
//! upstream LuaJIT built GC64 and GC32, attached with `lrec -p` after they started.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use lrec_e2e::*;
use regex::Regex;

/// The samples in traces that their snapshot mapped, and those it did not, from --info.
fn jit_mapping(capture: &Path) -> (u64, u64) {
    let out = lanalyze(&[capture.as_ref(), "--info".as_ref()]);
    let text = String::from_utf8_lossy(&out);
    let re = Regex::new(r"in traces:\s+(\d+) mapped.*?, (\d+) not mapped").unwrap();
    let c = re
        .captures(&text)
        .unwrap_or_else(|| panic!("--info tells no samples in traces:\n{text}"));
    (c[1].parse().unwrap(), c[2].parse().unwrap())
}

/// Every sample's Lua chain is a prefix of main → run → hash → mix, each frame on a line
/// of its function's body, and mix (inlined into run's trace) is the leaf of many.
fn inlined_functions_are_shown(what: &str, luajit: PathBuf) {
    let Some(_guard) = bpf_test(what) else {
        return;
    };
    let (dir, cap) = record_lua(what, &luajit, &[], "inlined.lua", 10, 8, &[]);
    let (stacks, _) = folded(&cap, &["--lines"]);
    // (linedefined, first and last line of the body) root first.
    let truth = [(0, 6, 32), (23, 24, 28), (18, 19, 21), (11, 12, 16)];
    let frame = Regex::new(r"inlined\.lua:(\d+)@(\d+)$").unwrap();
    let (mut judged, mut exact, mut in_mix) = (0, 0, 0);
    let mut wrong = Vec::new();
    for (frames, n) in &stacks {
        let lua: Vec<(u32, u32)> = frames
            .iter()
            .filter_map(|f| frame.captures(f))
            .map(|c| (c[1].parse().unwrap(), c[2].parse().unwrap()))
            .collect();
        if lua.len() < 2 {
            continue; // not in run's loop: starting, or in os.clock
        }
        judged += n;
        // The innermost line is unknown (0) in a trace the snapshot could not map.
        let right = lua.len() <= truth.len()
            && lua.iter().zip(&truth).enumerate().all(
                |(i, (&(def, line), &(tdef, first, last)))| {
                    def == tdef
                        && ((first..=last).contains(&line) || (line == 0 && i + 1 == lua.len()))
                },
            );
        if right {
            exact += n;
            in_mix += if lua.len() == 4 { *n } else { 0 };
        } else {
            wrong.push(frames.join(";"));
        }
    }
    let (mapped, unmapped) = jit_mapping(&cap);
    eprintln!(
        "{what}: {exact}/{judged} samples with a true chain and lines, {in_mix} in mix \
         (inlined); in traces: {mapped} mapped, {unmapped} not"
    );
    assert!(judged > 1000, "{what}: only {judged} samples in run's loop");
    assert!(
        exact * 100 >= judged * 99,
        "{what}: {exact}/{judged} right; wrong: {:#?}",
        &wrong[..wrong.len().min(5)]
    );
    assert!(
        in_mix * 10 >= judged,
        "{what}: mix, inlined into the trace, is the leaf of {in_mix}/{judged} samples only"
    );
    // Samples in helpers the trace called and in side traces' first instructions are
    // mapped too: what is left are exit stubs and the first milliseconds.
    assert!(
        mapped * 100 >= (mapped + unmapped) * 98,
        "{what}: {mapped} samples in traces mapped, {unmapped} not"
    );
    std::fs::remove_dir_all(dir).ok();
}

/// Every sample in a phase's code names one phase only, though each phase flushes the
/// traces and recompiles them at the same numbers, often at the same addresses.
fn flushed_traces_name_the_right_phase(what: &str, luajit: PathBuf) {
    let Some(_guard) = bpf_test(what) else {
        return;
    };
    let (dir, cap) = record_lua(what, &luajit, &[], "flush.lua", 10, 8, &[]);
    let (stacks, _) = folded(&cap, &[]);
    let phase = Regex::new(r"phase(\d+):\d+$").unwrap();
    let (mut judged, mut right) = (0, 0);
    let mut phases = BTreeSet::new();
    let mut wrong = Vec::new();
    for (frames, n) in &stacks {
        let ks: BTreeSet<u32> = frames
            .iter()
            .filter_map(|f| phase.captures(f))
            .map(|c| c[1].parse().unwrap())
            .collect();
        if ks.is_empty() {
            continue;
        }
        judged += n;
        phases.extend(ks.iter().copied());
        if ks.len() == 1 {
            right += n;
        } else {
            wrong.push(frames.join(";"));
        }
    }
    let (mapped, unmapped) = jit_mapping(&cap);
    eprintln!(
        "{what}: {right}/{judged} samples name one phase, {} phases; in traces: {mapped} \
         mapped, {unmapped} not",
        phases.len()
    );
    assert!(
        judged > 1000,
        "{what}: only {judged} samples in the phases' code"
    );
    assert!(phases.len() >= 10, "{what}: {} phases seen", phases.len());
    assert!(
        right * 100 >= judged * 99,
        "{what}: {right}/{judged} right; wrong: {:#?}",
        &wrong[..wrong.len().min(5)]
    );
    // Samples in helpers the trace called and in side traces' first instructions are
    // mapped too: what is left are exit stubs and the first milliseconds.
    assert!(
        mapped * 100 >= (mapped + unmapped) * 98,
        "{what}: {mapped} samples in traces mapped, {unmapped} not"
    );
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn inlined_debian_luajit() {
    if let Some(lj) = installed("/usr/bin/luajit", "Debian luajit") {
        inlined_functions_are_shown("inlined debian luajit", lj);
    }
}

#[test]
fn inlined_gc64() {
    inlined_functions_are_shown("inlined gc64", fixture_bin("luajit-gc64"));
}

#[test]
fn inlined_gc32() {
    inlined_functions_are_shown("inlined gc32", fixture_bin("luajit-gc32"));
}

#[test]
fn flush_debian_luajit() {
    if let Some(lj) = installed("/usr/bin/luajit", "Debian luajit") {
        flushed_traces_name_the_right_phase("flush debian luajit", lj);
    }
}

#[test]
fn flush_gc64() {
    flushed_traces_name_the_right_phase("flush gc64", fixture_bin("luajit-gc64"));
}

#[test]
fn flush_gc32() {
    flushed_traces_name_the_right_phase("flush gc32", fixture_bin("luajit-gc32"));
}
