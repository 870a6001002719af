//! `--latency`, `--node-loop`, a feature: uprobes timing calls, attached as the mappings
//! that define the functions appear (recorder/maps.rs hands them to the tracker), and the
//! histograms written at the end.

use std::time::Duration;

use anyhow::Result;
use lrec_format::Record;

use super::feature::Feature;
use super::Recording;
use crate::sampler::Sampler;

pub(super) struct CallTiming {
    max_rate: u64,
    /// What was timed, once written.
    summary: Option<lrec_format::Latency>,
}

impl CallTiming {
    pub(super) fn new(max_rate: u64) -> CallTiming {
        CallTiming {
            max_rate,
            summary: None,
        }
    }
}

impl Feature for CallTiming {
    fn on_tick(&mut self, sampler: &mut Sampler, rec: &mut Recording) -> Result<()> {
        rec.time_calls(sampler, self.max_rate)
    }

    fn on_stop(&mut self, sampler: &mut Sampler, rec: &mut Recording) -> Result<()> {
        rec.time_calls(sampler, 0)
    }

    fn finish(&mut self, sampler: &mut Sampler, rec: &mut Recording) -> Result<()> {
        let Some(tracker) = rec.latency.as_mut() else {
            return Ok(());
        };
        let latency = tracker.finish(sampler, self.max_rate);
        rec.writer.push(&Record::Latency(latency.clone()))?;
        self.summary = Some(latency);
        Ok(())
    }

    fn print_summary(&self, elapsed: Duration) {
        if let Some(latency) = &self.summary {
            crate::latency::print_summary(latency, elapsed);
        }
    }
}

impl Recording {
    /// Attaches the uprobes that new mappings call for, stops timing what is called too
    /// often (`max_rate`, 0: no limit) and writes the calls timed with --latency-events.
    fn time_calls(&mut self, sampler: &mut Sampler, max_rate: u64) -> Result<()> {
        let Some(t) = &mut self.latency else {
            return Ok(());
        };
        // What the node loop's events end must be known before they fire.
        for (event, mark) in t.take_node_marks() {
            sampler.set_latency_mark(event, mark)?;
        }
        for a in std::mem::take(&mut t.attach) {
            if let Err(e) = sampler.attach_latency(a.role, &a.path, a.file_offset, a.pid) {
                t.messages.push(format!(
                    "warning: no uprobe at {:#x} of {} in process {}: {:#}",
                    a.file_offset,
                    a.path.display(),
                    a.pid,
                    anyhow::Error::from(e)
                ));
            }
        }
        t.limit(sampler, max_rate);
        for msg in t.messages.drain(..) {
            eprintln!("lrec: {msg}");
        }
        let mut failure = None;
        sampler.drain_latency_events(|call| {
            if failure.is_none() {
                failure = self.writer.push(&Record::LatencyCall(call)).err();
            }
        });
        failure.map_or(Ok(()), |e| Err(e.into()))
    }
}
