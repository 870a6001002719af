//! What the recorder knows of each recorded process's memory map: the mappings written
//! so far, re-read periodically and when a sample falls outside them.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::Result;
use lrec_format::Record;

use super::{Recording, MAPS_MISS_REFRESH};
use crate::procfs::{self, MapsEntry};

/// A mapping already written to the capture.
#[derive(Clone, PartialEq, Eq, Hash)]
struct MappingKey {
    start: u64,
    end: u64,
    offset: u64,
    inode: u64,
    perms: String,
    path: String,
}

/// What the recorder knows of one recorded process.
#[derive(Default)]
pub(super) struct Proc {
    /// Executable mappings of the last maps read, sorted, for the "sample outside known
    /// code" check.
    known: Vec<(u64, u64)>,
    /// The mappings of the last maps read (all written to the capture).
    written: HashSet<MappingKey>,
    /// Executable mappings of the last maps read, with their binary's key.
    pub(super) exec_entries: Vec<(MapsEntry, Vec<u8>)>,
    /// Thread names by tid, as last written.
    pub(super) threads: HashMap<u32, String>,
    last_maps_read: Option<Instant>,
}

impl Proc {
    fn is_known(&self, addr: u64) -> bool {
        let i = self.known.partition_point(|&(start, _)| start <= addr);
        i > 0 && addr < self.known[i - 1].1
    }

    fn maps_older_than(&self, age: Duration) -> bool {
        self.last_maps_read.is_none_or(|t| t.elapsed() >= age)
    }

    /// A sample at `ip` fell outside the known mappings, read long enough ago to be read
    /// again.
    pub(super) fn maps_miss(&self, ip: u64) -> bool {
        ip != 0 && !self.is_known(ip) && self.maps_older_than(MAPS_MISS_REFRESH)
    }
}

impl Recording {
    pub(super) fn refresh_maps_every(&mut self, period: Duration) -> Result<()> {
        let due: Vec<u32> = self
            .procs
            .iter()
            .filter(|(_, p)| p.maps_older_than(period))
            .map(|(&pid, _)| pid)
            .collect();
        for pid in due {
            self.refresh_maps(pid)?;
        }
        Ok(())
    }

    /// Re-reads the maps of every recorded process (the loader mapped libraries).
    pub(super) fn refresh_all_maps(&mut self) -> Result<()> {
        let pids: Vec<u32> = self.procs.keys().copied().collect();
        for pid in pids {
            self.refresh_maps(pid)?;
        }
        Ok(())
    }

    /// Writes the mappings that are new since the last read (also ones that came back
    /// after an unmap, e.g. a library dlopen'ed again at the same address), and queues the
    /// sections of binaries not embedded yet.
    pub(super) fn refresh_maps(&mut self, pid: u32) -> Result<()> {
        let mut proc = self.procs.remove(&pid).unwrap_or_default();
        let result = self.refresh_proc_maps(pid, &mut proc);
        self.procs.insert(pid, proc);
        result?;
        self.place_vms();
        Ok(())
    }

    fn refresh_proc_maps(&mut self, pid: u32, proc: &mut Proc) -> Result<()> {
        let first = proc.last_maps_read.is_none();
        proc.last_maps_read = Some(Instant::now());
        let entries = match procfs::read_maps(pid) {
            // An exited process has an empty map: keep what was known.
            Ok(e) if e.is_empty() => return Ok(()),
            Ok(e) => e,
            // The target may be exiting; samples already taken keep earlier mappings.
            // Only the first read of the first process must succeed.
            Err(_) if !first || !self.procs.is_empty() => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let now = procfs::monotonic_ns();
        let mut current = HashSet::with_capacity(entries.len());
        let mut executable = Vec::new();
        proc.exec_entries.clear();
        for entry in entries {
            let key = MappingKey {
                start: entry.start,
                end: entry.end,
                offset: entry.offset,
                inode: entry.inode,
                perms: entry.perms.clone(),
                path: entry.path.clone(),
            };
            if entry.perms.contains('x') {
                executable.push((entry.start, entry.end));
            }
            let new = !proc.written.contains(&key);
            // Executable files are identified on every read: they key the interpreters
            // found in binaries (a cached lookup; the vDSO has no file).
            let exec_file = entry.perms.contains('x') && entry.file_path().is_some();
            let (build_id, memory) = if new || exec_file {
                self.identify(pid, &entry)
            } else {
                (None, None)
            };
            if new {
                if entry.perms.contains('x') {
                    self.queue_embed(pid, &entry, &build_id, memory);
                }
                self.writer.push(&Record::Mapping(entry.to_mapping(
                    pid,
                    now,
                    build_id.clone(),
                )))?;
            }
            if entry.perms.contains('x') {
                let bkey = build_id.unwrap_or_else(|| entry.path.as_bytes().to_vec());
                self.find_vm(pid, &entry, &bkey);
                if let Some(t) = &mut self.latency {
                    t.on_mapping(pid, &entry, &bkey);
                }
                proc.exec_entries.push((entry, bkey));
            }
            current.insert(key);
        }
        // Forget what is gone, so that it is written again if it comes back.
        proc.written = current;
        executable.sort_unstable();
        proc.known = executable;
        Ok(())
    }
}
