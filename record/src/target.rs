//! The process being recorded: an existing PID, or a command lrec starts and holds at a
//! gate until sampling is attached, so its first instructions are sampled too.

use std::collections::HashSet;
use std::ffi::CString;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};

use crate::procfs;

#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("no such process: {0} (is the PID right, and is it in this PID namespace?)")]
    NoSuchProcess(u32),
    #[error("command is empty")]
    EmptyCommand,
    #[error("command argument contains a NUL byte")]
    NulInCommand,
    #[error("{call} failed")]
    Sys {
        call: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot run `{cmd}`: {source}")]
    Exec {
        cmd: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "no such user: {0} (--user takes a login name of /etc/passwd, or a numeric UID or UID:GID)"
    )]
    NoSuchUser(String),
}

fn sys(call: &'static str) -> TargetError {
    TargetError::Sys {
        call,
        source: std::io::Error::last_os_error(),
    }
}

/// How the target ended, once it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
    /// An attached process is gone; its status belongs to its parent.
    Gone,
}

pub struct Target {
    /// The process named first (`-p`) or started (`-- CMD`).
    pub pid: u32,
    /// Further processes named with `-p A,B`.
    pub others: Vec<u32>,
    /// pidfd of `pid`, opened on first use.
    pidfd: Option<Option<i32>>,
    /// Write end of the start gate of a spawned child.
    gate: Option<i32>,
    spawned: bool,
    /// A spawned command runs on when lrec ends (--keep-running).
    keep_running: bool,
    exit: Option<Exit>,
    /// /proc/PID/stat of each attached process, kept open (`exited`).
    stats: std::collections::HashMap<u32, procfs::Reread>,
}

impl Target {
    /// Attaches to running processes (the first one is the main target).
    pub fn attach_all(pids: &[u32]) -> Result<Target, TargetError> {
        let mut target = Target::attach(pids[0])?;
        for &pid in &pids[1..] {
            let t = Target::attach(pid)?;
            if t.pid != target.pid && !target.others.contains(&t.pid) {
                target.others.push(t.pid);
            }
        }
        Ok(target)
    }

    /// The processes to record from the start: the targets and, when following
    /// children, their descendants alive now.
    /// Whether lrec started the target (`-- CMD`), rather than attaching to it.
    pub fn spawned(&self) -> bool {
        self.spawned
    }

    pub fn initial_pids(&self, children: bool) -> Vec<u32> {
        let mut pids = vec![self.pid];
        pids.extend(&self.others);
        if children && !self.spawned {
            pids.extend(crate::procfs::descendants(&pids));
        }
        pids
    }

    pub fn attach(pid: u32) -> Result<Target, TargetError> {
        // SAFETY: signal 0 only checks that the process exists.
        if unsafe { libc::kill(pid as i32, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
        {
            return Err(TargetError::NoSuchProcess(pid));
        }
        // A thread id names its process's thread: record the whole process.
        let tgid = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                let line = s.lines().find(|l| l.starts_with("Tgid:"))?;
                line[5..].trim().parse::<u32>().ok()
            })
            .unwrap_or(pid);
        if tgid != pid {
            eprintln!("lrec: {pid} is a thread of process {tgid}: recording all of {tgid}");
        }
        Ok(Target {
            pid: tgid,
            others: Vec::new(),
            pidfd: None,
            gate: None,
            spawned: false,
            keep_running: false,
            exit: None,
            stats: Default::default(),
        })
    }

