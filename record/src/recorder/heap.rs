//! Lua heap snapshots (`--lua-heap`, and SIGUSR1 while it records): for each recorded
//! process that maps a Lua VM, its writable memory copied raw ([`crate::heap`]) with the
//! state and layout of each Lua VM found in it ([`crate::lua::heap`]): LuaJIT's, and PUC
//! Lua 5.1–5.5's.

use anyhow::Result;
use lrec_format::{LuaHeap, LuaHeapCopy, LuaHeapMemory, Record, HEAP_PIECE};

use super::config::Heap;
use super::feature::Feature;
use super::Recording;
use crate::capture_file::human_bytes;
use crate::heap::{copy_writable, Frozen, HeapCopy};
use crate::lua::heap::{find_luajit, find_puc, offsets, Regions};
use crate::lua::VmCode;
use crate::procfs;
use lrec_inspect::lua::luajit::Layout as LuajitLayout;
use lrec_inspect::lua::puc::Layout as PucLayout;

/// The Lua VMs a process maps, to look for in its copied memory.
struct Mapped {
    /// LuaJIT: the interpreter's code, and its layout (proved, or learned and checked on
    /// the copy), or why it has none.
    luajit: Option<(Vec<VmCode>, Result<LuajitLayout, String>)>,
    /// PUC Lua: the binary, and its layout.
    puc: Option<(String, PucLayout)>,
}

/// `--lua-heap`, a feature: a snapshot when the recording starts (a running target's),
/// at each SIGUSR1, and when `-d` runs out (a command lrec started).
pub(super) struct HeapSnapshots {
    cfg: Heap,
    quiet: bool,
    /// The target ran before lrec: snapshot it at once.
    attached: bool,
    /// The snapshot is all that was asked (no `-d`).
    only: bool,
    taken: u32,
}

impl HeapSnapshots {
    pub(super) fn new(cfg: &Heap, attached: bool, only: bool, quiet: bool) -> HeapSnapshots {
        HeapSnapshots {
            cfg: *cfg,
            quiet,
            attached,
            only,
            taken: 0,
        }
    }

    fn take(&mut self, rec: &mut Recording) -> Result<u32> {
        let vms = rec.heap_snapshot(self.taken, &self.cfg, self.quiet)?;
        self.taken += 1;
        Ok(vms)
    }
}

impl Feature for HeapSnapshots {
    fn on_start(&mut self, rec: &mut Recording) -> Result<()> {
        if self.attached && self.take(rec)? == 0 && self.only {
            eprintln!("lrec: warning: no Lua VM found in the target: the snapshot holds none");
        }
        Ok(())
    }

    fn on_dump(&mut self, rec: &mut Recording) -> Result<bool> {
        self.take(rec)?;
        Ok(true)
    }

    fn done(&self) -> Option<&'static str> {
        self.only.then_some("heap snapshot taken")
    }

    fn on_duration(&mut self, rec: &mut Recording) -> Result<()> {
        if !self.attached {
            self.take(rec)?;
        }
        Ok(())
    }
}

impl Recording {
    /// Takes snapshot number `n` of every recorded process holding a Lua VM (`--freeze`:
    /// each process stopped while its memory is copied). Returns the VMs found.
    fn heap_snapshot(&mut self, n: u32, cfg: &Heap, quiet: bool) -> Result<u32> {
        let mut pids: Vec<u32> = self.procs.keys().copied().collect();
        pids.sort_unstable();
        let mut vms = 0;
        for pid in pids {
            let mapped = Mapped {
                luajit: self.lua.luajit_heap_layout(pid),
                puc: self.lua.puc_layout(pid),
            };
            if mapped.luajit.is_some() || mapped.puc.is_some() {
                vms += self.snapshot_process(pid, n, &mapped, cfg, quiet)?;
            }
        }
        self.heap_vms += vms;
        Ok(vms)
    }

    /// One process's snapshot: its memory copied and written with the VMs found in it.
    fn snapshot_process(
        &mut self,
        pid: u32,
        n: u32,
        mapped: &Mapped,
        cfg: &Heap,
        quiet: bool,
    ) -> Result<u32> {
        let frozen = match cfg.freeze {
            true => Some(Frozen::new(pid)?),
            false => None,
        };
        let time_ns = procfs::monotonic_ns();
        let copy = match copy_writable(pid, cfg.max_bytes) {
            Ok(c) => c,
            Err(e) if !procfs::alive(pid) => {
                eprintln!("lrec: process {pid} exited before its heap was copied ({e})");
                return Ok(0);
            }
            Err(e) => return Err(e.into()),
        };
        let stopped = frozen.as_ref().map(Frozen::stopped);
        drop(frozen);
        let (found, errors) = find_vms(&copy, mapped);
        for (g, vm, layout, offsets) in &found {
            self.writer.push(&Record::LuaHeap(LuaHeap {
                pid,
                snapshot: n,
                vm: vm.clone(),
                layout: layout.clone(),
                g: *g,
                offsets: offsets.clone(),
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
        if !quiet {
            let how = match stopped {
                Some(d) => format!("process stopped {:.1} ms", d.as_secs_f64() * 1e3),
                None => "live, not stopped".to_string(),
            };
            let kinds: Vec<&str> = found.iter().map(|(_, vm, _, _)| vm.as_str()).collect();
            let skipped = match copy.skipped {
                0 => String::new(),
                s => format!(", {} left out (--lua-heap-max)", human_bytes(s)),
            };
            eprintln!(
                "lrec: heap snapshot {n} of {pid}: {} Lua VM(s) ({}), {} copied in {:.0} ms \
                 ({how}){skipped}",
                found.len(),
                kinds.join(", "),
                human_bytes(copy.bytes),
                copy.took.as_secs_f64() * 1e3,
            );
        }
        for e in errors {
            eprintln!("lrec: warning: process {pid}: {e}");
        }
        Ok(found.len() as u32)
    }
}

/// A VM found: its global_State, kind (`LuaJIT 2.1`, `Lua 5.4`), layout and the offsets
/// the heap walker needs.
type FoundVm = (u64, String, String, Vec<(String, u32)>);

/// The VMs of `mapped` in a process's copied memory, and why any could not be found.
fn find_vms(copy: &HeapCopy, mapped: &Mapped) -> (Vec<FoundVm>, Vec<String>) {
    let mem = Regions(&copy.regions);
    let (mut found, mut errors) = (Vec::new(), Vec::new());
    match &mapped.luajit {
        Some((_, Err(why))) => errors.push(format!("the LuaJIT VM cannot be read: {why}")),
        Some((code, Ok(layout))) => {
            let vms = find_luajit(&mem, code, &layout.offsets);
            if vms.is_empty() {
                errors.push(format!(
                    "no LuaJIT VM state found in the copied memory with its layout ({}), \
                     or the VM lives in memory lrec does not copy",
                    layout.name
                ));
            }
            for vm in vms {
                let offsets = offsets(&layout.offsets, &vm);
                found.push((vm.g, "LuaJIT 2.1".into(), layout.name.clone(), offsets));
            }
        }
        None => {}
    }
    if let Some((path, layout)) = &mapped.puc {
        let minor = layout.minor();
        let gs = find_puc(&mem, layout);
        if gs.is_empty() {
            errors.push(format!(
                "no Lua 5.{minor} state found in the copied memory with its layout ({}; {path})",
                layout.name
            ));
        }
        for g in gs {
            let named = layout.offsets.named();
            found.push((g, format!("Lua 5.{minor}"), layout.name.clone(), named));
        }
    }
    (found, errors)
}
