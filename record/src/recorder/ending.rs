//! How a recording ends: a capture's last records (binaries still being embedded, renamed
//! threads, kernel symbols, the end record), the flight recorder's dumps, and the
//! summaries lrec prints.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use lrec_format::{End, KernelSymbols, LostCauses, Record, ThreadName};

use super::feature::Feature;
use super::Recording;
use crate::capture_file::human_bytes;
use crate::kallsyms::KallsymsTable;
use crate::output::Output;
use crate::procfs;

/// What a finished capture holds.
pub struct Summary {
    pub samples: u64,
    pub lost: u64,
    pub lost_causes: LostCauses,
    pub threads: usize,
    pub bytes: u64,
    /// `--off-cpu`: what was recorded and counted.
    pub off_cpu: Option<OffCpuSummary>,
    /// `--states`: thread-state samples taken.
    pub state_samples: u64,
    /// `--lua-heap`: Lua VMs snapshotted (summed over the snapshots).
    pub heap_vms: u32,
    /// Lua frames recorded, those BPF named from call sites remembered in earlier samples
    /// (proving each by one read of its proto), and the sites it found stale.
    pub lua_frames: (u64, u64, u64),
    /// Lua frames taken unchanged from their CPU's last full LuaJIT walk, and walks cut
    /// where the memo they named was not received.
    pub lua_memo: (u64, u64),
    /// Per binary holding a VM: how its call sites were proved (by counting freed protos,
    /// or by reading each site's proto).
    pub lua_site_proofs: Vec<String>,
    /// Binaries not embedded: lrec was stopped before their sections were read.
    pub not_embedded: usize,
    /// Binaries embedded without their DWARF, to keep lrec's memory under its ceiling.
    pub dwarf_shed: u64,
}

/// The off-CPU intervals of a recording.
#[derive(Debug, Clone, Default)]
pub struct OffCpuSummary {
    pub recorded: u64,
    /// Lua coroutine waits recorded, and those shorter than the minimum: (count, ns).
    pub lua_waits: u64,
    pub lua_waits_short: (u64, u64),
    /// The yield rate at which lrec stopped timing Lua waits, if it did.
    pub lua_waits_stopped: Option<f64>,
    pub min_ns: u64,
    /// What was counted without stacks, summed over the threads.
    pub counted: lrec_format::ThreadOffCpuTotals,
    /// Intervals the recording's window cut at its start and at its end (recorded or
    /// counted: only their part inside it counts).
    pub cut: (u64, u64),
}

impl OffCpuSummary {
    fn print(&self) {
        let ms = |ns: u64| ns as f64 / 1e6;
        let c = &self.counted;
        eprintln!(
            "lrec: off-CPU: {} blocked intervals recorded with stacks; counted without: {} \
             shorter than {:.3} ms ({:.1} ms), {} waits for a CPU ({:.1} ms), {} whose stack \
             was not taken (gone, or still blocked at the end) ({:.1} ms); {} intervals began \
             before the recording and {} were still open at its end: counted inside it only",
            self.recorded,
            c.short_count,
            ms(self.min_ns),
            ms(c.short_ns),
            c.runnable_count,
            ms(c.runnable_ns),
            c.unpaired_count,
            ms(c.unpaired_ns),
            self.cut.0,
            self.cut.1,
        );
        if self.lua_waits + self.lua_waits_short.0 > 0 {
            eprintln!(
                "lrec: Lua coroutine waits (lua_yield to lua_resume): {} recorded with stacks, {} \
                 shorter than {:.3} ms counted ({:.1} ms; not in the capture){}",
                self.lua_waits,
                self.lua_waits_short.0,
                ms(self.min_ns),
                ms(self.lua_waits_short.1),
                match self.lua_waits_stopped {
                    Some(rate) => format!(
                        "; stopped after {rate:.0} yields/s (above --lua-waits-max-rate): \
                         later waits are not recorded"
                    ),
                    None => String::new(),
                },
            );
        }
    }
}

