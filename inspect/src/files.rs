//! Creating the files lrec and lanalyze write, safely when they run as root in a directory
//! someone else controls: never through a symbolic link, never onto something that is not
//! a regular file, never replacing a file that is not one of theirs unless told to
//! (`--force`), and never half a file at the name asked for: the file is written under a
//! temporary name in the same directory and renamed into place when complete. Under sudo
//! the file belongs to the user who ran sudo. With `debug_files`, the one module of
//! this crate that does filesystem I/O beyond the streams it is handed, shared by both
//! programs.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// The extended attribute lrec and lanalyze set on the files they write, so that they
/// replace their own outputs without `--force`.
const MARK: &str = "user.lrec.output";

/// What goes wrong creating an output file, each saying what to do.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error(
        "{0} is a symbolic link: lrec and lanalyze never write through one; remove it or \
         choose another output file"
    )]
    Symlink(PathBuf),
    #[error("{0} is a {1}, not a regular file: choose another output file")]
    NotRegular(PathBuf, &'static str),
    #[error(
        "{0} exists and was not written by lrec or lanalyze: not replaced; add --force to \
         replace it"
    )]
    Foreign(PathBuf),
    #[error("cannot create {0}: {1}")]
    Io(PathBuf, #[source] io::Error),
}

/// How to create an output file.
#[derive(Debug, Clone, Copy, Default)]
pub struct OutputOptions {
    /// Replace an existing regular file that is not one of ours.
    pub force: bool,
    /// Give the file to this user and group (`SUDO_UID`, `SUDO_GID`).
    pub owner: Option<(u32, u32)>,
    /// A file dropped before it is committed (an error stopped its writer) is moved into
    /// place as it is rather than removed: a capture is readable up to its last complete
    /// chunk.
    pub keep_partial: bool,
}

impl OutputOptions {
    /// The options of a program that may run under sudo: files go to the invoking user.
    pub fn for_invoking_user(force: bool) -> OutputOptions {
        OutputOptions {
            force,
            owner: sudo_owner(),
            keep_partial: false,
        }
    }
}

/// The user and group that ran `sudo`, when this process runs as root under it.
pub fn sudo_owner() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let id = |name| std::env::var(name).ok()?.parse::<u32>().ok();
    Some((id("SUDO_UID")?, id("SUDO_GID")?)).filter(|&(uid, _)| uid != 0)
}

/// A file being written: under a temporary name in its directory until [`commit`].
///
/// [`commit`]: OutputFile::commit
#[derive(Debug)]
pub struct OutputFile {
    file: File,
    tmp: PathBuf,
    dest: PathBuf,
    keep_partial: bool,
    /// Committed or abandoned: nothing left to do when dropped.
    done: bool,
}

