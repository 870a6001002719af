//! The optional parts of a recording, each a unit that the recording loop (recorder.rs)
//! calls at the same few moments: thread states (threads.rs), off-CPU time (off_cpu.rs),
//! call latency (timing.rs), the flight recorder's dumps (ending.rs) and Lua heap
//! snapshots (heap.rs). CPU samples and their Lua frames are the loop itself. A new
//! feature is a type implementing [`Feature`] and one line in [`wanted`].

use std::time::Duration;

use anyhow::Result;

use super::config::Config;
use super::ending::FlightDumps;
use super::heap::HeapSnapshots;
use super::off_cpu::OffCpuTime;
use super::threads::States;
use super::timing::CallTiming;
use super::Recording;
use crate::sampler::Sampler;

/// What a feature does at each moment of a recording; each hook does nothing unless the
/// feature says otherwise.
pub(super) trait Feature {
    /// The target runs and its processes are known; before the loop's first turn.
    fn on_start(&mut self, _rec: &mut Recording) -> Result<()> {
        Ok(())
    }

    /// How soon the loop must wake up for this feature.
    fn due_in(&self) -> Option<Duration> {
        None
    }

    /// First thing at each wake-up, before the samples are taken in.
    fn on_wake(&mut self, _sampler: &mut Sampler, _rec: &mut Recording) -> Result<()> {
        Ok(())
    }

    /// At each turn of the loop, after the samples.
    fn on_tick(&mut self, _sampler: &mut Sampler, _rec: &mut Recording) -> Result<()> {
        Ok(())
    }

    /// SIGUSR1: whether this feature acted on it.
    fn on_dump(&mut self, _rec: &mut Recording) -> Result<bool> {
        Ok(false)
    }

    /// Why the recording is complete with this feature's work alone, if it is.
    fn done(&self) -> Option<&'static str> {
        None
    }

    /// `-d` ran out; the last samples are still to be taken in.
    fn on_duration(&mut self, _rec: &mut Recording) -> Result<()> {
        Ok(())
    }

    /// Sampling stopped and the last samples were taken in; its probes are still there.
    fn on_stop(&mut self, _sampler: &mut Sampler, _rec: &mut Recording) -> Result<()> {
        Ok(())
    }

    /// A capture (not a flight recorder's window) is finished: what it kept is written.
    fn finish(&mut self, _sampler: &mut Sampler, _rec: &mut Recording) -> Result<()> {
        Ok(())
    }

    /// After lrec's summary: its own lines.
    fn print_summary(&self, _elapsed: Duration) {}
}

/// The features `cfg` asks for, in the order the loop calls them. `attached`: the target
/// was running before lrec (`-p`), not started by it.
pub(super) fn wanted(cfg: &Config, attached: bool) -> Vec<Box<dyn Feature>> {
    let mut all: Vec<Box<dyn Feature>> = Vec::new();
    if let Some(hz) = cfg.states_hz {
        all.push(Box::new(States::new(hz)));
    }
    if let Some(off_cpu) = &cfg.off_cpu {
        all.push(Box::new(OffCpuTime::new(off_cpu)));
    }
    if let Some(latency) = &cfg.latency {
        all.push(Box::new(CallTiming::new(latency.max_rate)));
    }
    if cfg.flight_secs.is_some() {
        all.push(Box::new(FlightDumps));
    }
    if let Some(heap) = &cfg.heap {
        let only = attached && cfg.duration.is_none();
        all.push(Box::new(HeapSnapshots::new(
            heap, attached, only, cfg.quiet,
        )));
    }
    all
}
