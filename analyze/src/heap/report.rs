//! What `lanalyze --heap` prints: a summary per VM with its census and largest paths
//! (`--top N`), one CSV row per object (`--csv`), a memory flame graph by path
//! (`--flamegraph`, `--folded`), and the growth between two snapshots (`--diff`).

use std::collections::BTreeMap;
use std::io::{self, Write};

use super::{HeapReport, PathTree};

/// `1.5 MiB`.
fn size(n: u64) -> String {
    let n = n as f64;
    match n {
        n if n >= (1 << 30) as f64 => format!("{:.2} GiB", n / (1u64 << 30) as f64),
        n if n >= (1 << 20) as f64 => format!("{:.2} MiB", n / (1u64 << 20) as f64),
        n if n >= 1024.0 => format!("{:.1} KiB", n / 1024.0),
        n => format!("{n} B"),
    }
}

/// `+1.5 MiB`, `-12 B`.
fn growth(n: i64) -> String {
    match n < 0 {
        true => format!("-{}", size(n.unsigned_abs())),
        false => format!("+{}", size(n as u64)),
    }
}

/// One row of the largest paths: a path with the objects it holds (its own, and all that
/// its `[*]` elements reach: the contents of a container), and all it retains.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathRow {
    pub path: String,
    /// Bytes and objects of the path's own objects and of everything under its `[*]`.
    pub held: u64,
    pub objects: u64,
    /// Bytes of everything reached through the path.
    pub retained: u64,
}

/// The rows of a report's paths, largest held first.
pub fn path_rows(paths: &PathTree) -> Vec<PathRow> {
    let n = paths.nodes.len();
    // Objects under each node, itself included (children follow their parents).
    let mut under = vec![0u64; n];
    for i in (1..n).rev() {
        under[i] += paths.nodes[i].count;
        if let Some(p) = paths.nodes[i].parent {
            under[p as usize] += under[i];
        }
    }
    let elements = |i: usize| paths.nodes[i].children.iter().map(|&c| c as usize);
    let mut rows: Vec<PathRow> = (1..n)
        .filter(|&i| paths.nodes[i].component != "[*]")
        .map(|i| {
            let node = &paths.nodes[i];
            let mut row = PathRow {
                path: paths.path(i as u32),
                held: node.bytes,
                objects: node.count,
                retained: node.retained,
            };
            for c in elements(i).filter(|&c| paths.nodes[c].component == "[*]") {
                row.held += paths.nodes[c].retained;
                row.objects += under[c];
            }
            row
        })
        .filter(|r| r.held > 0)
        .collect();
    rows.sort_by(|a, b| b.held.cmp(&a.held).then_with(|| a.path.cmp(&b.path)));
    rows
}

/// The summary of each VM, with its `top` largest paths.
pub fn write_summary(reports: &[HeapReport], top: usize, out: &mut dyn Write) -> io::Result<()> {
    for (i, r) in reports.iter().enumerate() {
        if i > 0 {
            writeln!(out)?;
        }
        let vm = &r.vm;
        writeln!(
            out,
            "Lua heap of process {} (snapshot {}): {} ({}), global_State {:#x}",
            vm.pid, vm.snapshot, vm.vm, vm.layout, vm.g
        )?;
        let c = &r.copy;
        let how = match c.frozen {
            true => format!("process stopped {:.1} ms", c.stopped_ns as f64 / 1e6),
            false => "live: the process ran while it was copied".into(),
        };
        writeln!(
            out,
            "  copied {} in {:.0} ms ({how}){}",
            size(c.bytes),
            c.copy_ns as f64 / 1e6,
            match c.unreadable {
                0 => String::new(),
                u => format!(", {} unreadable", size(u)),
            }
        )?;
        let objects: u64 = r.census.values().map(|(n, _)| n).sum();
        let census = r.census_bytes();
        writeln!(
            out,
            "  census: {objects} objects, {}; the collector counts {} ({:.2} % of it found)",
            size(census),
            size(r.gc_total),
            100.0 * census as f64 / r.gc_total.max(1) as f64
        )?;
        for (kind, (n, bytes)) in &r.census {
            writeln!(out, "    {:<9} {n:>10} {:>12}", kind.name(), size(*bytes))?;
        }
        let garbage = &r.paths.nodes[r.unreachable as usize];
        if garbage.count > 0 {
            writeln!(
                out,
                "  unreachable (garbage not collected yet): {} objects, {}",
                garbage.count,
                size(garbage.bytes)
            )?;
        }
        writeln!(
            out,
            "  largest paths (held: the objects there and all their [*] elements reach; \
             retained: all reached through it):"
        )?;
        writeln!(
            out,
            "    {:>12} {:>9} {:>12}  path",
            "held", "objects", "retained"
        )?;
        for row in path_rows(&r.paths).iter().take(top) {
            writeln!(
                out,
                "    {:>12} {:>9} {:>12}  {}",
                size(row.held),
                row.objects,
                size(row.retained),
                row.path
            )?;
        }
        for w in &r.warnings {
            writeln!(out, "  warning: {w}")?;
        }
    }
    Ok(())
}

/// One CSV row per object: pid, snapshot, vm (its global_State), address, type, size,
/// path, and a detail: where a Lua function or proto was defined, a table's array slots
/// and hash nodes, a thread's stack slots.
pub fn write_csv(reports: &[HeapReport], out: &mut dyn Write) -> io::Result<()> {
    writeln!(out, "pid,snapshot,vm,address,type,size,path,detail")?;
    for r in reports {
        let paths: Vec<String> = (0..r.paths.nodes.len() as u32)
            .map(|n| r.paths.path(n).replace('"', "\"\""))
            .collect();
        for (i, (o, node)) in r.objects.iter().enumerate() {
            let detail = (r.details.get(&i))
                .map(|d| d.to_string().replace('"', "\"\""))
                .unwrap_or_default();
            writeln!(
                out,
                "{},{},{:#x},{:#x},{},{},\"{}\",\"{detail}\"",
                r.vm.pid,
                r.vm.snapshot,
                r.vm.g,
                o.addr,
                o.kind.name(),
                o.size,
                paths[*node as usize]
            )?;
        }
    }
    Ok(())
}

