//! The only place besides the capture reader that touches files: finds local copies of
//! recorded binaries and their separate debug files (the lookup lrec's `--debug-dir`
//! shares, `lrec_inspect::debug_files`), asks debuginfod for what is still missing, and
//! reads their sections.
//!
//! A local file is used only when it is provably the recorded build: same GNU build-id, or,
//! for files without one, same size (binaries) or the debuglink CRC (debug files).

use std::path::{Path, PathBuf};

use lrec_format::Binary;
use lrec_inspect::debug_files::{self, map_regular_file};
use lrec_inspect::elf::{self, DebugInfo};

use crate::debuginfod::{Artifact, Debuginfod};
use crate::{BinaryLocator, Located, Source, Wanted};

/// Looks for binaries at their recorded paths and debug files under a debug root, then
/// asks the debuginfod servers of `DEBUGINFOD_URLS` for what is still missing.
pub struct LocalFiles {
    /// Usually `/usr/lib/debug`.
    pub debug_root: PathBuf,
    pub debuginfod: Option<Debuginfod>,
}

impl Default for LocalFiles {
    fn default() -> Self {
        LocalFiles {
            debug_root: PathBuf::from("/usr/lib/debug"),
            debuginfod: Debuginfod::from_env(),
        }
    }
}

impl BinaryLocator for LocalFiles {
    fn locate(&self, binary: &Binary, mapping_paths: &[&str], wanted: Wanted) -> Vec<Located> {
        let mut found = Vec::new();
        let mut own_file: Option<Binary> = None;
        if wanted.sections || wanted.debug_info {
            let mut paths: Vec<&str> = vec![binary.path.as_str()];
            paths.extend(mapping_paths.iter().copied());
            paths.dedup();
            own_file = paths
                .into_iter()
                .filter(|p| p.starts_with('/'))
                .filter_map(|p| read_elf(Path::new(p)))
                .find(|f| same_build(binary, f));
        }
        let own_has_dwarf = own_file.as_ref().is_some_and(has_debug_info);
        let debuglink = debuglink_of(binary, own_file.as_ref());
        let have_own = own_file.is_some();
        if let Some(file) = own_file {
            found.push(Located::new(file, Source::LocalBinary));
        }
        if wanted.sections && !have_own {
            found.extend(self.fetch(binary, Artifact::Executable));
        }
        if wanted.debug_info && !own_has_dwarf {
            let debug = debug_files::find_debug_file(
                &self.debug_root,
                &binary.path,
                binary.build_id.as_deref(),
                debuglink.as_ref(),
            );
            let debug = debug
                .map(|d| elf::binary_record(&d.path.to_string_lossy(), &d.data, DebugInfo::All));
            if let Some(file) = debug.filter(|f| f.error.is_none() && has_names(f)) {
                found.push(Located::new(file, Source::DebugFile));
            }
        }
        found
    }

    fn fetch_debug_info(&self, binary: &Binary) -> Option<Located> {
        self.fetch(binary, Artifact::DebugInfo)
            .filter(|l| has_names(&l.file))
    }
}

impl LocalFiles {
    /// `what` of `binary` from debuginfod, if a server is configured and has it.
    fn fetch(&self, binary: &Binary, what: Artifact) -> Option<Located> {
        let client = self.debuginfod.as_ref()?;
        let id = binary.build_id.as_deref()?;
        let label = crate::image::basename(&binary.path);
        let fetched = client.fetch(id, what, label)?;
        let file = elf::binary_record(
            &fetched.path.to_string_lossy(),
            &fetched.data,
            DebugInfo::All,
        );
        let source = match fetched.server {
            Some(server) => Source::Debuginfod(server),
            None => Source::DebuginfodCache,
        };
        file.error.is_none().then(|| Located::new(file, source))
    }
}

fn has_debug_info(f: &Binary) -> bool {
    f.data(".debug_info").is_some()
}

/// A debug file worth using: it names static functions.
fn has_names(f: &Binary) -> bool {
    crate::image::FULL_NAMES.iter().any(|n| f.data(n).is_some())
}

fn same_build(binary: &Binary, file: &Binary) -> bool {
    match (&binary.build_id, &file.build_id) {
        (Some(a), Some(b)) => a == b,
        (None, None) => {
            binary.file_size != 0
                && std::fs::metadata(&file.path).is_ok_and(|m| m.len() == binary.file_size)
        }
        _ => false,
    }
}

/// `.gnu_debuglink` of the capture's binary, else of the local file: (name, crc32).
fn debuglink_of(binary: &Binary, own: Option<&Binary>) -> Option<(String, u32)> {
    debug_files::debuglink(binary).or_else(|| debug_files::debuglink(own?))
}

/// Reads the segments and the unwind, symbol and debug sections of an ELF file, as lrec
/// would have embedded them; None if it is unreadable or not an x86_64 ELF file.
fn read_elf(path: &Path) -> Option<Binary> {
    let map = map_regular_file(path)?;
    let binary = elf::binary_record(&path.to_string_lossy(), &map, DebugInfo::All);
    binary.error.is_none().then_some(binary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_test_binary_and_matches_by_build_id() {
        let exe = std::env::current_exe().unwrap();
        let Some(file) = read_elf(&exe) else {
            panic!("cannot read {}", exe.display())
        };
        assert!(!file.segments.is_empty());
        assert!(file.sections.iter().any(|s| s.name == ".eh_frame"));
        let binary = Binary {
            build_id: file.build_id.clone(),
            path: file.path.clone(),
            file_size: std::fs::metadata(&exe).unwrap().len(),
            ..Binary::default()
        };
        assert!(same_build(&binary, &file));
        let other = Binary {
            build_id: Some(vec![1, 2, 3]),
            ..binary.clone()
        };
        assert!(!same_build(&other, &file) || file.build_id.is_none());
    }
}