impl Summary {
    pub fn print(
        &self,
        elapsed: Duration,
        reason: &str,
        output: &Path,
        bpf_cost: Vec<(&str, u64, Duration)>,
    ) {
        print_totals(self.samples, self.lost, self.threads, elapsed, reason);
        print_lost(self.lost, &self.lost_causes);
        if self.dwarf_shed > 0 || crate::memory::peak() >= crate::memory::SHED_AT {
            eprintln!(
                "lrec: its own memory peaked at {} MiB of heap (ceiling {} MiB): {} binaries \
                 embedded without their DWARF to stay under it (lanalyze reads it from this \
                 machine's files or debuginfod)",
                crate::memory::peak() >> 20,
                crate::memory::CEILING >> 20,
                self.dwarf_shed
            );
        }
        if self.not_embedded > 0 {
            eprintln!(
                "lrec: {} binaries not embedded: lrec was stopped before it read them; \
                 lanalyze reads them from this machine's files (not with --offline)",
                self.not_embedded
            );
        }
        if let Some(o) = &self.off_cpu {
            o.print();
        }
        if self.state_samples > 0 {
            eprintln!(
                "lrec: {} thread-state samples (lanalyze --states)",
                self.state_samples
            );
        }
        if self.heap_vms > 0 {
            eprintln!(
                "lrec: wrote {} ({}, Lua heap snapshots of {} VM(s))",
                output.display(),
                human_bytes(self.bytes),
                self.heap_vms
            );
            eprintln!("lrec: next: lanalyze {} --heap", output.display());
        } else {
            eprintln!(
                "lrec: wrote {} ({}, {} B/sample)",
                output.display(),
                human_bytes(self.bytes),
                self.bytes.checked_div(self.samples).unwrap_or(0),
            );
            print_next(output);
        }
        for (name, runs, time) in bpf_cost {
            let us = time.as_nanos() as f64 / 1000.0;
            // The sampler also runs for other processes' and idle CPUs' ticks, which it
            // leaves at once: what a recorded sample costs is its time over them.
            let per_sample = match (name, self.samples) {
                ("sample", n) if n > 0 => format!(", {:.2} us per sample", us / n as f64),
                _ => String::new(),
            };
            let name = if name == "sample" { "sampler" } else { name };
            eprintln!(
                "lrec: BPF {name}: {runs} runs, {:.2} us per run{per_sample}, {:.3} s in all \
                 (kernel.bpf_stats_enabled)",
                us / runs as f64,
                time.as_secs_f64()
            );
        }
        // What the walk cost per frame: a frame named from a call site remembered in an
        // earlier sample costs the target no read of its memory when no proto was freed
        // since (the count of frees proves the site), else one (its proto), not three. A site that does not prove is read in full: no frame is
        // dropped for want of proof.
        if let (frames @ 1.., named, stale) = self.lua_frames {
            eprintln!(
                "lrec: Lua frames: {frames}, {:.1} % named from call sites remembered in \
                 earlier samples, each proved in its sample (0 dropped as unproved; {stale} \
                 sites found stale, their frames read in full)",
                named as f64 * 100.0 / frames as f64
            );
            let (taken, missing) = self.lua_memo;
            if taken > 0 || missing > 0 {
                eprintln!(
                    "lrec: Lua frames taken unchanged from their CPU's last full walk (its \
                     frames' words compared in the sample): {taken}, {:.1} %; {missing} walks \
                     cut where the walk they named was not received",
                    taken as f64 * 100.0 / frames as f64
                );
            }
            for line in &self.lua_site_proofs {
                eprintln!("lrec: Lua call sites {line}");
            }
        }
    }
}

/// The first line of every summary.
fn print_totals(samples: u64, lost: u64, threads: usize, elapsed: Duration, reason: &str) {
    eprintln!(
        "lrec: {samples} samples ({lost} lost) from {threads} threads in {:.1} s, {reason}",
        elapsed.as_secs_f64()
    );
}