impl OutputFile {
    /// Checks what `dest` is now and creates the temporary file beside it (mode 0600,
    /// owned as `opts` says). A capture or an output of ours at `dest`, or an empty
    /// file, may be replaced; any other regular file only with `opts.force`.
    pub fn create(dest: &Path, opts: &OutputOptions) -> Result<OutputFile, OutputError> {
        let io_err = |e| OutputError::Io(dest.to_path_buf(), e);
        check_destination(dest, opts.force)?;
        let name = dest
            .file_name()
            .ok_or_else(|| io_err(io::Error::other("not a file name")))?;
        let dir = match dest.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let mut last = None;
        for attempt in 0..16u32 {
            // Visible, beside it: a recording cut short by a crash is found there.
            let tmp = dir.join(partial_name(
                &name.to_string_lossy(),
                std::process::id(),
                attempt,
            ));
            // A new file only (no link followed, nothing replaced), private from the start.
            let file = OpenOptions::new()
                .write(true)
                .read(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&tmp);
            match file {
                Ok(file) => {
                    let mut out = OutputFile {
                        file,
                        tmp,
                        dest: dest.to_path_buf(),
                        keep_partial: opts.keep_partial,
                        done: false,
                    };
                    if let Err(e) = out.settle(opts) {
                        out.keep_partial = false;
                        return Err(io_err(e));
                    }
                    return Ok(out);
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => return Err(io_err(e)),
            }
        }
        Err(io_err(
            last.unwrap_or_else(|| io::Error::other("no temporary name")),
        ))
    }

    /// Mode 0600 whatever the umask, the owner, and the mark that makes it ours.
    fn settle(&self, opts: &OutputOptions) -> io::Result<()> {
        self.file
            .set_permissions(std::fs::Permissions::from_mode(0o600))?;
        if let Some((uid, gid)) = opts.owner {
            // SAFETY: fchown on a descriptor we own.
            if unsafe { libc::fchown(self.file.as_raw_fd(), uid, gid) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        // A filesystem without user attributes only means --force to replace it later.
        let name = CString::new(MARK).expect("no NUL");
        // SAFETY: a valid descriptor, a NUL-terminated name and a 1-byte value.
        unsafe {
            libc::fsetxattr(
                self.file.as_raw_fd(),
                name.as_ptr(),
                b"1".as_ptr().cast(),
                1,
                0,
            )
        };
        Ok(())
    }

    /// The file, to write to.
    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn file_mut(&mut self) -> &mut File {
        &mut self.file
    }

    /// Where the file is until it is committed (where a crash leaves it).
    pub fn path_in_progress(&self) -> &Path {
        &self.tmp
    }

    /// The name it gets when committed.
    pub fn destination(&self) -> &Path {
        &self.dest
    }

    /// Moves the complete file to its name, replacing what was there (a link there is
    /// replaced itself, never followed).
    pub fn commit(mut self) -> Result<PathBuf, OutputError> {
        self.done = true;
        self.file
            .sync_data()
            .and_then(|()| std::fs::rename(&self.tmp, &self.dest))
            .map_err(|e| OutputError::Io(self.dest.clone(), e))?;
        Ok(self.dest.clone())
    }

    /// Gives up: removes the temporary file.
    pub fn abandon(mut self) {
        self.done = true;
        let _ = std::fs::remove_file(&self.tmp);
    }
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if self.keep_partial {
            let _ = std::fs::rename(&self.tmp, &self.dest);
        } else {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

impl io::Write for OutputFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// The name a file being written to `NAME` has until it is committed, by writer `pid`.
fn partial_name(name: &str, pid: u32, attempt: u32) -> String {
    format!("{name}.{pid}-{attempt}.partial")
}

/// The newest file an unfinished writer left for `dest` (a recording cut short: killed,
/// or the machine went down; or one still going), and that writer's pid when it still runs
/// as lrec. None when there is none.
pub fn partial_file(dest: &Path) -> Option<(PathBuf, Option<u32>)> {
    let name = dest.file_name()?.to_string_lossy().into_owned();
    let dir = match dest.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let writer = |file: &str| -> Option<(u32, u32)> {
        let rest = file.strip_prefix(&name)?.strip_prefix('.')?;
        let (pid, attempt) = rest.strip_suffix(".partial")?.split_once('-')?;
        let (pid, attempt) = (pid.parse().ok()?, attempt.parse().ok()?);
        (partial_name(&name, pid, attempt) == file).then_some((pid, attempt))
    };
    let (path, pid, _) = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| {
            let e = e.ok()?;
            let (pid, _) = writer(&e.file_name().to_string_lossy())?;
            let meta = e.metadata().ok().filter(|m| m.is_file())?;
            Some((e.path(), pid, meta.modified().ok()?))
        })
        .max_by_key(|(_, _, modified)| *modified)?;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    Some((path, (comm.trim() == "lrec").then_some(pid)))
}

/// Whether `dest` may be replaced: nothing there, or a regular file that is ours (a
/// capture, a file we marked, an empty file), or any regular file with `force`.
fn check_destination(dest: &Path, force: bool) -> Result<(), OutputError> {
    let meta = match std::fs::symlink_metadata(dest) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(OutputError::Io(dest.to_path_buf(), e)),
    };
    let kind = meta.file_type();
    if kind.is_symlink() {
        return Err(OutputError::Symlink(dest.to_path_buf()));
    }
    if !kind.is_file() {
        let what = if kind.is_dir() {
            "directory"
        } else if kind.is_fifo() {
            "FIFO"
        } else if kind.is_socket() {
            "socket"
        } else if kind.is_block_device() || kind.is_char_device() {
            "device"
        } else {
            "special file"
        };
        return Err(OutputError::NotRegular(dest.to_path_buf(), what));
    }
    if force || meta.len() == 0 || is_ours(dest) {
        return Ok(());
    }
    Err(OutputError::Foreign(dest.to_path_buf()))
}

/// Whether the regular file at `path` was written by lrec or lanalyze: a capture (its
/// magic), or marked by [`OutputFile`].
fn is_ours(path: &Path) -> bool {
    let Ok(mut file) = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    else {
        return false;
    };
    let mut head = [0u8; 8];
    if file.read_exact(&mut head).is_ok() && head == lrec_format::MAGIC {
        return true;
    }
    let name = CString::new(MARK).expect("no NUL");
    let mut value = [0u8; 8];
    // SAFETY: a valid descriptor, a NUL-terminated name and a buffer of the size given.
    let n = unsafe {
        libc::fgetxattr(
            file.as_raw_fd(),
            name.as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    };
    n == 1 && value[0] == b'1'
}

/// `dest` as a C string, for the tests.
#[cfg(test)]
fn c_path(p: &Path) -> CString {
    use std::os::unix::ffi::OsStrExt;
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    fn write(out: OutputFile, bytes: &[u8]) -> PathBuf {
        let mut out = out;
        out.file_mut().write_all(bytes).unwrap();
        out.commit().unwrap()
    }

    #[test]
    fn a_file_left_unfinished_is_found_beside_its_name() {
        let d = dir();
        let dest = d.path().join("c.lrec");
        assert!(partial_file(&dest).is_none());
        let mut out = OutputFile::create(&dest, &OutputOptions::default()).unwrap();
        out.file_mut().write_all(b"LREC").unwrap();
        // As a SIGKILL leaves it: under its temporary name, its writer (this test, not
        // lrec) gone for all partial_file can tell.
        let left = out.path_in_progress().to_path_buf();
        std::mem::forget(out);
        let (found, writer) = partial_file(&dest).unwrap();
        assert_eq!((found, writer), (left, None));
        // Other files beside it are not taken for it.
        std::fs::write(d.path().join("c.lrec.x-0.partial"), b"").unwrap();
        std::fs::write(d.path().join("c.lrecc.1-0.partial"), b"").unwrap();
        assert!(partial_file(&d.path().join("d.lrec")).is_none());
    }

    #[test]
    fn a_new_file_appears_complete_private_and_marked() {
        let d = dir();
        let dest = d.path().join("out.svg");
        let out = OutputFile::create(&dest, &OutputOptions::default()).unwrap();
        assert!(!dest.exists(), "nothing at the name before commit");
        assert!(out.path_in_progress().exists());
        write(out, b"<svg/>");
        assert_eq!(std::fs::read(&dest).unwrap(), b"<svg/>");
        let mode = std::fs::metadata(&dest).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // Only the file remains: no temporary one.
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
        // Ours now: replaced without --force.
        write(
            OutputFile::create(&dest, &OutputOptions::default()).unwrap(),
            b"2",
        );
        assert_eq!(std::fs::read(&dest).unwrap(), b"2");
    }

    #[test]
    fn links_special_files_and_foreign_files_are_refused_and_left_alone() {
        let d = dir();
        let victim = d.path().join("victim.txt");
        std::fs::write(&victim, b"precious").unwrap();
        let link = d.path().join("link.lrec");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let opts = OutputOptions::default();
        let err = OutputFile::create(&link, &opts).unwrap_err();
        assert!(matches!(err, OutputError::Symlink(_)), "{err}");
        // Not even with --force.
        let forced = OutputOptions {
            force: true,
            ..opts
        };
        assert!(matches!(
            OutputFile::create(&link, &forced).unwrap_err(),
            OutputError::Symlink(_)
        ));
        assert!(matches!(
            OutputFile::create(d.path(), &forced).unwrap_err(),
            OutputError::NotRegular(_, "directory")
        ));
        let fifo = d.path().join("fifo");
        // SAFETY: a valid C path.
        assert_eq!(unsafe { libc::mkfifo(c_path(&fifo).as_ptr(), 0o600) }, 0);
        let err = OutputFile::create(&fifo, &forced).unwrap_err();
        assert!(matches!(err, OutputError::NotRegular(_, "FIFO")), "{err}");
        let err = OutputFile::create(&victim, &opts).unwrap_err();
        assert!(matches!(err, OutputError::Foreign(_)), "{err}");
        assert!(err.to_string().contains("--force"));
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        // With --force a foreign regular file is replaced.
        write(OutputFile::create(&victim, &forced).unwrap(), b"new");
        assert_eq!(std::fs::read(&victim).unwrap(), b"new");
        // Nothing was left behind.
        let names: Vec<_> = std::fs::read_dir(d.path()).unwrap().flatten().collect();
        assert_eq!(names.len(), 3, "{names:?}");
    }

    #[test]
    fn a_capture_and_an_empty_file_are_ours() {
        let d = dir();
        let cap = d.path().join("old.lrec");
        let mut bytes = lrec_format::MAGIC.to_vec();
        bytes.extend([1, 0, 0, 0]);
        std::fs::write(&cap, &bytes).unwrap();
        assert!(OutputFile::create(&cap, &OutputOptions::default()).is_ok());
        let empty = d.path().join("empty");
        std::fs::write(&empty, b"").unwrap();
        assert!(OutputFile::create(&empty, &OutputOptions::default()).is_ok());
    }

    #[test]
    fn an_abandoned_file_leaves_nothing_a_partial_capture_its_bytes() {
        let d = dir();
        let out = OutputFile::create(&d.path().join("x"), &OutputOptions::default()).unwrap();
        out.abandon();
        let dropped = OutputFile::create(&d.path().join("y"), &OutputOptions::default());
        drop(dropped);
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
        let keep = OutputOptions {
            keep_partial: true,
            ..OutputOptions::default()
        };
        let mut partial = OutputFile::create(&d.path().join("cap.lrec"), &keep).unwrap();
        partial.file_mut().write_all(b"chunks").unwrap();
        drop(partial);
        assert_eq!(std::fs::read(d.path().join("cap.lrec")).unwrap(), b"chunks");
    }
}
