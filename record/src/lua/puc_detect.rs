//! Proving a PUC Lua VM's layout on the live process before BPF walks with it: the layout
//! was learned from the binary (`lrec_inspect::lua::puc::learn`), and samples whose
//! registers hold a running state must read with it as the VM reads them
//! ([`puc_proof::proof`](super::puc_proof::proof)).

use std::sync::Arc;

use lrec_format::{Record, Sample};

use super::{file_name, luajit, puc_proof, runtime, Detection, LuaVms, ProcessVm, VmCode};
use crate::raw::RawPucConfig;

/// Samples whose running state must read as a PUC layout says before it is used, and
/// lrec's time per process for proving it.
const PUC_PROOFS: u32 = 3;
const PUC_BUDGET: std::time::Duration = std::time::Duration::from_millis(500);

impl LuaVms {
    /// A PUC Lua interpreter: its layout, learned from the binary, is proved on its first
    /// samples (or, when a process running the same binary proved it, used at once).
    pub(super) fn add_puc(&mut self, pid: u32, path: &str, code: VmCode, minor: u32, patch: u32) {
        if let Some(p) = self.puc.get_mut(&pid) {
            // One PUC Lua per process: the first found (BPF's walker reads one layout and
            // one luaV_execute per process).
            if p.path != path {
                p.others = true;
                let why = format!(
                    "found Lua 5.{minor}.{patch} in {path} too, but lrec reads one PUC Lua VM per \
                     process (here {}'s); recording native stacks only for this one",
                    file_name(&p.path)
                );
                self.add_unlocated(pid, path, &why);
            }
            return;
        }
        let proved = self.puc.values().find_map(|p| match &p.detection {
            Detection::Puc(l) if p.path == path => Some((**l).clone()),
            _ => None,
        });
        let learned = self.learned_puc.get(path).cloned();
        let detection = match (proved, &learned) {
            (Some(l), _) => Detection::Puc(Arc::new(l)),
            (None, Some(Ok(l))) if l.missing.is_empty() => Detection::PucPending {
                layout: Box::new(l.clone()),
                proofs: (0, 0),
                tries: 0,
            },
            _ => Detection::Failed,
        };
        let mut p = ProcessVm::new(pid, path, vec![code], detection);
        p.before = self.before(pid);
        let mut r = runtime(pid, &p, format!("Lua 5.{minor}.{patch}"));
        let why = match learned {
            Some(Ok(l)) if l.missing.is_empty() => None,
            Some(Ok(l)) => Some(format!(
                "nothing in the binary gives where its build keeps {} (learned: {})",
                l.missing.join(", "),
                l.summary()
            )),
            Some(Err(e)) => Some(e),
            None => Some("its binary could not be read to learn its layout".into()),
        };
        if let Detection::Puc(l) = &p.detection {
            r.layout = format!("{} (luaV_execute by {})", l.name, code.found_by);
            self.puc_configs.push((pid, RawPucConfig::new(l)));
            self.records.push(Record::LuaRuntime(r));
        } else if let Detection::PucPending { layout, .. } = &p.detection {
            // Walked with the layout being proved, its samples held until it is decided.
            self.puc_configs
                .push((pid, RawPucConfig::new(&layout.layout)));
        } else if let Some(why) = why.filter(|_| matches!(p.detection, Detection::Failed)) {
            let msg = format!(
                "pid {pid}: found Lua 5.{minor}.{patch} in {path}, but {why}; recording \
                 native stacks only"
            );
            r.error = Some(msg.clone());
            self.messages.push(msg);
            self.records.push(Record::LuaRuntime(r));
        }
        self.puc.insert(pid, p);
    }

    /// Weighs a sample of process `sample.pid` for or against its pending PUC layout.
    pub(super) fn vote_puc(&mut self, sample: &Sample) {
        let Some(p) = self.puc.get_mut(&sample.pid) else {
            return;
        };
        let Detection::PucPending {
            layout,
            proofs,
            tries,
        } = &mut p.detection
        else {
            return;
        };
        let Some(mem) = &p.mem else {
            return;
        };
        let begun = std::time::Instant::now();
        match puc_proof::proof(mem, &layout.layout, sample) {
            Some(true) => proofs.0 += 1,
            Some(false) => proofs.1 += 1,
            None => {}
        }
        let ip = sample.regs.ip;
        *tries += u32::from(p.code.iter().any(|c| ip >= c.start && ip < c.end));
        p.voting += begun.elapsed();
        let ((yes, no), tries) = (*proofs, *tries);
        let summary = layout.summary();
        let path = p.path.clone();
        let found_by = p.code.first().map_or("", |c| c.found_by);
        if yes >= PUC_PROOFS && yes >= 4 * no {
            let layout = layout.layout.clone();
            let pids: Vec<u32> = self
                .puc
                .iter()
                .filter(|(_, q)| {
                    q.path == path && matches!(q.detection, Detection::PucPending { .. })
                })
                .map(|(&pid, _)| pid)
                .collect();
            for pid in pids {
                let q = self.puc.get_mut(&pid).expect("listed above");
                q.detection = Detection::Puc(Arc::new(layout.clone()));
                let mut r = runtime(pid, q, layout.name.clone());
                r.vm = format!("Lua 5.{}", layout.minor());
                if let Some(c) = q.code.first().and_then(|c| c.release) {
                    r.vm = format!("Lua 5.{}.{}", c.0, c.1);
                }
                r.layout = format!("{summary} (luaV_execute by {found_by})");
                self.puc_configs.push((pid, RawPucConfig::new(&layout)));
                self.records.push(Record::LuaRuntime(r));
                self.joined(pid, true);
            }
        } else if tries >= luajit::TRIES_BEFORE_GIVING_UP || p.voting >= PUC_BUDGET {
            let what = match (yes, no) {
                (0, 0) => "no sample found a running state where the layout puts it".into(),
                _ => format!("{yes} samples read as it says, {no} did not"),
            };
            let why = format!(
                "the layout learned from it ({summary}) could not be proved on the running VM: \
                 {what}"
            );
            self.fail_puc(sample.pid, why);
        }
    }

    /// Gives up reading process `pid`'s PUC Lua VM (`why`), saying so once.
    pub(super) fn fail_puc(&mut self, pid: u32, why: String) {
        let Some(p) = self.puc.get_mut(&pid) else {
            return;
        };
        if matches!(p.detection, Detection::PucPending { .. }) {
            // It was walked with the layout being proved.
            self.removed.push((pid, true));
        }
        p.detection = Detection::Failed;
        let msg = format!(
            "pid {pid}: found a Lua interpreter in {}, but {why}; recording native stacks only",
            p.path
        );
        let mut r = runtime(pid, p, "Lua".into());
        r.error = Some(msg.clone());
        self.messages.push(msg);
        self.records.push(Record::LuaRuntime(r));
    }
}
