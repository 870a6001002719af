//! Finding the Lua interpreters in the binaries a process maps, and telling the Lua
//! tracker where each one is mapped.

use lrec_inspect::lua::frees;
use lrec_inspect::lua::meet::Met;

use super::Recording;
use crate::learner::Job;
use crate::lua::VmCode;
use crate::procfs::{self, MapsEntry};

/// The Lua interpreter of a binary, or why the one it holds could not be located, and the
/// binary's segments (to place it in each mapping).
pub(super) struct BinaryVm {
    vm: Result<VmCode, String>,
    segments: Vec<lrec_format::Segment>,
}

impl Recording {
    /// Hands a newly mapped binary to the learning thread at once, rather than when the
    /// embedder is done with it: until it is met, its samples get no Lua frames. The file
    /// is opened here, while the process surely maps it.
    pub(super) fn find_vm(&mut self, pid: u32, entry: &MapsEntry, key: &[u8]) {
        if entry.file_path().is_none() || self.vm_checked.contains(key) {
            return;
        }
        let Ok(file) = procfs::open_mapped_file(pid, entry) else {
            return;
        };
        self.vm_checked.insert(key.to_vec());
        self.learner.submit(Job {
            key: key.to_vec(),
            path: entry.path.clone(),
            file,
            probe_path: procfs::is_mapped_path(entry),
        });
    }

    /// Takes in the binaries the learning thread has met: their VMs, layouts and proto
    /// free functions.
    pub(super) fn take_learned(&mut self) {
        for l in self.learner.finished() {
            let Some(met) = l.met else {
                continue;
            };
            if let (Some(why), false) = (met.stopped, met.has_lua()) {
                // A VM found says what was cut short in its own line; this binary was not
                // looked at in full for one.
                self.lua.messages.push(format!(
                    "{}: not looked at in full for a Lua VM ({why}); if it holds one, \
                     recording native stacks only",
                    l.path
                ));
            }
            self.note_met(&l.key, &l.path, l.probe_path, met);
        }
    }

    /// Notes what was learned of a binary (`key`, mapped from `path`): its LuaJIT VM and
    /// layout, else its PUC Lua VM (by its version string, then its luaV_execute) and
    /// layout, and where it frees its protos. A binary with a Lua VM that cannot be located
    /// is noted too, to say so.
    fn note_met(&mut self, key: &[u8], path: &str, probe_path: bool, met: Met) {
        let vm = if let Some(j) = met.luajit {
            self.lua.learned(path, j.learned);
            self.proto_frees
                .found(path, frees::Vm::LuaJit, probe_path, j.free);
            Some(Ok(VmCode {
                start: j.vm.start,
                end: j.vm.end,
                cframe_size: j.vm.cframe_size,
                ..VmCode::default()
            }))
        } else if let Some(p) = met.puc {
            let (minor, patch) = p.release;
            self.proto_frees
                .found(path, frees::Vm::Puc, probe_path, p.free);
            self.lua.learned_puc(path, p.learned);
            Some(
                p.execute
                    .map(|(start, end, found_by)| VmCode {
                        start,
                        end,
                        cframe_size: 0,
                        release: Some((minor, patch)),
                        found_by,
                    })
                    .map_err(|e| {
                        format!(
                            "found Lua 5.{minor}.{patch} in {path}, but not its interpreter \
                             loop (luaV_execute): {e}; recording native stacks only"
                        )
                    }),
            )
        } else {
            met.luajit_api
                .map(|why| Err(format!("{why}; recording native stacks only")))
        };
        if let Some(vm) = vm {
            self.add_binary_vm(key, met.segments, vm);
        }
    }

    /// Notes the LuaJIT interpreter of a binary the embedder read (`key`, mapped from
    /// `path`) that the learning thread could not open: its frames cannot be read without
    /// its layout, which is said.
    pub(super) fn note_vm(&mut self, key: &[u8], segments: &[lrec_format::Segment], vm: VmCode) {
        if self.vm_checked.insert(key.to_vec()) {
            self.add_binary_vm(key, segments.to_vec(), Ok(vm));
        }
    }

    fn add_binary_vm(
        &mut self,
        key: &[u8],
        segments: Vec<lrec_format::Segment>,
        vm: Result<VmCode, String>,
    ) {
        self.vms.insert(key.to_vec(), BinaryVm { vm, segments });
        self.place_vms();
    }

    /// Tells the Lua tracker where each known interpreter is mapped.
    pub(super) fn place_vms(&mut self) {
        let entries = self
            .procs
            .iter()
            .flat_map(|(&pid, p)| p.exec_entries.iter().map(move |e| (pid, e)));
        for (pid, (entry, key)) in entries {
            let Some(BinaryVm { vm, segments }) = self.vms.get(key) else {
                continue;
            };
            let vm = match vm {
                Ok(vm) => vm,
                Err(why) => {
                    self.lua.add_unlocated(pid, &entry.path, why);
                    continue;
                }
            };
            let avma = |svma: u64| -> Option<u64> {
                let seg = segments
                    .iter()
                    .find(|s| svma >= s.vaddr && svma < s.vaddr + s.memsz.max(1))?;
                let file_off = svma - seg.vaddr + seg.offset;
                let len = entry.end - entry.start;
                (file_off >= entry.offset && file_off < entry.offset + len)
                    .then(|| entry.start + file_off - entry.offset)
            };
            if let (Some(start), Some(last)) = (avma(vm.start), avma(vm.end - 1)) {
                let code = VmCode {
                    start,
                    end: last + 1,
                    ..*vm
                };
                self.lua.add_vm(pid, &entry.path, code);
            }
        }
    }
}
