//! Everything lrec reads from /proc, plus the few clock and host queries the header needs.
//!
//! Text parsing is kept in pure functions (`parse_maps`, `parse_stat_ppid`, …) so that it is
//! tested on captured text; the `read_*` functions only add the file access.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use lrec_format::Process;
use thiserror::Error;

mod maps;
pub use maps::{read_maps, MapsEntry};

/// A failed read of /proc.
#[derive(Debug, Error)]
pub enum ProcError {
    /// /proc/PID does not exist (any more).
    #[error("no such process {pid}")]
    NoSuchProcess { pid: u32 },
    #[error("cannot read {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: cannot parse line {line}: {text:?}", path.display())]
    Parse {
        path: PathBuf,
        line: usize,
        text: String,
    },
    #[error(
        "{}: all kernel symbol addresses are zero: kernel.kptr_restrict hides them \
         (run as root, or `sysctl kernel.kptr_restrict=0`)",
        path.display()
    )]
    KernelSymbolsHidden { path: PathBuf },
}

/// Turns an I/O error on a file below /proc/PID into [`ProcError`], reporting a vanished
/// process as [`ProcError::NoSuchProcess`] rather than as a missing file.
fn proc_error(pid: u32, path: &Path, source: io::Error) -> ProcError {
    if vanished(&source) && !Path::new(&format!("/proc/{pid}")).exists() {
        ProcError::NoSuchProcess { pid }
    } else {
        ProcError::Io {
            path: path.to_owned(),
            source,
        }
    }
}

/// An error of a file below /proc/PID whose process (or that part of it) is gone.
fn vanished(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH)
}

fn read_to_string(pid: u32, path: &Path) -> Result<String, ProcError> {
    fs::read_to_string(path).map_err(|e| proc_error(pid, path, e))
}

fn read_link(pid: u32, path: &Path) -> Result<String, ProcError> {
    fs::read_link(path)
        .map(|p| p.to_string_lossy().into_owned())
        .map_err(|e| proc_error(pid, path, e))
}

// ---------------------------------------------------------------------------------------
// Process and threads

/// The parent pid from the text of /proc/PID/stat. The command name (field 2) may contain
/// spaces and parentheses, so the fields are read after its last `)`.
pub fn parse_stat_ppid(stat: &str) -> Option<u32> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_comm.split_ascii_whitespace();
    let _state = fields.next()?;
    fields.next()?.parse().ok()
}

/// The inode of a namespace link: `mnt:[4026531841]` → 4026531841.
pub fn parse_namespace_link(link: &str) -> Option<u64> {
    let (_, rest) = link.split_once(':')?;
    rest.strip_prefix('[')?.strip_suffix(']')?.parse().ok()
}

/// Splits /proc/PID/cmdline into its NUL-terminated arguments.
pub fn parse_cmdline(raw: &[u8]) -> Vec<String> {
    let raw = raw.strip_suffix(b"\0").unwrap_or(raw);
    if raw.is_empty() {
        return Vec::new();
    }
    raw.split(|&b| b == 0)
        .map(|arg| String::from_utf8_lossy(arg).into_owned())
        .collect()
}

/// A /proc file kept open and read again from its start at each look: a look costs one
/// read, not a path walk, an open and a close. (lrec looks at two such files at each
/// wake-up; opening them each time took a fifth of its CPU while recording.) The file
/// stays the one opened: a process's file is not another's that reuses its pid.
pub struct Reread {
    file: Option<File>,
    text: Vec<u8>,
}

impl Reread {
    pub fn open(path: &str) -> Reread {
        Reread {
            file: File::open(path).ok(),
            text: Vec::new(),
        }
    }

