//! The BPF side of counting each process's freed Lua protos (ebpf/lua_frees.h): a uprobe on
//! the free function of each binary holding a VM, and the per-process count BPF keeps, which
//! proves the call sites the walkers remembered without reading their protos again.

use std::path::Path;

use aya::maps::HashMap as BpfHashMap;
use aya::programs::uprobe::{UProbeAttachPoint, UProbeScope};
use lrec_inspect::lua::frees::Vm;

use super::{Sampler, SamplerError};

/// `struct lua_frees_key`.
#[repr(C)]
#[derive(Clone, Copy)]
struct RawFreesKey {
    tgid: u32,
    vm: u32,
}

// SAFETY: two u32s, no padding.
unsafe impl aya::Pod for RawFreesKey {}

const MAP: &str = "lua_frees";

impl Sampler {
    /// Counts the protos freed by the `vm` VM of binary `path` from now on, in every
    /// process mapping it: a uprobe at `file_offset`, its proto free function. Until
    /// [`Sampler::count_frees`] adds a process, its frees are not counted.
    pub fn probe_proto_frees(
        &mut self,
        vm: Vm,
        path: &Path,
        file_offset: u64,
    ) -> Result<(), SamplerError> {
        let prog = match vm {
            Vm::LuaJit => "on_luajit_free",
            Vm::Puc => "on_puc_free",
        };
        let point = UProbeAttachPoint {
            location: file_offset.into(),
            cookie: None,
        };
        // Kept until the sampler is dropped: a count that stopped would prove sites wrongly.
        let _ = self
            .uprobe(prog)?
            .attach(point, path, UProbeScope::AllProcesses)
            .map_err(SamplerError::Program)?;
        Ok(())
    }

    /// How many times BPF's audits found a process's count wrong, per VM (`Vm as usize`;
    /// ebpf/lua_frees.h, lua_frees_wrong).
    pub fn proto_frees_wrong(&self) -> [u64; 2] {
        let name = "lua_frees_missed";
        let Some(map) = self.ebpf.map(name) else {
            return [0; 2];
        };
        let Ok(map) = aya::maps::Array::<_, u64>::try_from(map) else {
            return [0; 2];
        };
        [0, 1].map(|i| map.get(&i, 0).unwrap_or(0))
    }

    /// Starts (`counted`: the uprobe of the binary holding its VM is attached) or stops
    /// counting process `pid`'s freed protos. A count starts at the time now (ns), beyond
    /// any count of a process before it with this pid, whose remembered call sites so never
    /// match; a count started again proves none of the sites made before.
    pub fn count_frees(&mut self, pid: u32, vm: Vm, counted: bool) -> Result<(), SamplerError> {
        let map = self
            .ebpf
            .map_mut(MAP)
            .ok_or(SamplerError::MissingMap(MAP))?;
        let mut frees = BpfHashMap::<_, RawFreesKey, u64>::try_from(map)
            .map_err(|source| SamplerError::Map { name: MAP, source })?;
        let key = RawFreesKey {
            tgid: pid,
            vm: vm as u32,
        };
        if counted {
            frees
                .insert(key, crate::procfs::monotonic_ns(), 0)
                .map_err(|source| SamplerError::Map { name: MAP, source })
        } else {
            // Absent already, mostly.
            let _ = frees.remove(&key);
            Ok(())
        }
    }
}
