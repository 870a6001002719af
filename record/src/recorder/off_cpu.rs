//! `--off-cpu`, a feature: blocked intervals come with the samples (recorder.rs), Lua
//! coroutine waits are timed by uprobes on each LuaJIT binary found, and at the end what
//! was counted without stacks is written per thread, with the intervals the recording's
//! window cut (BPF counts only their part inside it: sampler/off_cpu.rs).

use anyhow::Result;
use lrec_format::{OffCpuTotals, Record, WindowCuts};

use super::config::OffCpu;
use super::ending::OffCpuSummary;
use super::feature::Feature;
use super::Recording;
use crate::sampler::{Sampler, ThreadOffCpu};

pub(super) struct OffCpuTime {
    min_ns: u64,
    lua_waits_max_rate: u64,
}

impl OffCpuTime {
    pub(super) fn new(cfg: &OffCpu) -> OffCpuTime {
        OffCpuTime {
            min_ns: cfg.min_ns,
            lua_waits_max_rate: cfg.lua_waits_max_rate,
        }
    }
}

impl Feature for OffCpuTime {
    fn on_tick(&mut self, sampler: &mut Sampler, rec: &mut Recording) -> Result<()> {
        if let Some(rate) = sampler.limit_lua_waits(self.lua_waits_max_rate) {
            eprintln!(
                "lrec: warning: Lua coroutines yield {rate:.0} times/s, above \
                 --lua-waits-max-rate {}: timing their waits costs the target too much \
                 (two uprobes per yield); stopped, later waits are not recorded",
                self.lua_waits_max_rate
            );
        }
        for path in rec.lua.take_luajit_binaries() {
            if let Err(e) = sampler.probe_lua_waits(path) {
                eprintln!("lrec: warning: Lua coroutine waits in {path} not recorded: {e}");
            }
        }
        Ok(())
    }

    fn finish(&mut self, sampler: &mut Sampler, rec: &mut Recording) -> Result<()> {
        let threads = sampler.off_cpu_totals()?;
        // The stacks of intervals that ended by the window's end, taken after the last
        // drain and before the flush counted what was left.
        super::drain(sampler, rec)?;
        let (short, stopped) = (sampler.lua_waits_short(), sampler.lua_waits_stopped());
        rec.off_cpu_totals(self.min_ns, threads, short, stopped)
    }
}

impl Recording {
    /// What `--off-cpu` counted without stacks, per thread, and the intervals the
    /// recording's window cut.
    fn off_cpu_totals(
        &mut self,
        min_ns: u64,
        mut counted: Vec<ThreadOffCpu>,
        lua_waits_short: (u64, u64),
        lua_waits_stopped: Option<f64>,
    ) -> Result<()> {
        counted.sort_by_key(|t| (t.totals.pid, t.totals.tid));
        let mut sum = OffCpuSummary {
            recorded: self.off_cpu - self.lua_waits,
            lua_waits: self.lua_waits,
            lua_waits_short,
            lua_waits_stopped,
            min_ns,
            ..OffCpuSummary::default()
        };
        let mut threads = Vec::with_capacity(counted.len());
        for t in &counted {
            sum.counted.add(&t.totals);
            sum.cut.0 += t.cut_at_start;
            sum.cut.1 += t.cut_at_end;
            if t.cut_at_start + t.cut_at_end > 0 {
                self.window.threads.push(WindowCuts {
                    pid: t.totals.pid,
                    tid: t.totals.tid,
                    at_start: t.cut_at_start,
                    at_end: t.cut_at_end,
                });
            }
            // A thread BPF listed for its cuts alone counted nothing without a stack.
            let c = &t.totals;
            if c.short_count + c.runnable_count + c.unpaired_count > 0 {
                threads.push(t.totals);
            }
        }
        self.off_cpu_summary = Some(sum);
        self.writer
            .push(&Record::OffCpuTotals(OffCpuTotals { min_ns, threads }))?;
        Ok(())
    }
}
