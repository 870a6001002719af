//! Telling a LuaJIT VM's layout from samples (each candidate of [`LAYOUTS`] validated
//! against the live process, [`luajit::validates`]), giving up on it when none does within
//! lrec's budget, and finding the VM's trace array once the layout is known.

use lrec_format::{Record, Sample};

use super::luajit::{self, Layout, LAYOUTS, TRIES_BEFORE_GIVING_UP, VOTES_NEEDED};
use super::{luajit_runtime, Detection, LuaVms};
use crate::raw::LuaWalk;

/// lrec's time per process for telling a LuaJIT layout: past it, native stacks only.
const VOTING_BUDGET: std::time::Duration = std::time::Duration::from_millis(500);

impl LuaVms {
    /// Looks for a LuaJIT VM's trace array, from a sample in a trace while it is
    /// [searching](TraceArray::searching): until it is found, samples in traces keep their
    /// trace's base frame.
    pub(super) fn find_traces(&mut self, pid: u32, layout: &Layout, walk: &LuaWalk) {
        let Some(p) = self.luajit.get_mut(&pid) else {
            return;
        };
        let Detection::Ready(_, traces) = &mut p.detection else {
            return;
        };
        traces.tries += 1;
        let traceno = walk.header.vmstate as u32;
        let found = p
            .mem
            .as_ref()
            .and_then(|m| luajit::find_trace_array(m, layout, walk.header.g, traceno));
        if let Some(off) = found {
            traces.offset = Some(off);
            self.configs.extend(p.config().map(|c| (pid, c)));
        } else if traces.tries == luajit::TRACE_TRIES {
            self.messages.push(format!(
                "pid {pid}: the LuaJIT VM's trace array was not found; samples in \
                 JIT-compiled code keep their trace's start frame, without inlined functions"
            ));
        }
    }

    pub(super) fn vote(&mut self, sample: &Sample) {
        let Some(p) = self.luajit.get_mut(&sample.pid) else {
            return;
        };
        let ip = sample.regs.ip;
        let in_vm = p.code.iter().any(|c| ip >= c.start && ip < c.end);
        let Detection::Pending { votes, tries } = &mut p.detection else {
            return;
        };
        let Some(mem) = &p.mem else {
            return;
        };
        // Only samples in the interpreter count against a layout: a VM that never runs
        // during the recording is not an unknown one.
        *tries += u32::from(in_vm);
        let begun = std::time::Instant::now();
        // DISPATCH in r14 (the interpreter, GC64 traces) tells a layout at the cost of a
        // few reads; the stack's C frames (GC32 traces, C code) are searched only when no
        // layout validates that way.
        let by_register: Vec<bool> = LAYOUTS
            .iter()
            .map(|l| luajit::validates(mem, l, sample.regs.r14, &p.code))
            .collect();
        let any = by_register.contains(&true);
        for (i, layout) in LAYOUTS.iter().enumerate() {
            if by_register[i] || (!any && luajit::on_stack(mem, layout, sample, &p.code)) {
                votes[i] += 1;
            }
        }
        p.voting += begun.elapsed();
        let best = (0..votes.len()).max_by_key(|&i| votes[i]).unwrap_or(0);
        let total: u32 = votes.iter().sum();
        // Unanimous, or (should a stray value ever validate another layout) a 95 % majority.
        let decided = (votes[best] >= VOTES_NEEDED && votes[best] == total)
            || (votes[best] >= 20 * VOTES_NEEDED && votes[best] * 20 >= total * 19);
        if decided {
            let path = p.path.clone();
            let same_binary: Vec<u32> = self
                .luajit
                .iter()
                .filter(|(_, q)| q.path == path && matches!(q.detection, Detection::Pending { .. }))
                .map(|(&pid, _)| pid)
                .collect();
            for pid in same_binary {
                self.ready(pid, best);
            }
        } else if *tries >= TRIES_BEFORE_GIVING_UP || p.voting >= VOTING_BUDGET {
            let why = match *tries >= TRIES_BEFORE_GIVING_UP {
                true => format!(
                    "its memory layout matches none of the known ones ({})",
                    LAYOUTS
                        .iter()
                        .map(|l| l.name)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                false => format!(
                    "no layout was told within lrec's budget ({} ms of reading its memory)",
                    VOTING_BUDGET.as_millis()
                ),
            };
            self.fail(sample.pid, why);
        }
    }
    /// Gives up telling process `pid`'s LuaJIT layout (`why`), saying so once.
    pub(super) fn fail(&mut self, pid: u32, why: String) {
        let Some(p) = self.luajit.get_mut(&pid) else {
            return;
        };
        p.detection = Detection::Failed;
        let mut r = luajit_runtime(pid, p, None);
        let msg = format!(
            "pid {pid}: found a LuaJIT interpreter in {}, but {why}; recording native stacks \
             only",
            p.path
        );
        r.error = Some(msg.clone());
        self.messages.push(msg);
        self.records.push(Record::LuaRuntime(r));
    }
}
