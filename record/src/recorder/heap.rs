//! Lua heap snapshots (`--lua-heap`, and SIGUSR1 while it records): for each recorded
//! process that maps a Lua VM, its writable memory copied raw ([`crate::heap`]) with the
//! state and layout of each LuaJIT VM found in it ([`crate::lua::heap`]).

use anyhow::Result;
use lrec_format::{LuaHeap, LuaHeapCopy, LuaHeapMemory, Record, HEAP_PIECE};

use super::Recording;
use crate::heap::{copy_writable, Frozen};
use crate::lua::heap::{find_luajit, offsets, Regions};
use crate::output::human_bytes;
use crate::procfs;

impl Recording {
    /// Takes snapshot number `n` of every recorded process holding a Lua VM; `freeze`
    /// stops each process while its memory is copied. Returns the VMs found.
    pub(super) fn heap_snapshot(&mut self, n: u32, freeze: bool, max_bytes: u64) -> Result<u32> {
        let mut pids: Vec<u32> = self.procs.keys().copied().collect();
        pids.sort_unstable();
        let mut vms = 0;
        for pid in pids {
            let (luajit, puc) = self.lua.vms_of(pid);
            let Some(code) = luajit.map(<[_]>::to_vec) else {
                if let Some(path) = puc {
                    eprintln!(
                        "lrec: warning: process {pid} runs PUC Lua ({path}): its heap is not \
                         snapshotted (only LuaJIT's heap is, so far)"
                    );
                }
                continue;
            };
            let frozen = match freeze {
                true => Some(Frozen::new(pid)?),
                false => None,
            };
            let time_ns = procfs::monotonic_ns();
            let copy = match copy_writable(pid, max_bytes) {
                Ok(c) => c,
                Err(e) if !procfs::alive(pid) => {
                    eprintln!("lrec: process {pid} exited before its heap was copied ({e})");
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let stopped = frozen.as_ref().map(Frozen::stopped);
            drop(frozen);
            let found = find_luajit(&Regions(&copy.regions), &code);
            let mut errors = Vec::new();
            if found.is_empty() {
                errors.push(
                    "no LuaJIT VM state found in the copied memory (its layout is none lrec \
                     knows, or the VM lives in memory lrec does not copy)"
                        .to_string(),
                );
            }
            for vm in &found {
                self.writer.push(&Record::LuaHeap(LuaHeap {
                    pid,
                    snapshot: n,
                    vm: "LuaJIT 2.1".into(),
                    layout: vm.layout.name.into(),
                    g: vm.g,
                    offsets: offsets(vm),
                    time_ns,
                }))?;
            }
            for (start, data) in &copy.regions {
                for (i, piece) in data.chunks(HEAP_PIECE).enumerate() {
                    self.writer.push(&Record::LuaHeapMemory(LuaHeapMemory {
                        pid,
                        snapshot: n,
                        start: start + (i * HEAP_PIECE) as u64,
                        data: piece.to_vec(),
                    }))?;
                }
            }
            self.writer.push(&Record::LuaHeapCopy(LuaHeapCopy {
                pid,
                snapshot: n,
                frozen: stopped.is_some(),
                stopped_ns: stopped.map_or(0, |d| d.as_nanos() as u64),
                copy_ns: copy.took.as_nanos() as u64,
                bytes: copy.bytes,
                unreadable: copy.unreadable,
                skipped: copy.skipped,
                errors: errors.clone(),
            }))?;
            self.writer.flush()?;
            let how = match stopped {
                Some(d) => format!("process stopped {:.1} ms", d.as_secs_f64() * 1e3),
                None => "live, not stopped".to_string(),
            };
            eprintln!(
                "lrec: heap snapshot {n} of {pid}: {} LuaJIT VM(s), {} copied in {:.0} ms \
                 ({how}){}",
                found.len(),
                human_bytes(copy.bytes),
                copy.took.as_secs_f64() * 1e3,
                match copy.skipped {
                    0 => String::new(),
                    s => format!(", {} left out (--lua-heap-max)", human_bytes(s)),
                }
            );
            for e in errors {
                eprintln!("lrec: warning: process {pid}: {e}");
            }
            vms += found.len() as u32;
        }
        self.heap_vms += vms;
        Ok(vms)
    }
}
