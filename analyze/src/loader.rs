//! The only place besides the capture reader that touches files: finds local copies of
//! recorded binaries and their separate debug files, and reads their sections.
//!
//! A local file is used only when it is provably the recorded build: same GNU build-id, or,
//! for files without one, same size (binaries) or the debuglink CRC (debug files).

use std::fs::File;
use std::path::{Path, PathBuf};

use lrec_format::elf::{self, DebugInfo};
use lrec_format::Binary;

use crate::{BinaryLocator, Wanted};

/// Looks for binaries at their recorded paths and debug files under a debug root.
#[derive(Debug, Clone)]
pub struct LocalFiles {
    /// Usually `/usr/lib/debug`.
    pub debug_root: PathBuf,
}

impl Default for LocalFiles {
    fn default() -> Self {
        LocalFiles {
            debug_root: PathBuf::from("/usr/lib/debug"),
        }
    }
}

impl BinaryLocator for LocalFiles {
    fn locate(&self, binary: &Binary, mapping_paths: &[&str], wanted: Wanted) -> Vec<Binary> {
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
        if let Some(f) = own_file {
            found.push(f);
        }
        if wanted.debug_info && !own_has_dwarf {
            if let Some(debug) = self.find_debug_file(binary, debuglink) {
                found.push(debug);
            }
        }
        found
    }
}

impl LocalFiles {
    fn find_debug_file(&self, binary: &Binary, link: Option<(String, u32)>) -> Option<Binary> {
        if let Some(id) = binary.build_id.as_deref().filter(|id| id.len() >= 2) {
            let hex = crate::image::build_id_hex(id);
            let path = self
                .debug_root
                .join(".build-id")
                .join(&hex[..2])
                .join(format!("{}.debug", &hex[2..]));
            if let Some(f) = read_elf(&path).filter(|f| same_build(binary, f)) {
                return Some(f);
            }
        }
        let (name, crc) = link?;
        let dir = Path::new(&binary.path).parent()?;
        let relative_dir = dir.strip_prefix("/").unwrap_or(dir);
        let candidates = [
            dir.join(&name),
            dir.join(".debug").join(&name),
            self.debug_root.join(relative_dir).join(&name),
        ];
        candidates.iter().find_map(|path| {
            let f = read_elf(path)?;
            let matches = match &binary.build_id {
                Some(_) => same_build(binary, &f),
                None => file_crc32(path) == Some(crc),
            };
            (matches && has_debug_info(&f)).then_some(f)
        })
    }
}

fn has_debug_info(f: &Binary) -> bool {
    f.section(".debug_info").is_some_and(|s| !s.data.is_empty())
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
    let data = binary
        .section(".gnu_debuglink")
        .map(|s| s.data.as_slice())
        .filter(|d| !d.is_empty())
        .or_else(|| own?.section(".gnu_debuglink").map(|s| s.data.as_slice()))?;
    parse_debuglink(data)
}

/// NUL-terminated file name, padding to 4 bytes, CRC32 (little-endian on x86_64).
pub fn parse_debuglink(data: &[u8]) -> Option<(String, u32)> {
    let end = data.iter().position(|&b| b == 0)?;
    let name = std::str::from_utf8(&data[..end]).ok()?;
    if name.is_empty() || name.contains('/') {
        return None;
    }
    let crc_at = (end + 1).div_ceil(4) * 4;
    let crc = u32::from_le_bytes(data.get(crc_at..crc_at + 4)?.try_into().ok()?);
    Some((name.to_owned(), crc))
}

fn file_crc32(path: &Path) -> Option<u32> {
    let file = File::open(path).ok()?;
    // SAFETY: read-only map; a file changing underneath can only fail the CRC.
    let map = unsafe { memmap2::Mmap::map(&file).ok()? };
    Some(crc32fast::hash(&map))
}

/// Reads the segments and the unwind, symbol and debug sections of an ELF file, as lrec
/// would have embedded them; None if it is unreadable or not an x86_64 ELF file.
fn read_elf(path: &Path) -> Option<Binary> {
    let file = File::open(path).ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    // SAFETY: read-only map of a regular file; sections are copied out before it is dropped.
    let map = unsafe { memmap2::Mmap::map(&file).ok()? };
    let binary = elf::binary_record(&path.to_string_lossy(), &map, DebugInfo::All);
    binary.error.is_none().then_some(binary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debuglink_parsing() {
        let mut data = b"ls.debug\0\0\0\0".to_vec();
        data.extend_from_slice(&0xdead_beef_u32.to_le_bytes());
        assert_eq!(
            parse_debuglink(&data),
            Some(("ls.debug".into(), 0xdead_beef))
        );
        let mut data = b"abc\0".to_vec();
        data.extend_from_slice(&7u32.to_le_bytes());
        assert_eq!(parse_debuglink(&data), Some(("abc".into(), 7)));
        assert_eq!(parse_debuglink(b"abc\0"), None);
        assert_eq!(parse_debuglink(b"../x\0\0\0\0\x01\0\0\0"), None);
    }

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
