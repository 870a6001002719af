//! lrec's own scheduling: the priority its threads run at, so that its start, its drain
//! and its end keep up when the target's threads leave no CPU idle, and the priority a
//! command it starts gets back.

/// The nice value lrec was started with (before [`raise_priority`]), which a command it
/// starts gets back.
pub static STARTED_NICE: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Raises the calling thread's scheduling priority (root only, else it stays as it was),
/// noting the nice value it had ([`STARTED_NICE`]): lrec's start (BTF, BPF, the target's
/// binaries) and the thread that drains the samples must keep up when the target's threads
/// leave no CPU idle, or `-d` is overrun and the ring fills. The nice value becomes -20,
/// and the thread runs in the realtime class (see [`realtime`]) until it drains.
pub fn raise_priority() {
    // SAFETY: getpriority and setpriority on the calling thread (who = 0) have no memory
    // effects; a failure only leaves the priority as it was.
    unsafe {
        *libc::__errno_location() = 0;
        let nice = libc::getpriority(libc::PRIO_PROCESS, 0);
        if *libc::__errno_location() == 0 {
            STARTED_NICE.store(nice, std::sync::atomic::Ordering::Relaxed);
        }
        libc::setpriority(libc::PRIO_PROCESS, 0, -20);
    }
    realtime(true);
}

/// The threads [`realtime`] put in the realtime class, for [`on_rttime`].
static REALTIME_TIDS: [std::sync::atomic::AtomicI32; 8] =
    [const { std::sync::atomic::AtomicI32::new(0) }; 8];

/// Puts the calling thread in the realtime class (SCHED_RR at its lowest priority) or back
/// to nice -20 (`on` false). Realtime, lrec's start and end take the CPU time they need
/// however many threads of the target run (at nice -20 among 200 spinning threads its
/// start took 0.6–2 s), while the thread that drains the samples, which runs for the whole
/// recording, stays in the normal class. Bounded: the kernel leaves other classes 5 % of
/// each second, and after 2 s of CPU without a pause (RLIMIT_RTTIME) the thread goes back
/// to nice -20 (SIGXCPU, [`on_rttime`]). Threads and processes it starts do not inherit it
/// (SCHED_RESET_ON_FORK: they start at nice 0; a command gets its RLIMIT_RTTIME back:
/// [`restore_rttime`]). Refused (not root, or a cgroup without realtime time), it stays as
/// it was.
pub fn realtime(on: bool) {
    // SAFETY: gettid has no preconditions.
    realtime_thread(unsafe { libc::gettid() }, on);
}

/// [`realtime`] for thread `tid` of lrec.
fn realtime_thread(tid: libc::pid_t, on: bool) {
    // SAFETY: sched_setscheduler, setrlimit and sigaction on one of lrec's threads and on
    // lrec; the handler only makes async-signal-safe system calls.
    unsafe {
        if !on {
            normal_class(tid);
            return;
        }
        let bound = libc::rlimit {
            rlim_cur: 2_000_000,
            rlim_max: libc::RLIM_INFINITY,
        };
        let mut was = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if STARTED_RTTIME.get().is_none() && libc::getrlimit(libc::RLIMIT_RTTIME, &mut was) == 0 {
            let _ = STARTED_RTTIME.set((was.rlim_cur, was.rlim_max));
        }
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_rttime as *const () as usize;
        if libc::setrlimit(libc::RLIMIT_RTTIME, &bound) != 0
            || libc::sigaction(libc::SIGXCPU, &act, std::ptr::null_mut()) != 0
        {
            return;
        }
        let param = libc::sched_param { sched_priority: 1 };
        if libc::sched_setscheduler(tid, libc::SCHED_RR | libc::SCHED_RESET_ON_FORK, &param) == 0 {
            // Noted in a free place (the handler demotes them all).
            for t in &REALTIME_TIDS {
                let free = t.load(std::sync::atomic::Ordering::Relaxed);
                if free == 0 || free == tid {
                    t.store(tid, std::sync::atomic::Ordering::Relaxed);
                    return;
                }
            }
        }
    }
}

/// RLIMIT_RTTIME as lrec was started with (soft, hard), before [`realtime`] bounded it.
static STARTED_RTTIME: std::sync::OnceLock<(libc::rlim_t, libc::rlim_t)> =
    std::sync::OnceLock::new();

/// Gives the calling process RLIMIT_RTTIME back as lrec was started with: a command lrec
/// starts, between its fork and its exec (only a system call: async-signal-safe).
pub fn restore_rttime() {
    if let Some(&(rlim_cur, rlim_max)) = STARTED_RTTIME.get() {
        let was = libc::rlimit { rlim_cur, rlim_max };
        // SAFETY: setrlimit of the calling process from a value on the stack.
        unsafe { libc::setrlimit(libc::RLIMIT_RTTIME, &was) };
    }
}