/// Folded stacks of paths, bytes as the count: `_G;.sessions;[*] 123456`. With several
/// VMs each stack starts with its VM.
pub fn folded(reports: &[HeapReport]) -> BTreeMap<String, u64> {
    let mut lines = BTreeMap::new();
    for r in reports {
        let vm = (reports.len() > 1).then(|| {
            format!(
                "{} {:#x} [{}] snapshot {}",
                r.vm.vm, r.vm.g, r.vm.pid, r.vm.snapshot
            )
        });
        for (i, node) in r.paths.nodes.iter().enumerate().skip(1) {
            if node.bytes == 0 {
                continue;
            }
            let mut frames: Vec<&str> = vm.iter().map(String::as_str).collect();
            frames.extend(r.paths.components(i as u32));
            *lines.entry(frames.join(";")).or_default() += node.bytes;
        }
    }
    lines
}

pub fn write_folded(reports: &[HeapReport], out: &mut dyn Write) -> io::Result<()> {
    for (stack, bytes) in folded(reports) {
        writeln!(out, "{stack} {bytes}")?;
    }
    Ok(())
}

pub fn write_flamegraph(reports: &[HeapReport], out: &mut dyn Write) -> io::Result<()> {
    let lines: Vec<String> = folded(reports)
        .into_iter()
        .map(|(s, b)| format!("{s} {b}"))
        .collect();
    let total: u64 = reports.iter().map(HeapReport::census_bytes).sum();
    let title = format!("Lua heap: {} by reference path", size(total));
    let subtitle = "width: bytes retained through each path (its first, shortest from the roots)";
    crate::render::draw_flamegraph(&lines, title, Some(subtitle.into()), "bytes", out)
}

/// Per path, before and after: (held, objects, retained).
type Rows = BTreeMap<String, (PathRow, PathRow)>;

/// The paths of two snapshots side by side (every VM of each, summed by path).
fn diff_rows(before: &[HeapReport], after: &[HeapReport]) -> Rows {
    let mut rows = Rows::new();
    for (side, reports) in [before, after].into_iter().enumerate() {
        for r in reports {
            for row in path_rows(&r.paths) {
                let e = rows.entry(row.path.clone()).or_default();
                let e = if side == 0 { &mut e.0 } else { &mut e.1 };
                e.held += row.held;
                e.objects += row.objects;
                e.retained += row.retained;
            }
        }
    }
    rows
}

/// The `top` paths that grew most (held bytes) from `before` to `after`.
pub fn write_diff(
    before: &[HeapReport],
    after: &[HeapReport],
    top: usize,
    out: &mut dyn Write,
) -> io::Result<()> {
    let total = |rs: &[HeapReport]| rs.iter().map(HeapReport::census_bytes).sum::<u64>();
    let (b, a) = (total(before), total(after));
    writeln!(
        out,
        "Lua heap: {} → {} ({})",
        size(b),
        size(a),
        growth(a as i64 - b as i64)
    )?;
    let mut rows: Vec<(String, PathRow, PathRow)> = diff_rows(before, after)
        .into_iter()
        .map(|(p, (b, a))| (p, b, a))
        .collect();
    let grew = |b: &PathRow, a: &PathRow| a.held as i64 - b.held as i64;
    rows.sort_by(|x, y| grew(&y.1, &y.2).cmp(&grew(&x.1, &x.2)).then(x.0.cmp(&y.0)));
    writeln!(
        out,
        "paths by growth of held bytes (the objects there and all their [*] elements \
         reach), and of retained bytes (all reached through them):"
    )?;
    writeln!(
        out,
        "  {:>12} {:>12} {:>12} {:>12} {:>10}  path",
        "growth", "before", "after", "retained", "objects"
    )?;
    for (path, b, a) in rows.iter().take(top) {
        writeln!(
            out,
            "  {:>12} {:>12} {:>12} {:>12} {:>+10}  {path}",
            growth(grew(b, a)),
            size(b.held),
            size(a.held),
            growth(a.retained as i64 - b.retained as i64),
            a.objects as i64 - b.objects as i64
        )?;
    }
    Ok(())
}

/// A differential flame graph: AFTER's paths, red where they grew.
pub fn write_diff_flamegraph(
    before: &[HeapReport],
    after: &[HeapReport],
    out: &mut dyn Write,
) -> io::Result<()> {
    let (b, a) = (folded(before), folded(after));
    let mut stacks: Vec<&String> = b.keys().chain(a.keys()).collect();
    stacks.sort_unstable();
    stacks.dedup();
    let lines: Vec<String> = stacks
        .into_iter()
        .map(|s| {
            let get = |m: &BTreeMap<String, u64>| m.get(s).copied().unwrap_or(0);
            format!("{s} {} {}", get(&b), get(&a))
        })
        .collect();
    let total = |rs: &[HeapReport]| rs.iter().map(HeapReport::census_bytes).sum::<u64>();
    let title = format!(
        "Lua heap growth: {} → {}",
        size(total(before)),
        size(total(after))
    );
    crate::render::draw_flamegraph(
        &lines,
        title,
        Some("red grew, blue shrank".into()),
        "bytes",
        out,
    )
}
