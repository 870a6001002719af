//! What lrec records of threads besides samples: their states (`--states`, a feature)
//! and their names when they change.

use std::time::{Duration, Instant};

use anyhow::Result;
use lrec_format::{Record, ThreadName, ThreadStates};

use super::feature::Feature;
use super::{Recording, YOUNG_THREAD};
use crate::procfs;
use crate::raw::RawThreadState;
use crate::sampler::Sampler;

/// When to read the thread states (`--states HZ`): a period on average, at random within
/// ±50 %. A fixed rate would lock onto periodic work (the target's timers, lrec's own
/// wake-ups) and see the same moment of it every time.
pub(super) struct States {
    every: Duration,
    next: Instant,
    /// xorshift state: randomness for timing, not for secrets.
    rng: u64,
}

impl States {
    pub(super) fn new(hz: u32) -> States {
        States {
            every: Duration::from_secs_f64(1.0 / f64::from(hz)),
            next: Instant::now(),
            rng: procfs::monotonic_ns() | 1,
        }
    }

    /// Whether a read is due now; if so, the next one is scheduled.
    fn due(&mut self) -> bool {
        let now = Instant::now();
        if now < self.next {
            return false;
        }
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let unit = (self.rng >> 11) as f64 / (1u64 << 53) as f64;
        self.next = now + self.every.mul_f64(0.5 + unit);
        true
    }
}

impl Feature for States {
    fn due_in(&self) -> Option<Duration> {
        Some(self.next.saturating_duration_since(Instant::now()))
    }

    /// Read first when lrec wakes: work done before the read, at lrec's priority, would
    /// keep a target thread woken on this CPU waiting, and the read would see it runnable.
    fn on_wake(&mut self, sampler: &mut Sampler, rec: &mut Recording) -> Result<()> {
        if self.due() {
            rec.on_states(&sampler.thread_states()?)?;
        }
        Ok(())
    }
}

impl Recording {
    /// One read of the thread-state iterator (`--states`).
    fn on_states(&mut self, bytes: &[u8]) -> Result<()> {
        let states = RawThreadState::decode_all(bytes)?;
        let Some(time_ns) = states.iter().map(|(t, _)| *t).min() else {
            return Ok(());
        };
        // Read once `-d` ran out, before the loop saw it: outside the recording's window.
        if self.deadline_ns.is_some_and(|d| time_ns > d) {
            return Ok(());
        }
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
