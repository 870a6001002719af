//! Copies a process's writable memory for a Lua heap snapshot (`--lua-heap`): the
//! anonymous regions a Lua VM's allocator hands objects out of (the brk heap, mmap'd
//! arenas), read through /proc/PID/mem, optionally with every thread stopped
//! (`--freeze`, by ptrace) so the copy is one consistent moment.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use crate::procfs::{self, MapsEntry};

const PAGE: u64 = 4096;

/// The copied memory of one process.
pub struct HeapCopy {
    /// (start, bytes) of each region copied, in address order.
    pub regions: Vec<(u64, Vec<u8>)>,
    pub bytes: u64,
    /// Bytes that could not be read (left as zeros).
    pub unreadable: u64,
    /// Bytes of regions left out: the copy reached `max_bytes`.
    pub skipped: u64,
    pub took: Duration,
}

/// Whether a mapping can hold a Lua VM's objects: private, readable and writable, and not
/// a file's (the brk heap, anonymous mmaps, named anonymous memory, thread stacks).
fn holds_objects(e: &MapsEntry) -> bool {
    let anon = e.path.is_empty()
        || e.path == "[heap]"
        || e.path == "[stack]"
        || e.path.starts_with("[anon:")
        || e.path.starts_with("[stack:");
    e.perms.starts_with("rw") && e.perms.ends_with('p') && anon
}

/// Copies the regions of `pid` that can hold Lua objects, at most `max_bytes` of them.
pub fn copy_writable(pid: u32, max_bytes: u64) -> io::Result<HeapCopy> {
    let start = Instant::now();
    let maps = procfs::read_maps(pid).map_err(io::Error::other)?;
    let mem = File::open(format!("/proc/{pid}/mem"))?;
    let mut copy = HeapCopy {
        regions: Vec::new(),
        bytes: 0,
        unreadable: 0,
        skipped: 0,
        took: Duration::ZERO,
    };
    for e in maps.iter().filter(|e| holds_objects(e)) {
        let len = e.end - e.start;
        if copy.bytes + len > max_bytes {
            copy.skipped += len;
            continue;
        }
        let mut buf = vec![0u8; len as usize];
        copy.unreadable += read_region(pid, &mem, e.start, &mut buf);
        copy.bytes += len;
        copy.regions.push((e.start, buf));
    }
    copy.took = start.elapsed();
    Ok(copy)
}

/// Reads `buf.len()` bytes at `addr`, a megabyte at a time (process_vm_readv, several
/// times faster than /proc/PID/mem), page by page where that fails; returns the bytes
/// that could not be read.
fn read_region(pid: u32, mem: &File, addr: u64, buf: &mut [u8]) -> u64 {
    let mut unreadable = 0;
    for (i, piece) in buf.chunks_mut(1 << 20).enumerate() {
        let at = addr + (i as u64) * (1 << 20);
        if procfs::read_vm(pid, at, piece) || read_full(mem, at, piece) {
            continue;
        }
        for (j, page) in piece.chunks_mut(PAGE as usize).enumerate() {
            if !read_full(mem, at + j as u64 * PAGE, page) {
                page.fill(0);
                unreadable += page.len() as u64;
            }
        }
    }
    unreadable
}

fn read_full(mem: &File, addr: u64, buf: &mut [u8]) -> bool {
    let mut done = 0;
    while done < buf.len() {
        match mem.read_at(&mut buf[done..], addr + done as u64) {
            Ok(0) | Err(_) => return false,
            Ok(n) => done += n,
        }
    }
    true
}

/// Every thread of a process, stopped by ptrace (seized and interrupted) until dropped.
pub struct Frozen {
    /// Each thread stopped, with the signal it was stopped to receive (0: none), given
    /// back when it is let go.
    tids: Vec<(i32, i32)>,
    since: Instant,
}

impl Frozen {
    /// Stops every thread of `pid`, also threads it creates meanwhile.
    pub fn new(pid: u32) -> io::Result<Frozen> {
        let mut frozen = Frozen {
            tids: Vec::new(),
            since: Instant::now(),
        };
        // A thread running while others are stopped may create another: list again
        // until every thread listed is stopped.
        loop {
            let new: Vec<i32> = procfs::threads(pid)
                .into_iter()
                .map(|t| t as i32)
                .filter(|t| !frozen.tids.iter().any(|(s, _)| s == t))
                .collect();
            if new.is_empty() {
                break;
            }
            for tid in new {
                match stop_thread(tid) {
                    Ok(sig) => frozen.tids.push((tid, sig)),
                    // The thread exited meanwhile.
                    Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                        return Err(io::Error::new(
                            e.kind(),
                            format!(
                                "cannot stop thread {tid} of {pid} with ptrace ({e}): another \
                                 tracer (gdb, strace) holds it, or the kernel forbids it \
                                 (kernel.yama.ptrace_scope = 3); take the snapshot without \
                                 --freeze"
                            ),
                        ))
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        frozen.since = Instant::now();
        Ok(frozen)
    }

    /// How long the process has been stopped.
    pub fn stopped(&self) -> Duration {
        self.since.elapsed()
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        for &(tid, sig) in &self.tids {
            // SAFETY: detaching a thread this process seized; no pointers passed.
            unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0, sig) };
        }
    }
}

/// Seizes thread `tid` and waits until it is stopped. Returns the signal it stopped to
/// receive, if a signal and not lrec's interrupt stopped it: it must be delivered after.
fn stop_thread(tid: i32) -> io::Result<i32> {
    // SAFETY: ptrace requests with integer arguments only.
    if unsafe { libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0) } != 0 {
        let e = io::Error::last_os_error();
        // SAFETY: as above.
        unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0, 0) };
        return Err(e);
    }
    let mut status = 0;
    // SAFETY: status is a valid out-pointer.
    let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL) };
    if r != tid {
        let e = io::Error::last_os_error();
        // SAFETY: as above.
        unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0, 0) };
        return Err(e);
    }
    let event_stop = (status >> 16) == libc::PTRACE_EVENT_STOP;
    let sig = libc::WSTOPSIG(status);
    Ok(
        if event_stop || !libc::WIFSTOPPED(status) || sig == libc::SIGTRAP {
            0
        } else {
            sig
        },
    )
}