    /// The file's text now; None when it cannot be read (its process is gone).
    pub fn read(&mut self) -> Option<&str> {
        use std::os::unix::fs::FileExt;
        let file = self.file.as_ref()?;
        self.text.resize(4096, 0);
        let mut len = 0;
        loop {
            if len == self.text.len() {
                self.text.resize(2 * len, 0);
            }
            match file.read_at(&mut self.text[len..], len as u64) {
                Ok(0) => break,
                Ok(n) => len += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        }
        self.text.truncate(len);
        std::str::from_utf8(&self.text)
            .ok()
            .filter(|t| !t.is_empty())
    }
}

/// The calling thread's time on the run queue, waiting for a CPU, from its
/// /proc/thread-self/schedstat (opened on that thread): ns, 0 when unknown (it needs
/// CONFIG_SCHED_INFO).
pub fn runqueue_wait_ns(schedstat: &mut Reread) -> u64 {
    schedstat
        .read()
        .and_then(|s| s.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// A file mapped read-only: only the pages read are loaded, so reading the few sections of
/// a big library costs neither its size in memory nor the time to read it all.
pub fn map_file(file: &File) -> io::Result<memmap2::Mmap> {
    // SAFETY: the mapping is only read. A file truncated under it (a binary the target
    // runs is not) would fault, as it would in the target.
    unsafe { memmap2::Mmap::map(file) }
}

/// The processes descending from `roots`, from the parent links in /proc/*/stat.
pub fn descendants(roots: &[u32]) -> Vec<u32> {
    let mut parent: Vec<(u32, u32)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            if let Some(ppid) = parse_stat_ppid(&stat) {
                parent.push((pid, ppid));
            }
        }
    }
    let mut found: Vec<u32> = Vec::new();
    let mut frontier: Vec<u32> = roots.to_vec();
    while let Some(p) = frontier.pop() {
        for &(child, _) in parent.iter().filter(|&&(c, pp)| pp == p && c != p) {
            if !roots.contains(&child) && !found.contains(&child) {
                found.push(child);
                frontier.push(child);
            }
        }
    }
    found
}

/// Executable, command line, parent and namespaces of process `pid`.
///
/// `exe` is empty for kernel threads and for processes whose executable cannot be resolved.
pub fn read_process(pid: u32) -> Result<Process, ProcError> {
    let dir = PathBuf::from(format!("/proc/{pid}"));

    let stat_path = dir.join("stat");
    let stat = read_to_string(pid, &stat_path)?;
    let ppid = parse_stat_ppid(&stat).ok_or_else(|| ProcError::Parse {
        path: stat_path,
        line: 1,
        text: stat.clone(),
    })?;

    let exe = match read_link(pid, &dir.join("exe")) {
        Ok(exe) => exe,
        // Kernel threads have no executable; the process itself still exists.
        Err(ProcError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            String::new()
        }
        Err(e) => return Err(e),
    };

    let cmdline_path = dir.join("cmdline");
    let cmdline = fs::read(&cmdline_path).map_err(|e| proc_error(pid, &cmdline_path, e))?;

    // An exited process not yet reaped (a zombie) has no namespaces any more: it gets
    // none rather than failing the recording of a command that ran briefly.
    let ns_dir = dir.join("ns");
    let mut namespaces = Vec::new();
    let entries = match fs::read_dir(&ns_dir).and_then(|d| d.collect::<io::Result<Vec<_>>>()) {
        Ok(entries) => entries,
        Err(e) if vanished(&e) => Vec::new(),
        Err(e) => return Err(proc_error(pid, &ns_dir, e)),
    };
    for entry in entries {
        // Named by the entry, not the link: `pid_for_children` links to `pid:[…]` too.
        let name = entry.file_name().to_string_lossy().into_owned();
        match fs::read_link(entry.path()) {
            Ok(link) => {
                if let Some(inode) = parse_namespace_link(&link.to_string_lossy()) {
                    namespaces.push((name, inode));
                }
            }
            Err(e) if vanished(&e) => {}
            Err(e) => return Err(proc_error(pid, &entry.path(), e)),
        }
    }
    namespaces.sort();

    Ok(Process {
        pid,
        ppid,
        exe,
        cmdline: parse_cmdline(&cmdline),
        namespaces,
    })
}

/// The name (comm) of thread `tid` of process `pid`, if it still exists.
pub fn thread_name(pid: u32, tid: u32) -> Option<String> {
    let comm = fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).ok()?;
    Some(comm.trim_end_matches('\n').to_owned())
}

/// The thread ids of process `pid`, sorted; empty if the process is gone.
pub fn threads(pid: u32) -> Vec<u32> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut tids: Vec<u32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    tids
}

// ---------------------------------------------------------------------------------------
// Mapped files

/// Whether `file` is the file that `entry` maps (same device and inode).
fn is_mapped_file(file: &File, entry: &MapsEntry) -> bool {
    let Ok(meta) = file.metadata() else {
        return false;
    };
    let dev = meta.dev();
    meta.ino() == entry.inode
        && libc::major(dev) == entry.dev_major
        && libc::minor(dev) == entry.dev_minor
}

