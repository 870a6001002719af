//! A human-readable summary of a capture and of how well it could be analysed.

use std::io::{self, Write};

use super::latency::{count, format_ns, Durations};
use crate::{Latencies, Profile, RecordingWindow};

/// Writes header fields, counts, threads, binaries and warnings.
pub fn write_info(profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
    let h = &profile.header;
    let s = &profile.stats;
    writeln!(out, "capture")?;
    writeln!(out, "  recorded by:   {}", or_unknown(&h.tool_version))?;
    writeln!(
        out,
        "  command line:  {}",
        or_unknown(&h.command_line.join(" "))
    )?;
    writeln!(
        out,
        "  host:          {} (kernel {}, {})",
        or_unknown(&h.hostname),
        or_unknown(&h.kernel_release),
        or_unknown(&h.arch)
    )?;
    writeln!(out, "  target pid:    {}", h.target_pid)?;
    writeln!(
        out,
        "  event:         {} at {} Hz, {} stack bytes per sample",
        or_unknown(&h.event),
        h.frequency_hz,
        h.stack_size
    )?;
    writeln!(
        out,
        "  ended:         {}",
        profile
            .end_reason
            .as_deref()
            .unwrap_or("cut short (no end record)")
    )?;
    let duration = match (s.first_time_ns, s.last_time_ns) {
        (Some(a), Some(b)) => format!("{:.3} s of samples", (b - a) as f64 / 1e9),
        _ => "no samples".to_owned(),
    };
    writeln!(out, "  duration:      {duration}")?;
    writeln!(out)?;
    writeln!(out, "samples")?;
    writeln!(out, "  total:         {}", s.samples)?;
    match &s.lost_causes {
        Some(c) if s.lost > 0 => writeln!(out, "  lost:          {}", c.explain(s.lost))?,
        _ => writeln!(out, "  lost:          {}", s.lost)?,
    }
    writeln!(out, "  in kernel:     {}", s.kernel_samples)?;
    writeln!(
        out,
        "  truncated:     {}{}",
        s.truncated,
        percent(s.truncated, s.samples)
    )?;
    writeln!(
        out,
        "  failed unwind: {}{}",
        s.failed_unwinds,
        percent(s.failed_unwinds, s.samples)
    )?;
    if !s.vm_states.is_empty() {
        writeln!(out, "  Lua VM state:  {}", vm_states(profile))?;
    }
    let jit = s.jit_mapped + s.jit_unmapped;
    if jit > 0 {
        writeln!(
            out,
            "  in traces:     {} mapped to their snapshot (inlined functions, lines){}, {} \
             not mapped (trace's base frame only){}",
            s.jit_mapped,
            percent(s.jit_mapped, jit),
            s.jit_unmapped,
            percent(s.jit_unmapped, jit)
        )?;
    }
    if !profile.lua_vms.is_empty() {
        writeln!(out)?;
        writeln!(out, "Lua VMs ({})", profile.lua_vms.len())?;
        for v in &profile.lua_vms {
            let layout = match &v.error {
                // lrec's line: "…, but WHY; recording native stacks only".
                Some(e) => {
                    let why = e.split_once(", but ").map_or(e.as_str(), |(_, w)| w);
                    let why = why.split("; recording native").next().unwrap_or(why);
                    format!("native stacks only: {why}")
                }
                // lrec found the VM but no sample ran its interpreter loop.
                None if v.layout.is_empty() => {
                    "layout not proved: no sample ran its interpreter loop".to_string()
                }
                None => format!("layout {}", v.layout),
            };
            let puc = v.vm.starts_with("Lua 5.");
            let states = match profile.stats.lua_states.get(&(v.pid, puc)) {
                Some(&n) if v.error.is_none() => {
                    format!(", {n} VM{} running", if n == 1 { "" } else { "s" })
                }
                _ => String::new(),
            };
            writeln!(
                out,
                "  pid {:<8} {} in {} ({layout}{states})",
                v.pid, v.vm, v.path
            )?;
        }
    }
    writeln!(out)?;
    writeln!(out, "threads ({})", profile.threads.len())?;
    for t in &profile.threads {
        writeln!(
            out,
            "  {:>8} {:>8}  {:<16} {} samples",
            t.pid, t.tid, t.name, t.samples
        )?;
    }
    if let Some(w) = &profile.window {
        write_window(h.monotonic_start_ns, w, out)?;
    }
    if let Some(l) = &profile.latency {
        write_latency_summary(l, out)?;
    }
    writeln!(out)?;
    writeln!(out, "binaries ({})", profile.binaries.len())?;
    for (i, b) in profile.binaries.iter().enumerate() {
        let id = match &b.build_id {
            Some(id) => lrec_inspect::debug_files::build_id_hex(id),
            None => "(no build-id)".to_owned(),
        };
        writeln!(out, "  {}", b.path)?;
        writeln!(out, "      build-id {id}")?;
        let mut facts = vec![
            yes_no("sections embedded", b.sections_embedded),
            yes_no("DWARF embedded", b.dwarf_embedded),
            yes_no("unwind info", b.has_unwind_info),
            yes_no("DWARF", b.has_dwarf),
        ];
        if b.samples_without_unwind_info > 0 {
            facts.push(format!(
                "{} samples without unwind info",
                b.samples_without_unwind_info
            ));
        }
        writeln!(out, "      {}", facts.join(", "))?;
        if let Some(n) = profile.binary_names.get(i) {
            writeln!(out, "      names: {}", n.names_from)?;
            if n.samples > 0 {
                writeln!(
                    out,
                    "      {} of its {} samples ({:.1}%) in functions without a name",
                    n.unnamed,
                    n.samples,
                    100.0 * n.unnamed as f64 / n.samples as f64
                )?;
            }
        }
        for local in &b.resolved_locally {
            writeln!(out, "      resolved locally from {local}")?;
        }
        if let Some(e) = &b.error {
            writeln!(out, "      not embedded: {e}")?;
        }
    }
    if !profile.warnings.is_empty() {
        writeln!(out)?;
        writeln!(out, "warnings ({})", profile.warnings.len())?;
        for w in &profile.warnings {
            match w.count {
                1 => writeln!(out, "  {}", w.message)?,
                n => writeln!(out, "  {} ({n} times)", w.message)?,
            }
        }
    }
    Ok(())
}

