//! How a recording ends: a capture's last records (binaries still being embedded, renamed
//! threads, kernel symbols, the end record), the flight recorder's dumps, and the
//! summaries lrec prints.

use std::io;
use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use lrec_format::{End, FormatError, KernelSymbols, Record, ThreadName};

use super::Recording;
use crate::kallsyms::KallsymsTable;
use crate::output::{human_bytes, Output};
use crate::procfs;

/// What a finished capture holds.
pub struct Summary {
    pub samples: u64,
    pub lost: u64,
    pub threads: usize,
    pub bytes: u64,
}

impl Summary {
    pub fn print(
        &self,
        elapsed: Duration,
        reason: &str,
        output: &Path,
        bpf_cost: Option<(u64, Duration)>,
    ) {
        eprintln!(
            "lrec: {} samples ({} lost) from {} threads in {:.1} s, {reason}\n\
             lrec: wrote {} ({}, {} B/sample)\n\
             lrec: next: lanalyze {} --flamegraph -o flame.svg",
            self.samples,
            self.lost,
            self.threads,
            elapsed.as_secs_f64(),
            output.display(),
            human_bytes(self.bytes),
            self.bytes.checked_div(self.samples).unwrap_or(0),
            output.display(),
        );
        if let Some((runs, time)) = bpf_cost {
            eprintln!(
                "lrec: BPF sampler: {runs} runs, {:.1} us per run (kernel.bpf_stats_enabled)",
                time.as_nanos() as f64 / runs as f64 / 1000.0
            );
        }
    }
}

impl Recording {
    pub(super) fn print_status(&mut self, elapsed: Duration) {
        let threads = self.procs.values().map(|p| p.threads.len()).sum::<usize>();
        let held = match self.writer.get_mut().flight() {
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
        let mut renamed = Vec::new();
        for (&pid, proc) in &mut self.procs {
            for (&tid, old) in &mut proc.threads {
                match procfs::thread_name(pid, tid) {
                    Some(name) if *old != name => {
                        old.clone_from(&name);
                        renamed.push(ThreadName { pid, tid, name });
                    }
                    _ => {}
                }
            }
        }
        for t in renamed {
            self.writer.push(&Record::ThreadName(t))?;
        }
        if self.kernel_addrs.is_empty() {
            return Ok(None);
        }
        let table = self.kallsyms.table();
        Ok(table.map(|t| t.covering(self.kernel_addrs.iter().copied())))
    }

    /// Flight recorder: writes the window out as the next numbered capture.
    pub(super) fn dump(&mut self, reason: &str) -> Result<()> {
        let syms = self.settle()?;
        self.flush()?;
        let extra: Vec<Record> = syms.into_iter().map(Record::KernelSymbols).collect();
        let flight = self
            .writer
            .get_mut()
            .flight()
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

    pub(super) fn print_flight_summary(&mut self, elapsed: Duration, reason: &str) {
        let (samples, lost) = (self.samples, self.lost);
        let threads = self.procs.values().map(|p| p.threads.len()).sum::<usize>();
        let flight = self.writer.get_mut().flight().expect("a flight");
        let (aged, aged_lost) = flight.aged();
        let (meta, ring) = flight.held_bytes();
        eprintln!(
            "lrec: {samples} samples ({lost} lost) from {threads} threads in {:.1} s, {reason}",
            elapsed.as_secs_f64()
        );
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
            eprintln!(
                "lrec: next: lanalyze {} --flamegraph -o flame.svg",
                d.path.display()
            );
        }
    }

    pub(super) fn finish(mut self, reason: &str) -> Result<Summary> {
        if let Some(syms) = self.settle()? {
            self.writer.push(&Record::KernelSymbols(syms))?;
        }
        self.writer.push(&Record::End(End {
            time_ns: procfs::monotonic_ns(),
            samples: self.samples,
            lost: self.lost,
            reason: reason.to_string(),
        }))?;
        let threads = self.procs.values().map(|p| p.threads.len()).sum::<usize>();
        let Output::File(mut out) = self.writer.finish()? else {
            unreachable!("a flight ends with a dump");
        };
        io::Write::flush(&mut out).map_err(FormatError::Io)?;
        let bytes = out.get_ref().metadata().map(|m| m.len()).unwrap_or(0);
        Ok(Summary {
            samples: self.samples,
            lost: self.lost,
            threads,
            bytes,
        })
    }
}

/// /proc/kallsyms: loading on a thread, then loaded (or not, said once).
pub(super) enum Kallsyms {
    Loading(std::thread::JoinHandle<Result<KallsymsTable, procfs::ProcError>>),
    Loaded(Option<KallsymsTable>),
}

impl Kallsyms {
    fn table(&mut self) -> Option<&KallsymsTable> {
        let old = std::mem::replace(self, Kallsyms::Loaded(None));
        *self = Kallsyms::Loaded(match old {
            Kallsyms::Loaded(t) => t,
            Kallsyms::Loading(thread) => match thread.join() {
                Ok(Ok(table)) => Some(table),
                Ok(Err(e)) => {
                    eprintln!("lrec: warning: kernel frames stay unnamed: {e}");
                    None
                }
                Err(_) => {
                    eprintln!("lrec: warning: kernel frames stay unnamed");
                    None
                }
            },
        });
        match self {
            Kallsyms::Loaded(t) => t.as_ref(),
            Kallsyms::Loading(_) => None,
        }
    }
}
