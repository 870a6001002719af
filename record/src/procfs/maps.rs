//! /proc/PID/maps: its lines parsed into [`MapsEntry`]s.

use std::path::{Path, PathBuf};

use lrec_format::Mapping;

use super::{read_to_string, ProcError};

/// One line of /proc/PID/maps.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MapsEntry {
    pub start: u64,
    pub end: u64,
    /// `r-xp` and the like.
    pub perms: String,
    pub offset: u64,
    pub dev_major: u32,
    pub dev_minor: u32,
    pub inode: u64,
    /// As in the maps file: a file path (possibly ending in ` (deleted)`), `[vdso]`,
    /// `[stack]`, `[anon:name]`, or empty for anonymous memory.
    pub path: String,
}

const DELETED_SUFFIX: &str = " (deleted)";

impl MapsEntry {
    /// The mapped file's path without ` (deleted)`, if the mapping is backed by a file.
    pub fn file_path(&self) -> Option<&str> {
        if self.inode == 0 || !self.path.starts_with('/') {
            return None;
        }
        Some(self.path.strip_suffix(DELETED_SUFFIX).unwrap_or(&self.path))
    }

    /// Whether the mapped file has been deleted (or replaced) since it was mapped.
    pub fn is_deleted(&self) -> bool {
        self.file_path().is_some() && self.path.ends_with(DELETED_SUFFIX)
    }

    /// The capture record of this line, read at `time_ns` in process `pid`.
    pub fn to_mapping(&self, pid: u32, time_ns: u64, build_id: Option<Vec<u8>>) -> Mapping {
        Mapping {
            pid,
            time_ns,
            start: self.start,
            end: self.end,
            offset: self.offset,
            perms: self.perms.clone(),
            dev_major: self.dev_major,
            dev_minor: self.dev_minor,
            inode: self.inode,
            path: self.path.clone(),
            build_id,
        }
    }
}

/// Splits off the next space-separated field of `rest`.
fn next_field<'a>(rest: &mut &'a str) -> Option<&'a str> {
    let s = rest.trim_start_matches(' ');
    if s.is_empty() {
        return None;
    }
    let end = s.find(' ').unwrap_or(s.len());
    let (field, tail) = s.split_at(end);
    *rest = tail;
    Some(field)
}

/// Parses one maps line: `start-end perms offset major:minor inode [path]`.
pub fn parse_maps_line(line: &str) -> Option<MapsEntry> {
    let mut rest = line;
    let (start, end) = next_field(&mut rest)?.split_once('-')?;
    let perms = next_field(&mut rest)?;
    let offset = next_field(&mut rest)?;
    let (major, minor) = next_field(&mut rest)?.split_once(':')?;
    let inode = next_field(&mut rest)?;
    // The path is the rest of the line after the column padding; it may contain spaces.
    let path = rest.trim_start_matches(' ');
    Some(MapsEntry {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        perms: perms.to_owned(),
        offset: u64::from_str_radix(offset, 16).ok()?,
        dev_major: u32::from_str_radix(major, 16).ok()?,
        dev_minor: u32::from_str_radix(minor, 16).ok()?,
        inode: inode.parse().ok()?,
        path: path.to_owned(),
    })
}

/// Parses the text of a maps file; `path` only names it in errors.
pub fn parse_maps(path: &Path, text: &str) -> Result<Vec<MapsEntry>, ProcError> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.is_empty())
        .map(|(i, line)| {
            parse_maps_line(line).ok_or_else(|| ProcError::Parse {
                path: path.to_owned(),
                line: i + 1,
                text: line.to_owned(),
            })
        })
        .collect()
}

/// The memory mappings of process `pid`, in address order.
pub fn read_maps(pid: u32) -> Result<Vec<MapsEntry>, ProcError> {
    let path = PathBuf::from(format!("/proc/{pid}/maps"));
    parse_maps(&path, &read_to_string(pid, &path)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines() {
        let text = "\
55d0c0a00000-55d0c0a04000 r--p 00000000 fd:01 1835023                    /usr/bin/cat
7f1c2c000000-7f1c2c021000 rw-p 00000000 00:00 0 
7f1c2d5e3000-7f1c2d5e5000 r-xp 00002000 103:02 44  /tmp/dir with spaces/lib.so (deleted)
7ffd1e9f0000-7ffd1ea11000 rw-p 00000000 00:00 0                          [stack]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
";
        let maps = parse_maps(Path::new("maps"), text).unwrap();
        assert_eq!(maps.len(), 5);
        assert_eq!(
            maps[0],
            MapsEntry {
                start: 0x55d0c0a00000,
                end: 0x55d0c0a04000,
                perms: "r--p".into(),
                offset: 0,
                dev_major: 0xfd,
                dev_minor: 1,
                inode: 1835023,
                path: "/usr/bin/cat".into(),
            }
        );
        assert_eq!(maps[1].path, "");
        assert_eq!(maps[1].file_path(), None);
        assert_eq!(maps[2].dev_major, 0x103);
        assert_eq!(maps[2].offset, 0x2000);
        assert_eq!(maps[2].path, "/tmp/dir with spaces/lib.so (deleted)");
        assert_eq!(maps[2].file_path(), Some("/tmp/dir with spaces/lib.so"));
        assert!(maps[2].is_deleted() && !maps[1].is_deleted());
        assert_eq!(maps[3].path, "[stack]");
        assert_eq!(maps[3].file_path(), None);
        assert_eq!(maps[4].end, 0xffffffffff601000);

        let m = maps[0].to_mapping(7, 99, Some(vec![1, 2]));
        assert_eq!(
            (m.pid, m.time_ns, m.start, m.inode),
            (7, 99, 0x55d0c0a00000, 1835023)
        );
        assert_eq!(m.build_id, Some(vec![1, 2]));
        assert_eq!(m.path, "/usr/bin/cat");
    }

    #[test]
    fn maps_errors_name_file_and_line() {
        let err = parse_maps(Path::new("/proc/1/maps"), "0-1 r--p 0 0:0 0\ngarbage\n").unwrap_err();
        assert!(matches!(err, ProcError::Parse { line: 2, .. }), "{err}");
        assert!(err.to_string().contains("/proc/1/maps"));
        assert!(parse_maps(Path::new("m"), "").unwrap().is_empty());
    }
}
