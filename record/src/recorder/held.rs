//! Samples held back while their Lua layout is being proved. BPF walks a process's Lua
//! frames from its first samples with the layout learned from its binary; until the
//! samples have proved it, the ones it walked are kept here, not written (the others are
//! written at once): once it is proved they are written with their Lua frames, and if it
//! is not, without them. So an attached VM's samples carry Lua frames from the first, and
//! none carries frames read with a layout that turned out wrong. Bounded: past
//! [`MAX_HELD_BYTES`] samples are written as they come (their Lua frames only if proved by
//! then); a proof takes a few samples, or gives up within its budget.

use anyhow::Result;
use lrec_format::{OffCpu, Record, Sample, OFF_CPU_LUA_YIELD};

use super::Recording;
use crate::raw::{LuaWalk, OffInterval};

/// The most bytes of samples held at once (~2,000 samples of 16 KiB stacks).
const MAX_HELD_BYTES: usize = 32 << 20;

/// A sample as it arrived, its walk's memo put in place.
pub(super) struct Held {
    sample: Sample,
    walk: Option<LuaWalk<'static>>,
    off_cpu: Option<OffInterval>,
}

#[derive(Default)]
pub(super) struct HeldSamples {
    queue: Vec<Held>,
    bytes: usize,
}

impl Recording {
    /// A sample that arrived, its walk observed ([`crate::lua::LuaVms::observe`]): held
    /// while its process's layout is proved, else written.
    pub(super) fn hold_or_write(
        &mut self,
        sample: Sample,
        walk: Option<LuaWalk>,
        off_cpu: Option<OffInterval>,
    ) -> Result<()> {
        let size = sample.user_stack.len() + std::mem::size_of::<Held>();
        if self.lua.holding(sample.pid, walk.as_ref()) && self.held.bytes + size <= MAX_HELD_BYTES {
            self.held.bytes += size;
            let walk = walk.map(|w| LuaWalk {
                header: w.header,
                frames: std::borrow::Cow::Owned(w.frames.into_owned()),
            });
            self.held.queue.push(Held {
                sample,
                walk,
                off_cpu,
            });
            return Ok(());
        }
        self.write_sample(sample, walk, off_cpu)
    }

    /// Writes the held samples of the processes whose layouts are decided now (`all`:
    /// every one, at the end), in the order they came.
    pub(super) fn release_held(&mut self, all: bool) -> Result<()> {
        if self.held.queue.is_empty() {
            return Ok(());
        }
        let queue = std::mem::take(&mut self.held.queue);
        self.held.bytes = 0;
        for h in queue {
            if !all && self.lua.holding(h.sample.pid, h.walk.as_ref()) {
                self.held.bytes += h.sample.user_stack.len() + std::mem::size_of::<Held>();
                self.held.queue.push(h);
            } else {
                self.write_sample(h.sample, h.walk, h.off_cpu)?;
            }
        }
        Ok(())
    }

    /// Writes a sample (or an off-CPU interval) and the Lua frames its walk holds, when
    /// its layout is proved.
    fn write_sample(
        &mut self,
        sample: Sample,
        walk: Option<LuaWalk>,
        off_cpu: Option<OffInterval>,
    ) -> Result<()> {
        let lua = walk.and_then(|w| self.lua.convert(&sample, w));
        for r in self.lua.take_records() {
            self.writer.push(&r)?;
        }
        if let Some(c) = lua {
            let frames = self.lua.frames_of(c.stack.tid);
            self.writer.push_lua_stack(&c.stack, frames, c.shared)?;
        }
        match off_cpu {
            None => {
                self.samples += 1;
                self.writer.push(&Record::Sample(sample))?;
            }
            Some(o) => {
                self.off_cpu += 1;
                self.lua_waits += u64::from(o.state == OFF_CPU_LUA_YIELD);
                self.writer.push(&Record::OffCpu(OffCpu {
                    start_ns: o.start_ns,
                    duration_ns: o.duration_ns,
                    state: o.state,
                    sample,
                }))?;
            }
        }
        Ok(())
    }
}