/// The recording's window (`lrec --off-cpu`, `--states`), from and to in seconds after
/// the capture's start (as `--time` counts), and the off-CPU intervals it cut, in all and
/// per thread.
fn write_window(start_ns: u64, w: &RecordingWindow, out: &mut dyn Write) -> io::Result<()> {
    let secs = |ns: u64| ns.saturating_sub(start_ns) as f64 / 1e9;
    let (at_start, at_end) =
        (w.cuts.iter()).fold((0, 0), |(s, e), (c, _)| (s + c.at_start, e + c.at_end));
    writeln!(out)?;
    writeln!(out, "off-CPU window")?;
    writeln!(
        out,
        "  window:        {:.3} s, {:.3}..{:.3} s (the recording's: its samples, off-CPU \
         time and thread states lie inside it)",
        secs(w.end_ns) - secs(w.start_ns),
        secs(w.start_ns),
        secs(w.end_ns)
    )?;
    writeln!(
        out,
        "  cut at start:  {at_start} intervals (began before it: counted from its start)"
    )?;
    writeln!(
        out,
        "  cut at end:    {at_end} intervals (still open at its end: counted to it)"
    )?;
    for (c, name) in &w.cuts {
        writeln!(
            out,
            "  {:>8} {:>8}  {:<16} {} at start, {} at end",
            c.pid, c.tid, name, c.at_start, c.at_end
        )?;
    }
    Ok(())
}

/// A line per probe that `lrec --latency` or `--node-loop` timed: calls, p50 and p99.
fn write_latency_summary(l: &Latencies, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out)?;
    writeln!(
        out,
        "latency ({} probes; --latency shows more)",
        l.record.probes.len()
    )?;
    let mut probes: Vec<_> = l.record.probes.iter().collect();
    probes.sort_by_key(|p| p.id);
    let width = probes.iter().map(|p| p.name.chars().count()).max();
    let width = width.unwrap_or(0).min(48);
    for p in probes {
        let d = Durations::of(l.record.histograms.iter().filter(|h| h.probe == p.id));
        write!(out, "  {:<width$} {:>11} calls", p.name, count(d.count))?;
        if d.count > 0 {
            write!(
                out,
                "  p50 {:>9}  p99 {:>9}",
                format_ns(d.percentile(0.5) as f64),
                format_ns(d.percentile(0.99) as f64)
            )?;
        }
        writeln!(out)?;
    }
    for u in &l.record.unresolved {
        writeln!(out, "  not timed: {u}")?;
    }
    Ok(())
}

/// Samples per Lua VM state, as `62.0% JIT-compiled, 30.1% interpreted, …` (of the
/// samples taken while a Lua VM ran), most first.
pub fn vm_states(profile: &Profile) -> String {
    let states = &profile.stats.vm_states;
    let total: u64 = states.values().sum();
    let mut v: Vec<(&&str, &u64)> = states.iter().collect();
    v.sort_by_key(|(name, n)| (std::cmp::Reverse(**n), **name));
    v.iter()
        .map(|(name, &n)| format!("{:.1}% {name}", 100.0 * n as f64 / total.max(1) as f64))
        .collect::<Vec<_>>()
        .join(", ")
}

fn or_unknown(s: &str) -> &str {
    if s.is_empty() {
        "?"
    } else {
        s
    }
}

fn yes_no(what: &str, yes: bool) -> String {
    format!("{what}: {}", if yes { "yes" } else { "no" })
}

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        String::new()
    } else {
        format!(" ({:.1}%)", 100.0 * part as f64 / whole as f64)
    }
}
