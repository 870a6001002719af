//! The optional parts of a recording, the ones a command line asks for: thread states
//! (threads.rs), off-CPU time (off_cpu.rs), call latency (timing.rs), the flight
//! recorder's dumps (ending.rs) and Lua heap snapshots (heap.rs), each a [`Feature`]
//! (feature.rs). A new feature is a type implementing it and one line in [`wanted`].

use super::config::Config;
use super::ending::FlightDumps;
use super::feature::Feature;
use super::heap::HeapSnapshots;
use super::off_cpu::OffCpuTime;
use super::threads::States;
use super::timing::CallTiming;

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