    /// Forks `cmd`, as `user` when given; the child waits at a gate until
    /// [`Target::start`]. Unless `keep_running`, the command gets SIGKILL when lrec dies
    /// (and SIGTERM when lrec stops first: [`Target::stop_child`]).
    pub fn spawn(
        cmd: &[String],
        user: Option<&User>,
        keep_running: bool,
    ) -> Result<Target, TargetError> {
        if cmd.is_empty() {
            return Err(TargetError::EmptyCommand);
        }
        // The user's environment, prepared before the fork (the child only makes calls
        // that are safe there).
        let env: Option<Vec<CString>> = user.map(|u| u.environment());
        let mut envp: Vec<*const libc::c_char> = env.iter().flatten().map(|e| e.as_ptr()).collect();
        envp.push(std::ptr::null());
        let args: Vec<CString> = cmd
            .iter()
            .map(|a| CString::new(a.as_bytes()).map_err(|_| TargetError::NulInCommand))
            .collect::<Result<_, _>>()?;
        let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
        argv.push(std::ptr::null());
        let mut gate = [0i32; 2];
        let mut report = [0i32; 2];
        // SAFETY: plain pipe creation into valid arrays.
        if unsafe { libc::pipe2(gate.as_mut_ptr(), libc::O_CLOEXEC) } != 0
            || unsafe { libc::pipe2(report.as_mut_ptr(), libc::O_CLOEXEC) } != 0
        {
            return Err(sys("pipe2"));
        }
        // SAFETY: getpid has no preconditions.
        let lrec = unsafe { libc::getpid() };
        let nice = crate::priority::STARTED_NICE.load(Ordering::Relaxed);
        // SAFETY: after fork the child only calls async-signal-safe functions (close, read,
        // setpriority, setrlimit, prctl, getppid, execvp, write, _exit) on memory prepared
        // before the fork.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(sys("fork"));
        }
        if pid == 0 {
            unsafe {
                // Only lrec holds the gate's write end: closing it lets the child go.
                libc::close(gate[1]);
                libc::close(report[0]);
                let mut b = 0u8;
                libc::read(gate[0], (&mut b as *mut u8).cast(), 1);
                if b != 1 {
                    libc::_exit(127);
                }
                // The command runs at the priority lrec was started with, not lrec's own,
                // and with the realtime bound lrec was started with.
                libc::setpriority(libc::PRIO_PROCESS, 0, nice);
                crate::priority::restore_rttime();
                if let Some(u) = user {
                    // Groups first, then the group, then the user: each needs root.
                    if libc::setgroups(u.groups.len(), u.groups.as_ptr()) != 0
                        || libc::setgid(u.gid) != 0
                        || libc::setuid(u.uid) != 0
                    {
                        let errno = *libc::__errno_location();
                        libc::write(report[1], (&errno as *const i32).cast(), 4);
                        libc::_exit(127);
                    }
                }
                // After the switch of user, which clears it. lrec may have died already.
                if !keep_running
                    && (libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0
                        || libc::getppid() != lrec)
                {
                    libc::_exit(127);
                }
                if user.is_some() {
                    libc::execvpe(argv[0], argv.as_ptr(), envp.as_ptr());
                } else {
                    libc::execvp(argv[0], argv.as_ptr());
                }
                let errno = *libc::__errno_location();
                libc::write(report[1], (&errno as *const i32).cast(), 4);
                libc::_exit(127);
            }
        }
        // SAFETY: closing our copies of the child's ends.
        unsafe {
            libc::close(gate[0]);
            libc::close(report[1]);
        }
        EXEC_REPORT.store(report[0], Ordering::Relaxed);
        Ok(Target {
            pid: pid as u32,
            others: Vec::new(),
            pidfd: None,
            gate: Some(gate[1]),
            spawned: true,
            keep_running,
            exit: None,
            stats: Default::default(),
        })
    }

    /// Lets a spawned child exec its command; reports a failed exec (or a failed switch to
    /// `--user`).
    pub fn start(&mut self, cmd: &[String]) -> Result<(), TargetError> {
        let Some(fd) = self.gate.take() else {
            return Ok(());
        };
        let one = 1u8;
        // SAFETY: writes one byte to our pipe, then closes it.
        unsafe {
            libc::write(fd, (&one as *const u8).cast(), 1);
            libc::close(fd);
        }
        let report = EXEC_REPORT.swap(-1, Ordering::Relaxed);
        let mut errno = 0i32;
        // SAFETY: blocks until exec succeeds (CLOEXEC closes the pipe) or the child
        // reports errno.
        let n = unsafe { libc::read(report, (&mut errno as *mut i32).cast(), 4) };
        unsafe { libc::close(report) };
        if n == 4 {
            return Err(TargetError::Exec {
                cmd: cmd.join(" "),
                source: std::io::Error::from_raw_os_error(errno),
            });
        }
        Ok(())
    }

    /// A pidfd of the main target, readable once it exits (None before Linux 5.3).
    pub fn pidfd(&mut self) -> Option<i32> {
        if self.pidfd.is_none() {
            // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, self.pid as libc::c_int, 0) };
            self.pidfd = Some((fd >= 0).then_some(fd as i32));
        }
        self.pidfd.flatten()
    }

    /// Whether the target has ended (non-blocking).
    pub fn exited(&mut self) -> Option<Exit> {
        if self.exit.is_some() {
            return self.exit;
        }
        if self.spawned {
            let mut status = 0;
            // SAFETY: reaps our own child without blocking.
            let r = unsafe { libc::waitpid(self.pid as i32, &mut status, libc::WNOHANG) };
            if r == self.pid as i32 {
                self.exit = Some(if libc::WIFEXITED(status) {
                    Exit::Code(libc::WEXITSTATUS(status))
                } else {
                    Exit::Signal(libc::WTERMSIG(status))
                });
            }
        } else {
            let stats = &mut self.stats;
            let gone = std::iter::once(&self.pid).chain(&self.others).all(|&pid| {
                let stat = stats
                    .entry(pid)
                    .or_insert_with(|| procfs::Reread::open(&format!("/proc/{pid}/stat")));
                stat.read().is_none_or(is_zombie)
            });
            if gone {
                self.exit = Some(Exit::Gone);
            }
        }
        self.exit
    }

    /// Ends a spawned child that is still running (when lrec stops first), unless it is to
    /// keep running.
    pub fn stop_child(&mut self) {
        if let Some(fd) = self.gate.take() {
            // Never started: the child reads end-of-file at its gate and exits. (It keeps
            // lrec's handlers until exec, so SIGTERM would only set its flag.)
            // SAFETY: closes our end of the gate and reaps our own child.
            unsafe {
                libc::close(fd);
                let mut status = 0;
                libc::waitpid(self.pid as i32, &mut status, 0);
            }
            self.exit = Some(Exit::Code(127));
            return;
        }
        if self.spawned && !self.keep_running && self.exited().is_none() {
            // SAFETY: signals and reaps our own child.
            unsafe {
                libc::kill(self.pid as i32, libc::SIGTERM);
                let mut status = 0;
                libc::waitpid(self.pid as i32, &mut status, 0);
            }
        }
    }
}

