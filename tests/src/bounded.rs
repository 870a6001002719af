//! lrec run under bounds the test sets: an address-space limit set before it execs, a
//! watchdog on its resident set and a deadline, each ending it with SIGKILL, so that an
//! lrec that would grow without bound or hang fails its test instead of taking the
//! machine; with what the run cost (its peak resident set, from the kernel's rusage) and
//! when it started recording (its capture's first sample).

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where a bounded run is stopped.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// RLIMIT_AS, set in the child before exec: allocations past it fail.
    pub address_space: u64,
    /// Resident set past which the watchdog kills the child (read every 5 ms).
    pub rss: u64,
    /// Time after which the watchdog kills the child.
    pub deadline: Duration,
}

/// What a bounded run did.
#[derive(Debug)]
pub struct BoundedRun {
    /// Its exit code, or None when a signal ended it.
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// Why the watchdog killed it, if it did.
    pub killed: Option<String>,
    /// Peak resident set (ru_maxrss), bytes.
    pub peak_rss: u64,
    /// From spawn to exit.
    pub wall: Duration,
    /// CLOCK_MONOTONIC just before the spawn (the clock of the capture's samples).
    pub spawned_ns: u64,
    pub stderr: String,
}

impl BoundedRun {
    /// One line for a test's output and failure messages.
    pub fn summary(&self) -> String {
        let end = match (&self.killed, self.code, self.signal) {
            (Some(why), _, _) => format!("killed: {why}"),
            (None, Some(c), _) => format!("exit {c}"),
            (None, None, s) => format!("signal {}", s.unwrap_or(0)),
        };
        format!(
            "{end}, peak RSS {:.1} MB, {:.2} s",
            self.peak_rss as f64 / 1e6,
            self.wall.as_secs_f64()
        )
    }

    /// Seconds from the spawn to the first sample of `capture` (None without a sample).
    pub fn start_secs(&self, capture: &Path) -> Option<f64> {
        if !capture.exists() {
            return None;
        }
        let first = crate::contents(capture).first_ns;
        (first != u64::MAX).then(|| first.saturating_sub(self.spawned_ns) as f64 / 1e9)
    }
}

/// CLOCK_MONOTONIC, nanoseconds.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec for clock_gettime to write.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Resident set of process `pid` in bytes (0 once it is gone).
fn rss_of(pid: i32) -> u64 {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

/// Runs `cmd` (its standard output discarded, its standard error kept) within `bounds`.
// The child is reaped by wait4, which also gives its rusage, not by Child::wait.
#[allow(clippy::zombie_processes)]
pub fn run_bounded(cmd: &mut Command, bounds: Bounds) -> BoundedRun {
    let limit = libc::rlimit {
        rlim_cur: bounds.address_space,
        rlim_max: bounds.address_space,
    };
    // SAFETY: setrlimit is async-signal-safe and touches only the child's own limits.
    unsafe {
        cmd.pre_exec(move || match libc::setrlimit(libc::RLIMIT_AS, &limit) {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        });
    }
    cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    let spawned_ns = monotonic_ns();
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let pid = child.id() as i32;
    let mut pipe = child.stderr.take().expect("stderr is piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = pipe.read_to_string(&mut s);
        s
    });
    let mut killed = None;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to overwrite.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        let flags = if killed.is_some() { 0 } else { libc::WNOHANG };
        // SAFETY: pid is our child, not reaped yet; status and usage are valid to write.
        let r = unsafe { libc::wait4(pid, &mut status, flags, &mut usage) };
        if r == pid {
            break;
        }
        assert!(r == 0, "wait4: {}", std::io::Error::last_os_error());
        let rss = rss_of(pid);
        if rss > bounds.rss {
            killed = Some(format!(
                "resident set {} MB past the test's ceiling of {} MB after {:.1} s",
                rss / 1_000_000,
                bounds.rss / 1_000_000,
                started.elapsed().as_secs_f64()
            ));
        } else if started.elapsed() > bounds.deadline {
            killed = Some(format!(
                "still running {} s after its start",
                bounds.deadline.as_secs()
            ));
        }
        if killed.is_some() {
            // SAFETY: pid is our child, not reaped yet.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            continue;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let wall = started.elapsed();
    let exited = libc::WIFEXITED(status);
    BoundedRun {
        code: exited.then(|| libc::WEXITSTATUS(status)),
        signal: (!exited).then(|| libc::WTERMSIG(status)),
        killed,
        peak_rss: usage.ru_maxrss as u64 * 1024,
        wall,
        spawned_ns,
        stderr: reader.join().unwrap_or_default(),
    }
}