/// Whether `entry`'s path, as lrec sees it, is the file the process maps (not one of that
/// name in another mount namespace, nor a file replaced since).
pub fn is_mapped_path(entry: &MapsEntry) -> bool {
    entry
        .file_path()
        .and_then(|p| File::open(p).ok())
        .is_some_and(|f| is_mapped_file(&f, entry))
}

/// Opens the file that `entry` of process `pid` maps.
///
/// In order: `/proc/PID/root/PATH` (the path as the process sees it, so that processes in
/// other mount namespaces work), `/proc/PID/map_files/START-END` (the mapped file itself,
/// also when deleted; needs CAP_SYS_ADMIN), then PATH. A file whose device and inode differ
/// from the entry's is only returned when nothing better opens (overlayfs reports the
/// upper inode in stat but the lower one in maps), and never for a deleted file.
pub fn open_mapped_file(pid: u32, entry: &MapsEntry) -> io::Result<File> {
    let Some(path) = entry.file_path() else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("mapping {:?} is not backed by a file", entry.path),
        ));
    };
    let by_root = PathBuf::from(format!("/proc/{pid}/root")).join(path.trim_start_matches('/'));
    let by_map_files = PathBuf::from(format!(
        "/proc/{pid}/map_files/{:x}-{:x}",
        entry.start, entry.end
    ));

    let mut mismatched = None;
    let mut first_error = None;
    for (candidate, verify) in [
        (by_root.as_path(), true),
        (by_map_files.as_path(), false),
        (Path::new(path), true),
    ] {
        match File::open(candidate) {
            Ok(file) if !verify || is_mapped_file(&file, entry) => return Ok(file),
            Ok(file) => {
                mismatched.get_or_insert(file);
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match mismatched {
        Some(file) if !entry.is_deleted() => Ok(file),
        _ => Err(first_error.unwrap_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{path}: the file at this path is not the mapped one"),
            )
        })),
    }
}

// ---------------------------------------------------------------------------------------
// Host and clocks

fn uname() -> libc::utsname {
    // SAFETY: utsname is plain bytes; uname only fills it in and cannot fail with a
    // valid pointer.
    unsafe {
        let mut uts: libc::utsname = std::mem::zeroed();
        libc::uname(&mut uts);
        uts
    }
}