impl Target {
    /// The dynamic loaders the target runs (or will run, once `cmd` is exec'd), as paths
    /// lrec can open; deduplicated by inode. Empty for static programs.
    pub fn loaders(&self, cmd: &[String]) -> Vec<PathBuf> {
        let mut found: Vec<PathBuf> = Vec::new();
        let root = PathBuf::from(format!("/proc/{}/root", self.pid));
        if self.spawned {
            // Not exec'd yet: read the command's file (and its #! interpreter).
            let mut file = cmd.first().and_then(|c| which(c));
            for _ in 0..2 {
                let Some(path) = file.take() else { break };
                let head = read_head(&path);
                if let Some(interp) = lrec_inspect::elf::interpreter(&head) {
                    found.push(PathBuf::from(interp));
                } else if let Some(script) = head.strip_prefix(b"#!") {
                    let line = script.split(|&b| b == b'\n').next().unwrap_or_default();
                    let line = String::from_utf8_lossy(line);
                    file = line.split_whitespace().next().map(PathBuf::from);
                }
            }
            found.push(PathBuf::from("/lib64/ld-linux-x86-64.so.2"));
        } else {
            let exe = PathBuf::from(format!("/proc/{}/exe", self.pid));
            if let Some(interp) = lrec_inspect::elf::interpreter(&read_head(&exe)) {
                found.push(root.join(interp.trim_start_matches('/')));
            }
        }
        let mut seen = HashSet::new();
        found.retain(|p| std::fs::metadata(p).is_ok_and(|m| seen.insert((m.dev(), m.ino()))));
        found
    }
}

/// The file `cmd` names, searched in PATH as execvp does.
fn which(cmd: &str) -> Option<PathBuf> {
    if cmd.contains('/') {
        return Some(PathBuf::from(cmd));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(cmd))
        .find(|p| p.is_file())
}

/// The first 4 KiB of a file: ELF headers and PT_INTERP, or a #! line.
fn read_head(path: &Path) -> Vec<u8> {
    let mut head = Vec::new();
    if let Ok(f) = std::fs::File::open(path) {
        let _ = f.take(4096).read_to_end(&mut head);
    }
    head
}

static EXEC_REPORT: AtomicI32 = AtomicI32::new(-1);

/// Whether /proc/PID/stat's text `stat` is a zombie's.
fn is_zombie(stat: &str) -> bool {
    stat.rsplit_once(')')
        .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
}

/// A user to run the command as (`lrec --user NAME`): ids and groups from the password and
/// group databases, and the variables a login would set.
#[derive(Debug, Clone)]
pub struct User {
    pub name: String,
    pub uid: libc::uid_t,
    pub gid: libc::gid_t,
    pub groups: Vec<libc::gid_t>,
    pub home: String,
}