/// Thread `tid` (0: the calling one) back in the normal class, at nice -20.
unsafe fn normal_class(tid: libc::pid_t) {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: (the caller's) system calls on one of lrec's threads, no memory effects.
    unsafe {
        libc::sched_setscheduler(tid, libc::SCHED_OTHER | libc::SCHED_RESET_ON_FORK, &param);
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, -20);
    }
}

/// SIGXCPU: a realtime thread ran 2 s without a pause; they all go back to nice -20.
extern "C" fn on_rttime(_: libc::c_int) {
    for t in &REALTIME_TIDS {
        let tid = t.load(std::sync::atomic::Ordering::Relaxed);
        if tid > 0 {
            // SAFETY: system calls only (async-signal-safe).
            unsafe { normal_class(tid) };
        }
    }
}

/// Puts a thread lrec's start waits for (just spawned: `thread`) in the realtime class at
/// once, from its parent: a thread started by the realtime one starts at nice 0
/// ([`realtime`]), and among 200 spinning threads it waited up to seconds for a CPU before
/// it could raise itself. (RLIMIT_RTTIME, set by [`realtime`], bounds it as the others.)
pub fn realtime_from_parent(thread: libc::pthread_t) {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: sets the scheduling of a live thread of ours (its JoinHandle is held); a
    // failure leaves it as it was.
    unsafe {
        libc::pthread_setschedparam(thread, libc::SCHED_RR | libc::SCHED_RESET_ON_FORK, &param);
    }
}

/// Sets the calling thread, which lrec's start waits for, to nice -20: a thread started
/// by the realtime one starts at nice 0 ([`realtime`]).
pub fn nice_high() {
    // SAFETY: setpriority on the calling thread; a failure leaves it as it was.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, -20) };
}

/// A thread of lrec's that yields to the target (nice +10) while what it does can wait,
/// and is raised to lrec's own priority once lrec waits for it ([`Yielding::hurry`]): on a
/// machine the target saturates, a thread at nice +10 gets next to no CPU, and the end of
/// the recording would wait for it for as long.
#[derive(Clone, Default)]
pub struct Yielding {
    tid: std::sync::Arc<std::sync::atomic::AtomicI32>,
    /// The thread's pthread, noted by whoever spawned it ([`Yielding::spawned`]): it is
    /// hurried by it when it never ran (tid 0).
    pthread: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Yielding {
    /// Notes the thread just spawned (by the spawner).
    pub fn spawned<T>(&self, handle: &std::thread::JoinHandle<T>) {
        let p = std::os::unix::thread::JoinHandleExt::as_pthread_t(handle);
        self.pthread
            .store(p, std::sync::atomic::Ordering::Relaxed);
    }

    /// Called on the thread itself: lowers its priority and notes its id.
    pub fn lower(&self) {
        // SAFETY: gettid and setpriority on the calling thread (who = 0) have no memory
        // effects; a failure only leaves the priority as it was.
        unsafe {
            self.tid
                .store(libc::gettid(), std::sync::atomic::Ordering::Relaxed);
            libc::setpriority(libc::PRIO_PROCESS, 0, 10);
        }
    }

    /// Called on the thread itself: notes its id and puts it in lrec's start's class, the
    /// realtime one ([`realtime`]), until [`Yielding::relax`].
    pub fn start_with_lrec(&self) {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        self.tid.store(tid, std::sync::atomic::Ordering::Relaxed);
        realtime_thread(tid, true);
    }

    /// Puts the thread back in the normal class at nice 0: it shares the CPUs with the
    /// target's threads.
    pub fn relax(&self) {
        let tid = self.tid.load(std::sync::atomic::Ordering::Relaxed);
        if tid > 0 {
            // SAFETY: system calls on one of our own threads; a failure leaves it as it was.
            unsafe {
                normal_class(tid);
                libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 0);
            }
        }
    }

    /// Raises the thread to lrec's start's and end's priority, the realtime class (it is
    /// now on lrec's way: [`realtime`]).
    pub fn hurry(&self) {
        let tid = self.tid.load(std::sync::atomic::Ordering::Relaxed);
        let pthread = self.pthread.load(std::sync::atomic::Ordering::Relaxed);
        if tid > 0 {
            // SAFETY: setpriority of one of our own threads; a failure leaves it as it was.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, -20) };
            realtime_thread(tid, true);
        } else if pthread != 0 {
            // It never ran: among threads that keep the CPUs busy, it would wait its turn.
            realtime_from_parent(pthread as libc::pthread_t);
        }
    }
}
