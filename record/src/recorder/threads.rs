//! What lrec records of threads besides samples: their states (`--states`), their
//! off-CPU time counted without stacks (`--off-cpu`), and their names when they change.

use anyhow::Result;
use lrec_format::{OffCpuTotals, Record, ThreadName, ThreadOffCpuTotals, ThreadStates};

use super::ending::OffCpuSummary;
use super::{Recording, YOUNG_THREAD};
use crate::procfs;
use crate::raw::{RawThreadState, RawThreadTotals};

/// A small xorshift generator: randomness for timing, not for secrets.
pub(super) struct Jitter(u64);

impl Jitter {
    pub(super) fn seeded() -> Jitter {
        Jitter(procfs::monotonic_ns() | 1)
    }

    /// Uniform in [0, 1).
    pub(super) fn next_unit(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

impl Recording {
    /// One read of the thread-state iterator (`--states`).
    pub(super) fn on_states(&mut self, bytes: &[u8]) -> Result<()> {
        let states = RawThreadState::decode_all(bytes)?;
        let Some(time_ns) = states.iter().map(|(t, _)| *t).min() else {
            return Ok(());
        };
        for (_, t) in &states {
            self.note_sampled(t.pid, t.tid, 0)?;
            self.kernel_addrs.extend(&t.kernel_stack);
        }
        self.state_samples += 1;
        let threads = states.into_iter().map(|(_, t)| t).collect();
        self.writer
            .push(&Record::ThreadStates(ThreadStates { time_ns, threads }))?;
        Ok(())
    }

    /// What `--off-cpu` counted without stacks, per thread.
    pub(super) fn off_cpu_totals(
        &mut self,
        min_ns: u64,
        totals: Vec<(u32, RawThreadTotals)>,
    ) -> Result<()> {
        let mut threads: Vec<ThreadOffCpuTotals> = totals
            .into_iter()
            .map(|(tid, t)| ThreadOffCpuTotals {
                pid: t.pid,
                tid,
                short_count: t.short_count,
                short_ns: t.short_ns,
                runnable_count: t.runnable_count,
                runnable_ns: t.runnable_ns,
                unpaired_count: t.unpaired_count,
                unpaired_ns: t.unpaired_ns,
            })
            .collect();
        threads.sort_by_key(|t| (t.pid, t.tid));
        let mut sum = OffCpuSummary {
            recorded: self.off_cpu,
            min_ns,
            ..OffCpuSummary::default()
        };
        let c = &mut sum.counted;
        for t in &threads {
            c.short_count += t.short_count;
            c.short_ns += t.short_ns;
            c.runnable_count += t.runnable_count;
            c.runnable_ns += t.runnable_ns;
            c.unpaired_count += t.unpaired_count;
            c.unpaired_ns += t.unpaired_ns;
        }
        self.off_cpu_summary = Some(sum);
        self.writer
            .push(&Record::OffCpuTotals(OffCpuTotals { min_ns, threads }))?;
        Ok(())
    }

    /// Threads rename themselves right after they start (prctl, as thread pools do),
    /// often after lrec first read their name: threads seen in the last second are read
    /// again, and a new name is recorded (the latest one counts).
    pub(super) fn rename_young_threads(&mut self) -> Result<()> {
        self.young
            .retain(|(_, _, seen)| seen.elapsed() < YOUNG_THREAD);
        let mut renamed = Vec::new();
        for &(pid, tid, _) in &self.young {
            let Some(name) = self
                .procs
                .get_mut(&pid)
                .and_then(|p| p.threads.get_mut(&tid))
            else {
                continue;
            };
            if let Some(now) = procfs::thread_name(pid, tid).filter(|n| !n.is_empty() && n != name)
            {
                name.clone_from(&now);
                renamed.push(ThreadName {
                    pid,
                    tid,
                    name: now,
                });
            }
        }
        for r in renamed {
            self.writer.push(&Record::ThreadName(r))?;
        }
        Ok(())
    }
}