impl User {
    /// Looks `name` (a login name, or a numeric uid) up in /etc/passwd and /etc/group,
    /// as NSS's `files` service would: lrec reads them itself, so that a static lrec needs
    /// no NSS module at run time. A uid that /etc/passwd does not list (a directory
    /// service's) runs with its own number as its group, or `UID:GID`.
    pub fn lookup(name: &str) -> Result<User, TargetError> {
        let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
        User::from_files(name, &read("/etc/passwd"), &read("/etc/group"))
            .ok_or_else(|| TargetError::NoSuchUser(name.to_string()))
    }

    /// [`User::lookup`] on the texts of the password and group files.
    fn from_files(name: &str, passwd: &str, group: &str) -> Option<User> {
        let numeric = match name.split_once(':') {
            Some((u, g)) => Some((u.parse().ok()?, Some(g.parse().ok()?))),
            None => name.parse::<libc::uid_t>().ok().map(|u| (u, None)),
        };
        // name:password:uid:gid:gecos:home:shell
        let entry = passwd.lines().find_map(|line| {
            let f: Vec<&str> = line.split(':').collect();
            let (uid, gid) = (f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?);
            let wanted = match numeric {
                Some((u, _)) => uid == u,
                None => f[0] == name,
            };
            (wanted && f.len() >= 6).then(|| (f[0].to_string(), uid, gid, f[5].to_string()))
        });
        let (login, uid, gid, home) = match (entry, numeric) {
            (Some((login, uid, gid, home)), Some((_, Some(g)))) if g != gid => {
                (login, uid, g, home)
            }
            (Some(e), _) => e,
            (None, Some((u, g))) => (u.to_string(), u, g.unwrap_or(u), "/".to_string()),
            (None, None) => return None,
        };
        // name:password:gid:member,member
        let mut groups = vec![gid];
        for line in group.lines() {
            let f: Vec<&str> = line.split(':').collect();
            let Some(g) = f.get(2).and_then(|g| g.parse::<libc::gid_t>().ok()) else {
                continue;
            };
            let member = f.get(3).is_some_and(|m| m.split(',').any(|m| m == login));
            if member && !groups.contains(&g) {
                groups.push(g);
            }
        }
        Some(User {
            name: login,
            uid,
            gid,
            groups,
            home,
        })
    }

    /// lrec's environment with the user's USER, LOGNAME and HOME.
    fn environment(&self) -> Vec<CString> {
        let mut env: Vec<CString> = std::env::vars_os()
            .filter(|(k, _)| !matches!(k.to_str(), Some("USER" | "LOGNAME" | "HOME")))
            .filter_map(|(k, v)| {
                let mut kv = k.into_encoded_bytes();
                kv.push(b'=');
                kv.extend(v.into_encoded_bytes());
                CString::new(kv).ok()
            })
            .collect();
        for (k, v) in [
            ("USER", &self.name),
            ("LOGNAME", &self.name),
            ("HOME", &self.home),
        ] {
            env.extend(CString::new(format!("{k}={v}")));
        }
        env
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n\
        nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n\
        ann:x:1000:1000:Ann,,,:/home/ann:/bin/bash\n\
        broken line\n";
    const GROUP: &str =
        "root:x:0:\nadm:x:4:ann,bob\nann:x:1000:\nwww:x:33:bob,ann\nnogroup:x:65534:\n";

    #[test]
    fn users_are_read_from_the_files_without_nss() {
        let ann = User::from_files("ann", PASSWD, GROUP).unwrap();
        assert_eq!(
            (ann.uid, ann.gid, ann.home.as_str()),
            (1000, 1000, "/home/ann")
        );
        assert_eq!(ann.groups, vec![1000, 4, 33]);
        let by_uid = User::from_files("65534", PASSWD, GROUP).unwrap();
        assert_eq!(
            (by_uid.name.as_str(), by_uid.groups),
            ("nobody", vec![65534])
        );
        // A uid no file lists (a directory service's): its number, as uid and group.
        let other = User::from_files("4242", PASSWD, GROUP).unwrap();
        assert_eq!(
            (other.uid, other.gid, other.home.as_str()),
            (4242, 4242, "/")
        );
        let with_gid = User::from_files("4242:33", PASSWD, GROUP).unwrap();
        assert_eq!((with_gid.gid, with_gid.groups), (33, vec![33]));
        assert!(User::from_files("no-such-user", PASSWD, GROUP).is_none());
        assert!(User::from_files("1:x", PASSWD, GROUP).is_none());
    }
}