/// Why samples were lost, and what to do, when any were.
fn print_lost(lost: u64, causes: &LostCauses) {
    if lost > 0 {
        eprintln!("lrec: {}", causes.explain(lost));
    }
}

/// The last line of every summary: what to run next.
fn print_next(capture: &Path) {
    eprintln!(
        "lrec: next: lanalyze {} --flamegraph -o flame.svg",
        capture.display()
    );
}

impl Recording {
    /// Threads seen so far.
    fn threads(&self) -> usize {
        self.procs.values().map(|p| p.threads.len()).sum()
    }

    pub(super) fn print_status(&self, elapsed: Duration) {
        let threads = self.threads();
        let held = match self.writer.get_ref().flight() {
            Some(f) => {
                let (meta, ring) = f.held_bytes();
                let w = f.window();
                format!(
                    "window {:.1} s, {} samples, {} in memory",
                    w.secs(),
                    w.samples,
                    human_bytes(meta + ring)
                )
            }
            None => human_bytes(self.writer.bytes_written()),
        };
        eprint!(
            "\r\x1b[K[lrec] {:.0} s  {} samples  {} lost  {threads} threads  {held}",
            elapsed.as_secs_f64(),
            self.samples,
            self.lost,
        );
    }

    /// Writes what a capture needs before it ends: the binaries still being embedded and
    /// the names of threads that renamed themselves since first seen. Returns the kernel
    /// symbols of the kernel addresses sampled so far.
    pub(super) fn settle(&mut self) -> Result<Option<KernelSymbols>> {
        self.write_embedded(true)?;
        self.lua.finish();
        // Layouts not proved by now are not: the samples held for them are written.
        self.release_held(true)?;
        for r in self.lua.take_records() {
            self.writer.push(&r)?;
        }
        for msg in self.lua.messages.drain(..) {
            eprintln!("lrec: {msg}");
        }
        for (&pid, proc) in &mut self.procs {
            for (&tid, old) in &mut proc.threads {
                match procfs::thread_name(pid, tid) {
                    Some(name) if *old != name => {
                        old.clone_from(&name);
                        self.writer
                            .push(&Record::ThreadName(ThreadName { pid, tid, name }))?;
                    }
                    _ => {}
                }
            }
        }
        if self.kernel_addrs.is_empty() {
            return Ok(None);
        }
        let table = self.kallsyms.table();
        Ok(table.map(|t| t.covering(self.kernel_addrs.iter().copied())))
    }

    /// Flight recorder: writes the window out as the next numbered capture (at each
    /// SIGUSR1: [`FlightDumps`], and at the end).
    pub(super) fn dump(&mut self, reason: &str) -> Result<()> {
        let syms = self.settle()?;
        // Writes out the last samples; the dump leaves what aged out of the window.
        self.writer.flush()?;
        let extra: Vec<Record> = syms.into_iter().map(Record::KernelSymbols).collect();
        let flight = self
            .writer
            .get_mut()
            .flight_mut()
            .expect("dumps are of a flight");
        let window = flight.window_secs();
        let d = flight.dump(procfs::monotonic_ns(), &extra, reason)?;
        eprintln!(
            "lrec: wrote {}: {:.1} s of samples (window {window} s), {} samples, {} lost, {} ({reason})",
            d.path.display(),
            d.span.secs(),
            d.span.samples,
            d.lost,
            human_bytes(d.bytes),
        );
        Ok(())
    }

