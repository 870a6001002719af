//! lrec's signals. SIGINT, SIGTERM and SIGHUP stop the recording ([`STOP`]): the loop
//! notices within its tick, and what follows it (the last samples, the binaries still
//! being embedded, the capture's end) is bounded by [`stop_deadline`], so that lrec is gone
//! within a second, its capture finished. Before the recording begins there is nothing to
//! finish: a signal during lrec's start-up ([`starting`]) ends it at once, from the
//! handler, leaving no capture and saying so. SIGUSR1 asks for a dump ([`DUMP`]).

use std::ffi::CString;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, Ordering};
use std::time::Duration;

// A bare clock_gettime: async-signal-safe.
use crate::procfs::monotonic_ns;

/// Set by SIGINT / SIGTERM / SIGHUP.
pub static STOP: AtomicBool = AtomicBool::new(false);
pub static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);
/// When the first of them came (CLOCK_MONOTONIC ns).
static STOP_AT_NS: AtomicU64 = AtomicU64::new(0);
/// Set by SIGUSR1: the flight recorder writes its window out.
pub static DUMP: AtomicBool = AtomicBool::new(false);

/// Whether lrec is starting (nothing recorded yet), and the capture file in progress then,
/// which a signal removes (a leaked C string, read by the handler).
static STARTING: AtomicBool = AtomicBool::new(false);
static PARTIAL: AtomicPtr<libc::c_char> = AtomicPtr::new(ptr::null_mut());

/// How long after a stop signal lrec may still work to finish its capture.
pub const STOP_GRACE: Duration = Duration::from_millis(700);

extern "C" fn on_signal(sig: libc::c_int) {
    if STARTING.load(Ordering::Relaxed) {
        abort_start(sig);
    }
    if !STOP.swap(true, Ordering::Relaxed) {
        STOP_SIGNAL.store(sig, Ordering::Relaxed);
        STOP_AT_NS.store(monotonic_ns(), Ordering::Relaxed);
    }
}

/// In the handler, during start-up: the capture begun is removed, a line says so, lrec
/// exits (the kernel lets its BPF programs and probes go; a command not started yet reads
/// the end of its gate and exits).
fn abort_start(sig: libc::c_int) -> ! {
    const MSG: &[u8] = b"lrec: stopped by a signal while starting, before anything was \
                         recorded: no capture written\n";
    // SAFETY: unlink, write and _exit are async-signal-safe; PARTIAL is a C string that is
    // never freed.
    unsafe {
        let partial = PARTIAL.load(Ordering::Relaxed);
        if !partial.is_null() {
            libc::unlink(partial);
        }
        libc::write(2, MSG.as_ptr().cast(), MSG.len());
        libc::_exit(128 + sig)
    }
}

extern "C" fn on_dump_signal(_: libc::c_int) {
    DUMP.store(true, Ordering::Relaxed);
}

/// Routes SIGINT, SIGTERM and SIGHUP to [`STOP`] so that the capture is always finished,
/// and SIGUSR1 to [`DUMP`] (without --flight it is only said to do nothing, rather than
/// ending lrec unfinished). lrec is starting from now until [`started`].
pub fn install() {
    STARTING.store(true, Ordering::Relaxed);
    let handlers: [(libc::c_int, extern "C" fn(libc::c_int)); 4] = [
        (libc::SIGINT, on_signal),
        (libc::SIGTERM, on_signal),
        (libc::SIGHUP, on_signal),
        (libc::SIGUSR1, on_dump_signal),
    ];
    for (sig, handler) in handlers {
        // SAFETY: the handlers store to atomics, or end lrec with async-signal-safe calls.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = handler as *const () as usize;
            libc::sigaction(sig, &sa, ptr::null_mut());
        }
    }
}

/// The capture file lrec writes while it starts: removed by a signal then.
pub fn starting(partial: &std::path::Path) {
    use std::os::unix::ffi::OsStrExt;
    if let Ok(c) = CString::new(partial.as_os_str().as_bytes()) {
        PARTIAL.store(c.into_raw(), Ordering::Relaxed);
    }
}

/// The recording begins: a signal from now on stops it, its capture finished.
pub fn started() {
    STARTING.store(false, Ordering::Relaxed);
}

/// Whether a stop signal came, and if so, whether its grace ([`STOP_GRACE`]) is over: the
/// work of finishing the capture that is not done by then is given up.
pub fn stop_deadline_passed() -> bool {
    STOP.load(Ordering::Relaxed)
        && monotonic_ns().saturating_sub(STOP_AT_NS.load(Ordering::Relaxed))
            > STOP_GRACE.as_nanos() as u64
}
