//! Proving a LuaJIT VM's layout on the live process before it is used: the layout was
//! learned from the binary (`lrec_inspect::lua::luajit::learn`), and samples in the VM
//! must confirm it ([`luajit::validates`]: G from DISPATCH leads to the current state and
//! back; [`luajit::proto_proof`]: the running function's prototype holds its PC and a
//! valid chunk name) before BPF walks with it. Also finds the VM's trace array when the
//! binary did not say where it is.

use lrec_format::{Record, Sample};

use super::luajit::{self, TRIES_BEFORE_GIVING_UP, VOTES_NEEDED};
use super::{luajit_runtime, Detection, LuaVms};
use crate::raw::LuaWalk;
use lrec_inspect::lua::luajit::Offsets;

/// lrec's time per process for proving a LuaJIT layout: past it, native stacks only.
const VOTING_BUDGET: std::time::Duration = std::time::Duration::from_millis(500);

/// Samples whose running prototype must read as one before a layout is used, and how
/// many times more they must be than those that do not.
const PROTOS_NEEDED: u32 = 2;

impl LuaVms {
    /// Looks for a LuaJIT VM's trace array, from a sample in a trace while it is
    /// [searching](super::TraceArray::searching): until it is found, samples in traces
    /// keep their trace's base frame.
    pub(super) fn find_traces(&mut self, pid: u32, layout: &Offsets, walk: &LuaWalk) {
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

    /// Weighs a sample of process `sample.pid` for or against its pending layout.
    pub(super) fn vote(&mut self, sample: &Sample) {
        let Some(p) = self.luajit.get_mut(&sample.pid) else {
            return;
        };
        let ip = sample.regs.ip;
        let in_vm = p.code.iter().any(|c| ip >= c.start && ip < c.end);
        let Detection::Pending {
            layout,
            votes,
            protos,
            tries,
        } = &mut p.detection
        else {
            return;
        };
        let Some(mem) = &p.mem else {
            return;
        };
        let o = &layout.layout.offsets;
        // Samples in the interpreter, and those that prove G (JIT-compiled code keeps
        // DISPATCH in r14 too, in GC64 builds), count against the budget of samples: a VM
        // that never runs while recording is not an unknown one.
        let begun = std::time::Instant::now();
        let g = luajit::vm_of(mem, o, sample, &p.code);
        *tries += u32::from(in_vm || g.is_some());
        if let Some(g) = g {
            *votes += 1;
            match luajit::proto_proof(mem, o, g, sample, &p.code) {
                Some(true) => protos.0 += 1,
                Some(false) => protos.1 += 1,
                None => {}
            }
        }
        p.voting += begun.elapsed();
        let (votes, (yes, no), tries) = (*votes, *protos, *tries);
        if votes >= VOTES_NEEDED && yes >= PROTOS_NEEDED && yes >= 4 * no {
            let path = p.path.clone();
            let layout = layout.clone();
            let same_binary: Vec<u32> = self
                .luajit
                .iter()
                .filter(|(_, q)| q.path == path && matches!(q.detection, Detection::Pending { .. }))
                .map(|(&pid, _)| pid)
                .collect();
            for pid in same_binary {
                self.ready(pid, layout.layout.clone());
            }
        // A layout whose prototypes all read right so far gets five times the samples:
        // a VM busy loading and collecting code gives few looks that decide.
        } else if tries >= TRIES_BEFORE_GIVING_UP * if no == 0 && yes > 0 { 5 } else { 1 }
            || p.voting >= VOTING_BUDGET
        {
            let what = match (votes, yes, no) {
                (0, ..) => "no sample found its global state where the layout puts it".into(),
                (_, 0, 0) => format!(
                    "{votes} samples found its global state, but none ran an interpreted Lua \
                     function whose prototype lrec could read to prove the rest (a VM that \
                     runs compiled code only)"
                ),
                _ => format!(
                    "{votes} samples found its global state, but its prototypes did not read \
                     as the layout says ({yes} did, {no} did not)"
                ),
            };
            let why = format!(
                "the layout learned from it ({}) could not be proved on the running VM: \
                 {what}",
                layout.summary()
            );
            self.fail(sample.pid, why);
        }
    }

    /// Gives up reading process `pid`'s LuaJIT VM (`why`), saying so once.
    pub(super) fn fail(&mut self, pid: u32, why: String) {
        let Some(p) = self.luajit.get_mut(&pid) else {
            return;
        };
        if matches!(p.detection, Detection::Pending { .. }) {
            // It was walked with the layout being proved.
            self.removed.push((pid, false));
        }
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
