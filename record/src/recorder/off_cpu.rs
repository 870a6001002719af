//! `--off-cpu`, a feature: blocked intervals come with the samples (recorder.rs), Lua
//! coroutine waits are timed by uprobes on each LuaJIT binary found, and at the end what
//! was counted without stacks is written per thread.

use anyhow::Result;
use lrec_format::{OffCpuTotals, Record, ThreadOffCpuTotals};

use super::config::OffCpu;
use super::ending::OffCpuSummary;
use super::feature::Feature;
use super::Recording;
use crate::sampler::Sampler;

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
        let (short, stopped) = (sampler.lua_waits_short(), sampler.lua_waits_stopped());
        rec.off_cpu_totals(self.min_ns, threads, short, stopped)
    }
}

impl Recording {
    /// What `--off-cpu` counted without stacks, per thread.
    fn off_cpu_totals(
        &mut self,
        min_ns: u64,
        mut threads: Vec<ThreadOffCpuTotals>,
        lua_waits_short: (u64, u64),
        lua_waits_stopped: Option<f64>,
    ) -> Result<()> {
        threads.sort_by_key(|t| (t.pid, t.tid));
        let mut sum = OffCpuSummary {
            recorded: self.off_cpu - self.lua_waits,
            lua_waits: self.lua_waits,
            lua_waits_short,
            lua_waits_stopped,
            min_ns,
            ..OffCpuSummary::default()
        };
        for t in &threads {
            sum.counted.add(t);
        }
        self.off_cpu_summary = Some(sum);
        self.writer
            .push(&Record::OffCpuTotals(OffCpuTotals { min_ns, threads }))?;
        Ok(())
    }
}
