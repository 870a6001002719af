//! What an optional part of a recording does, at the same few moments of the recording
//! loop (recorder.rs): the [`Feature`] trait. CPU samples and their Lua frames are the loop
//! itself; the features the command line asks for are listed in features.rs.

use std::time::Duration;

use anyhow::Result;

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
