//! Separate debug files, found where gdb, perf and Debian's `-dbg` packages put them: by
//! GNU build-id (`ROOT/.build-id/xx/rest.debug`), else by the binary's `.gnu_debuglink`
//! (next to the binary, in its `.debug/` directory, or under ROOT + the binary's
//! directory). The one lookup that lrec (`--debug-dir`) and lanalyze share; a file is
//! returned only when it is provably the binary's: same build-id, or, for binaries without
//! one, the CRC32 the debuglink names.

use std::fs::File;
use std::path::{Path, PathBuf};

/// A debug file found, mapped read-only.
pub struct DebugFile {
    pub path: PathBuf,
    pub data: memmap2::Mmap,
}

/// A build-id as the lowercase hex that paths and debuginfod URLs use.
pub fn build_id_hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// `ROOT/.build-id/xx/rest.debug` for a build-id of at least 2 bytes.
pub fn build_id_path(root: &Path, build_id: &[u8]) -> Option<PathBuf> {
    let hex = build_id_hex(build_id);
    (hex.len() >= 4).then(|| {
        root.join(".build-id")
            .join(&hex[..2])
            .join(format!("{}.debug", &hex[2..]))
    })
}

/// A `.gnu_debuglink` section: NUL-terminated file name, padding to 4 bytes, CRC32
/// (little-endian on x86_64). None for a name with a `/` (it would leave the directories
/// searched).
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

/// The `.gnu_debuglink` of a binary record, if it has a valid one.
pub fn debuglink(binary: &lrec_format::Binary) -> Option<(String, u32)> {
    parse_debuglink(&binary.section(".gnu_debuglink")?.data)
}

/// The separate debug file of the binary at `binary_path` with `build_id` (and its
/// debuglink, if it has one), under the debug root `root` (usually `/usr/lib/debug`).
pub fn find_debug_file(
    root: &Path,
    binary_path: &str,
    build_id: Option<&[u8]>,
    debuglink: Option<&(String, u32)>,
) -> Option<DebugFile> {
    if let Some(id) = build_id {
        if let Some(path) = build_id_path(root, id) {
            if let Some(data) = map_regular_file(&path) {
                if crate::elf::build_id(&data).as_deref() == Some(id) {
                    return Some(DebugFile { path, data });
                }
            }
        }
    }
    let (name, crc) = debuglink?;
    let dir = Path::new(binary_path).parent()?;
    let relative_dir = dir.strip_prefix("/").unwrap_or(dir);
    let candidates = [
        dir.join(name),
        dir.join(".debug").join(name),
        root.join(relative_dir).join(name),
    ];
    candidates.into_iter().find_map(|path| {
        if path == Path::new(binary_path) {
            return None;
        }
        let data = map_regular_file(&path)?;
        let matches = match build_id {
            Some(id) => crate::elf::build_id(&data).as_deref() == Some(id),
            None => crc32fast::hash(&data) == *crc,
        };
        matches.then_some(DebugFile { path, data })
    })
}

/// A regular file mapped read-only; None if it is missing, not regular or unreadable.
pub fn map_regular_file(path: &Path) -> Option<memmap2::Mmap> {
    let file = File::open(path).ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    // SAFETY: read-only map of a regular file. A file truncated under it would fault; debug
    // files and binaries are replaced (renamed over), not truncated, by package managers.
    unsafe { memmap2::Mmap::map(&file).ok() }
}

/// The dwz supplementary file a debug file shares types with (its `.gnu_debugaltlink`,
/// as Debian's `-dbg` packages have): mapped when it is there with the build-id named.
pub fn supplement(debug: &DebugFile) -> Option<memmap2::Mmap> {
    let (path, id) = crate::dwarf::alt_link(&debug.data)?;
    let path = match path.is_absolute() {
        true => path,
        false => debug.path.parent()?.join(path),
    };
    let data = map_regular_file(&path)?;
    (crate::elf::build_id(&data).as_deref() == Some(&id[..])).then_some(data)
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
    fn build_id_paths_split_the_first_byte() {
        let p = build_id_path(Path::new("/usr/lib/debug"), &[0xab, 0xcd, 0x01]).unwrap();
        assert_eq!(p, Path::new("/usr/lib/debug/.build-id/ab/cd01.debug"));
        assert_eq!(build_id_path(Path::new("/d"), &[0xab]), None);
    }

    #[test]
    fn finds_by_build_id_and_checks_it() {
        let dir = tempfile::tempdir().unwrap();
        let exe = std::env::current_exe().unwrap();
        let data = std::fs::read(&exe).unwrap();
        let id = crate::elf::build_id(&data).expect("test binaries have a build-id");
        let path = build_id_path(dir.path(), &id).unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::copy(&exe, &path).unwrap();
        let found = find_debug_file(dir.path(), "/bin/x", Some(&id), None);
        assert_eq!(found.map(|f| f.path), Some(path.clone()));
        // Another build's file at that path is not its debug file.
        let mut other = id.clone();
        other[0] ^= 1;
        std::fs::create_dir_all(build_id_path(dir.path(), &other).unwrap().parent().unwrap())
            .unwrap();
        std::fs::copy(&exe, build_id_path(dir.path(), &other).unwrap()).unwrap();
        assert!(find_debug_file(dir.path(), "/bin/x", Some(&other), None).is_none());
    }

    #[test]
    fn finds_by_debuglink_with_its_crc() {
        let dir = tempfile::tempdir().unwrap();
        let bin_dir = dir.path().join("bin");
        std::fs::create_dir_all(bin_dir.join(".debug")).unwrap();
        std::fs::write(bin_dir.join(".debug/x.debug"), b"debug bytes").unwrap();
        let binary = bin_dir.join("x");
        let binary = binary.to_str().unwrap();
        let crc = crc32fast::hash(b"debug bytes");
        let link = ("x.debug".to_owned(), crc);
        let found = find_debug_file(dir.path(), binary, None, Some(&link));
        assert_eq!(found.map(|f| f.path), Some(bin_dir.join(".debug/x.debug")));
        let wrong = ("x.debug".to_owned(), crc ^ 1);
        assert!(find_debug_file(dir.path(), binary, None, Some(&wrong)).is_none());
    }
}
