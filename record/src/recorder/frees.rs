//! Counting each process's freed Lua protos (ebpf/lua_frees.h): a uprobe on the proto free
//! function of each binary holding a VM, found from the binary (lrec_inspect::lua::frees),
//! and each process running that VM counted once its binary's uprobe is attached. A call
//! site the walkers remembered is then proved by no proto freed since, not by a read of its
//! proto at every sample.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use lrec_inspect::lua::frees::{ProtoFree, Vm};

use super::Recording;
use crate::sampler::Sampler;

#[derive(Default)]
pub(super) struct ProtoFrees {
    /// Free functions found and not probed yet: (binary, VM, file offset).
    pending: Vec<(String, Vm, u64)>,
    /// Per binary and VM: where its frees are counted, or why they are not.
    binaries: HashMap<(String, Vm), Result<String, String>>,
    probed: HashSet<(String, Vm)>,
    /// Whether each process's frees are counted now.
    counted: HashMap<(u32, Vm), bool>,
    /// Counts BPF's audits found wrong, per VM (`Vm as usize`).
    wrong: [u64; 2],
}

impl ProtoFrees {
    /// Notes the proto free function of the `vm` VM in binary `path`, or why it has none
    /// lrec can count; `probe_path`: `path` names the mapped file where lrec attaches.
    pub(super) fn found(
        &mut self,
        path: &str,
        vm: Vm,
        probe_path: bool,
        free: Result<ProtoFree, String>,
    ) {
        let key = (path.to_string(), vm);
        if self.binaries.contains_key(&key) {
            // Called once per binary: another file of this path (in another mount
            // namespace). Which one a uprobe there counts is not known: neither is counted.
            self.pending.retain(|(p, v, _)| p != path || *v != vm);
            self.probed.remove(&key);
            let why = format!("two files are named {path}");
            self.binaries.insert(key, Err(why));
            return;
        }
        let free = free.and_then(|f| match probe_path {
            true => Ok(f),
            false => Err(format!(
                "{} found, but {path} is another file where lrec runs (a container's?)",
                vm.free_function()
            )),
        });
        let said = free.map(|f| {
            self.pending.push((path.to_string(), vm, f.file_offset));
            format!(
                "{} at {:#x}, found by {},",
                vm.free_function(),
                f.svma,
                f.found_by
            )
        });
        self.binaries.insert(key, said);
    }

    /// One line per binary: how the call sites of its VM's frames were proved.
    pub(super) fn summary(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .binaries
            .iter()
            .map(|((path, vm), said)| match said {
                Ok(at) if self.probed.contains(&(path.clone(), *vm)) => {
                    format!("in {path}: by no proto freed since (a uprobe on {at} counts them)")
                }
                Ok(at) => format!("in {path}: by a read of the proto (no uprobe on {at} attached)"),
                Err(why) => format!("in {path}: by a read of the proto ({why})"),
            })
            .collect();
        lines.sort();
        for (vm, name) in [(Vm::LuaJit, "LuaJIT"), (Vm::Puc, "PUC Lua")] {
            let n = self.wrong[vm as usize];
            if n > 0 {
                lines.push(format!(
                    "of {name}: the count of freed protos was found wrong by {n} audit{} (a \
                     proto replaced where none was counted freed): those processes' sites were \
                     proved by reads from then on",
                    if n == 1 { "" } else { "s" }
                ));
            }
        }
        lines
    }
}

impl Recording {
    /// Attaches the uprobes of the free functions found since the last call, then counts
    /// the frees of each process whose VM lives in a probed binary (and in no other), and
    /// stops counting a process that maps its VM from a second binary.
    pub(super) fn count_proto_frees(&mut self, sampler: &mut Sampler) {
        let f = &mut self.proto_frees;
        for (path, vm, offset) in std::mem::take(&mut f.pending) {
            match sampler.probe_proto_frees(vm, Path::new(&path), offset) {
                Ok(()) => {
                    f.probed.insert((path, vm));
                }
                Err(e) => {
                    let why = format!("no uprobe: {:#}", anyhow::Error::from(e));
                    f.binaries.insert((path, vm), Err(why));
                }
            }
        }
        f.wrong = sampler.proto_frees_wrong();
        for vm in [Vm::LuaJit, Vm::Puc] {
            for (pid, binary) in self.lua.vm_binaries(vm) {
                let counted = binary.is_some_and(|b| f.probed.contains(&(b.to_string(), vm)));
                if f.counted.get(&(pid, vm)) != Some(&counted) {
                    // A map that cannot take the entry (8192 processes counted) leaves the
                    // process uncounted, tried again at the next wake-up.
                    let done = sampler.count_frees(pid, vm, counted).is_ok();
                    f.counted.insert((pid, vm), counted && done);
                }
            }
        }
    }
}