    pub(super) fn print_flight_summary(&self, elapsed: Duration, reason: &str) {
        let flight = self.writer.get_ref().flight().expect("a flight");
        let (aged, aged_lost) = flight.aged();
        let (meta, ring) = flight.held_bytes();
        print_totals(self.samples, self.lost, self.threads(), elapsed, reason);
        print_lost(self.lost, &self.lost_causes);
        eprintln!(
            "lrec: flight recorder kept the last {} s: {} in memory at the end ({} of samples, \
             {} of metadata)",
            flight.window_secs(),
            human_bytes(meta + ring),
            human_bytes(ring),
            human_bytes(meta),
        );
        eprintln!(
            "lrec: aged out of the window: {} samples ({aged_lost} lost), {:.1} s of samples",
            aged.samples,
            aged.secs()
        );
        for d in &flight.dumps {
            eprintln!(
                "lrec: dump {}: {:.1} s, {} samples",
                d.path.display(),
                d.span.secs(),
                d.span.samples
            );
        }
        if let Some(d) = flight.dumps.last() {
            print_next(&d.path);
        }
    }

    pub(super) fn finish(mut self, reason: &str) -> Result<Summary> {
        if let Some(syms) = self.settle()? {
            self.writer.push(&Record::KernelSymbols(syms))?;
        }
        if self.lost > 0 {
            self.writer
                .push(&Record::LostCauses(self.lost_causes.clone()))?;
        }
        // What off-CPU time and thread states describe (the samples' span too).
        if self.off_cpu_summary.is_some() || self.state_samples > 0 {
            let window = std::mem::take(&mut self.window);
            self.writer.push(&Record::OffCpuWindow(window))?;
        }
        self.writer.push(&Record::End(End {
            time_ns: procfs::monotonic_ns(),
            samples: self.samples,
            lost: self.lost,
            reason: reason.to_string(),
        }))?;
        let threads = self.threads();
        // finish() flushed the file.
        let Output::File(out) = self.writer.finish()? else {
            unreachable!("a flight ends with a dump");
        };
        let bytes = crate::capture_file::commit_capture(out)?;
        Ok(Summary {
            samples: self.samples,
            lost: self.lost,
            lost_causes: self.lost_causes.clone(),
            threads,
            bytes,
            off_cpu: self.off_cpu_summary.take(),
            state_samples: self.state_samples,
            heap_vms: self.heap_vms,
            lua_frames: self.lua.frames_named_from_sites(),
            lua_memo: self.lua.frames_from_memos(),
            lua_site_proofs: self.proto_frees.summary(),
            not_embedded: self.embedder.queued(),
            dwarf_shed: self.dwarf_shed,
        })
    }
}

/// /proc/kallsyms, loading on a thread until first asked for (a failure said once).
pub(super) struct Kallsyms {
    loading: Option<std::thread::JoinHandle<Result<KallsymsTable, procfs::ProcError>>>,
    thread: crate::priority::Yielding,
    table: Option<KallsymsTable>,
}

impl Kallsyms {
    pub(super) fn load() -> Kallsyms {
        let thread = crate::priority::Yielding::default();
        let yielding = thread.clone();
        let loading = std::thread::spawn(move || {
            yielding.lower();
            KallsymsTable::load()
        });
        thread.spawned(&loading);
        Kallsyms {
            loading: Some(loading),
            thread,
            table: None,
        }
    }

    fn table(&mut self) -> Option<&KallsymsTable> {
        if let Some(loading) = self.loading.take() {
            self.thread.hurry();
            self.table = match loading.join() {
                Ok(Ok(table)) => Some(table),
                Ok(Err(e)) => {
                    eprintln!("lrec: warning: kernel frames stay unnamed: {e}");
                    None
                }
                Err(_) => {
                    eprintln!("lrec: warning: kernel frames stay unnamed");
                    None
                }
            };
        }
        self.table.as_ref()
    }
}

/// The flight recorder's dumps on SIGUSR1, a feature (its window is the capture's output,
/// recorder/output.rs; its last dump ends the recording).
pub(super) struct FlightDumps;

impl Feature for FlightDumps {
    fn on_dump(&mut self, rec: &mut Recording) -> Result<bool> {
        rec.dump("SIGUSR1")?;
        Ok(true)
    }
}