fn c_chars_to_string(chars: &[libc::c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The first 64 KiB of a mapped file: enough for the ELF headers and build-id note.
pub fn read_mapped_head(pid: u32, entry: &MapsEntry) -> Option<Vec<u8>> {
    use io::Read;
    let f = open_mapped_file(pid, entry).ok()?;
    let mut v = Vec::new();
    f.take(64 << 10).read_to_end(&mut v).ok()?;
    Some(v)
}

/// Reads the target's memory (the vDSO, which has no file).
pub fn read_memory(pid: u32, addr: u64, len: u64) -> io::Result<Vec<u8>> {
    use io::{Read, Seek};
    let mut f = File::open(format!("/proc/{pid}/mem"))?;
    f.seek(io::SeekFrom::Start(addr))?;
    let mut v = vec![0; len as usize];
    f.read_exact(&mut v)?;
    Ok(v)
}

/// `uname -r`.
pub fn kernel_release() -> String {
    c_chars_to_string(&uname().release)
}

/// `uname -n`.
pub fn hostname() -> String {
    c_chars_to_string(&uname().nodename)
}

pub fn page_size() -> u32 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u32::try_from(size).unwrap_or(4096)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write to; the clocks used here always exist.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of BPF's `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// Whether process `pid` still exists.
pub fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Wall-clock time in nanoseconds since the Unix epoch.
pub fn realtime_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

/// Reads all of `buf` at `addr` in process `pid`, in one process_vm_readv: several times
/// cheaper than /proc/PID/mem, which copies through a page of its own. False when any of
/// it cannot be read.
pub fn read_vm(pid: u32, addr: u64, buf: &mut [u8]) -> bool {
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: `local` covers `buf`, which lives across the call; the remote range is
    // only read, in the other process.
    let n = unsafe { libc::process_vm_readv(pid as i32, &local, 1, &remote, 1, 0) };
    n == buf.len() as isize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_hostile_comm() {
        let stat = "1234 (a) b (c)) S 77 1234 1234 0 -1 4194560 100 0 0 0";
        assert_eq!(parse_stat_ppid(stat), Some(77));
        assert_eq!(parse_stat_ppid("1 (init) S 0 1 1"), Some(0));
        assert_eq!(parse_stat_ppid("1 (init"), None);
    }

    #[test]
    fn namespaces_and_cmdline() {
        assert_eq!(parse_namespace_link("mnt:[4026531841]"), Some(4026531841));
        assert_eq!(parse_namespace_link("mnt:4026531841"), None);
        assert_eq!(parse_cmdline(b"ls\0-l\0a b\0"), vec!["ls", "-l", "a b"]);
        assert_eq!(parse_cmdline(b"ls\0\0x\0"), vec!["ls", "", "x"]);
        assert!(parse_cmdline(b"").is_empty());
    }

    #[test]
    fn own_process() {
        let pid = std::process::id();
        let p = read_process(pid).unwrap();
        assert_eq!(p.pid, pid);
        assert_eq!(p.ppid, std::os::unix::process::parent_id());
        assert_eq!(p.exe, std::env::current_exe().unwrap().to_string_lossy());
        assert_eq!(p.cmdline, std::env::args().collect::<Vec<_>>());
        assert!(p
            .namespaces
            .iter()
            .any(|(name, ino)| name == "mnt" && *ino > 0));
        let ns_names: std::collections::HashSet<_> =
            p.namespaces.iter().map(|(name, _)| name).collect();
        assert_eq!(ns_names.len(), p.namespaces.len(), "{:?}", p.namespaces);

        let tids = threads(pid);
        assert!(tids.contains(&pid));
        assert!(thread_name(pid, pid).is_some_and(|n| !n.is_empty() && !n.ends_with('\n')));

        let maps = read_maps(pid).unwrap();
        let exe = maps
            .iter()
            .find(|m| m.file_path() == Some(p.exe.as_str()))
            .unwrap();
        let file = open_mapped_file(pid, exe).unwrap();
        assert!(is_mapped_file(&file, exe));
        assert!(open_mapped_file(pid, maps.iter().find(|m| m.path == "[stack]").unwrap()).is_err());
    }

    #[test]
    fn missing_process() {
        // Above the largest pid_max (4194304), so never a live process.
        let err = read_process(4_194_305).unwrap_err();
        assert!(
            matches!(err, ProcError::NoSuchProcess { pid: 4_194_305 }),
            "{err}"
        );
        assert!(matches!(
            read_maps(4_194_305),
            Err(ProcError::NoSuchProcess { .. })
        ));
        assert!(threads(4_194_305).is_empty());
        assert_eq!(thread_name(4_194_305, 1), None);
    }

    #[test]
    fn deleted_file_through_map_files() {
        let dir = std::env::temp_dir().join(format!("lrec-procfs-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("mapped file");
        fs::write(&path, vec![7u8; 8192]).unwrap();
        let file = File::open(&path).unwrap();
        // SAFETY: a private read-only mapping of a file we own, unmapped below.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED);
        fs::remove_file(&path).unwrap();
        let pid = std::process::id();
        let entry = read_maps(pid)
            .unwrap()
            .into_iter()
            .find(|m| m.start == addr as u64)
            .unwrap();
        assert!(entry.is_deleted(), "{entry:?}");
        let opened = open_mapped_file(pid, &entry);
        // SAFETY: unmaps the mapping made above.
        unsafe { libc::munmap(addr, 8192) };
        fs::remove_dir_all(&dir).unwrap();
        // map_files needs CAP_SYS_ADMIN; without it a deleted file cannot be opened.
        let is_root = unsafe { libc::geteuid() } == 0;
        if is_root {
            assert_eq!(opened.unwrap().metadata().unwrap().len(), 8192);
        } else {
            assert!(opened.is_err());
        }
    }

    #[test]
    fn host_and_clocks() {
        assert!(!kernel_release().is_empty());
        assert_eq!(
            kernel_release(),
            fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap()
                .trim()
        );
        assert!(!hostname().is_empty());
        assert!(page_size() >= 4096 && page_size().is_power_of_two());
        let a = monotonic_ns();
        assert!(monotonic_ns() >= a);
        assert!(realtime_ns() > 1_600_000_000 * 1_000_000_000);
    }
}
