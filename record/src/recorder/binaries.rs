//! The binaries a process maps: each one's build-id, and its unwind and symbol sections
//! handed to the embedding thread once per build-id, then written into the capture.

use std::io;

use anyhow::Result;
use lrec_inspect::elf;

use super::Recording;
use crate::embedder::{Embedded, Job};
use crate::lua::VmCode;
use crate::procfs::{self, MapsEntry};

impl Recording {
    /// The build-id of what a mapping maps. The vDSO has no file, so its bytes are copied
    /// now, while the process exists, and returned for embedding.
    pub(super) fn identify(
        &mut self,
        pid: u32,
        entry: &MapsEntry,
    ) -> (Option<Vec<u8>>, Option<io::Result<Vec<u8>>>) {
        if entry.path == "[vdso]" {
            let memory = procfs::read_memory(pid, entry.start, entry.end - entry.start);
            let id = memory.as_ref().ok().and_then(|m| elf::build_id(m));
            return (id, Some(memory));
        }
        if entry.file_path().is_none() {
            return (None, None);
        }
        let key = (
            entry.dev_major,
            entry.dev_minor,
            entry.inode,
            entry.path.clone(),
        );
        let id = self.build_ids.entry(key).or_insert_with(|| {
            procfs::read_mapped_head(pid, entry).and_then(|d| elf::build_id(&d))
        });
        (id.clone(), None)
    }

    /// Hands the binary behind an executable mapping to the embedding thread, once per
    /// build-id (or path). `memory` holds the bytes of a mapping without a file.
    pub(super) fn queue_embed(
        &mut self,
        pid: u32,
        entry: &MapsEntry,
        build_id: &Option<Vec<u8>>,
        memory: Option<io::Result<Vec<u8>>>,
    ) {
        if memory.is_none() && entry.file_path().is_none() {
            return;
        }
        let key = build_id
            .clone()
            .unwrap_or_else(|| entry.path.as_bytes().to_vec());
        if !self.embedded.insert(key) {
            return;
        }
        self.embedder.submit(Job {
            pid,
            entry: entry.clone(),
            build_id: build_id.clone(),
            memory,
            debug: self.debug,
            debug_dir: self.debug_dir.clone(),
            level: self.writer.level(),
        });
    }

    /// Writes the binaries the embedding thread has finished; with `wait`, all of them.
    pub(super) fn write_embedded(&mut self, wait: bool) -> Result<()> {
        let done: Vec<Embedded> = match wait {
            true => self.embedder.wait(crate::signals::stop_deadline_passed),
            false => self.embedder.finished(),
        };
        for e in done {
            self.dwarf_shed += u64::from(e.shed);
            if let Some(vm) = e.luajit {
                let code = VmCode {
                    start: vm.start,
                    end: vm.end,
                    cframe_size: vm.cframe_size,
                    ..VmCode::default()
                };
                self.note_vm(&e.key, &e.segments, code);
            }
            self.writer.write_encoded(e.chunk?)?;
        }
        Ok(())
    }
}
