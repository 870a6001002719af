//! Meets each new binary the targets map on a thread of its own
//! ([`lrec_inspect::lua::meet`]: its Lua VM, the layout learned from its code, where it
//! frees its protos), so that the recording never waits for it: samples are taken and
//! written meanwhile, and the Lua frames join once the VM's layout is known and proved.
//! Each binary's work is bounded by its budget. While lrec starts, and until the binaries
//! met then are done, the thread runs in lrec's start's class (realtime, bounded:
//! `priority::realtime`), so that an attached target's binaries are met before sampling
//! begins (~50 ms of CPU for tshark's ~60 libraries); from then on ([`Learner::relax`]) it
//! shares the CPUs with the target at nice 0 (at nice +10, on a busy machine, a VM was met
//! only after 400 of its 500 samples). It stops at once when lrec stops.

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;

use lrec_inspect::budget::Budget;
use lrec_inspect::lua::meet::{meet, Met};

/// A binary to meet: the file a process maps, opened.
pub struct Job {
    /// The binary's key (build-id, or path).
    pub key: Vec<u8>,
    pub path: String,
    pub file: File,
    /// `path` names, in lrec's mount namespace, the very file mapped (see
    /// `procfs::is_mapped_path`).
    pub probe_path: bool,
}

/// A binary met.
pub struct Learned {
    pub key: Vec<u8>,
    pub path: String,
    pub probe_path: bool,
    /// None when the file could not be mapped.
    pub met: Option<Met>,
}

/// The learning thread (it ends when this is dropped, after the step it is in).
pub struct Learner {
    jobs: Option<Sender<Job>>,
    done: Receiver<Learned>,
    /// Jobs submitted and not yet handed back.
    queued: usize,
    cancel: Arc<AtomicBool>,
    thread: crate::priority::Yielding,
    /// Jobs not done yet, as the thread counts them, and whether it is to relax when none is.
    pending: Arc<AtomicUsize>,
    relaxing: Arc<AtomicBool>,
}

impl Learner {
    pub fn new(debug_dir: PathBuf) -> Learner {
        let (jobs, inbox) = channel::<Job>();
        let (outbox, done) = channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let stop = cancel.clone();
        let thread = crate::priority::Yielding::default();
        let yielding = thread.clone();
        let (pending, relaxing) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (left, relax) = (pending.clone(), relaxing.clone());
        let handle = std::thread::Builder::new()
            .name("lrec-learn".into())
            .spawn(move || {
                yielding.start_with_lrec();
                for job in inbox {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let met = crate::procfs::map_file(&job.file).ok().map(|data| {
                        let budget = Budget::for_binary(Some(stop.clone()));
                        meet(&job.path, &job.file, &data, &debug_dir, budget)
                    });
                    let learned = Learned {
                        key: job.key,
                        path: job.path,
                        probe_path: job.probe_path,
                        met,
                    };
                    if outbox.send(learned).is_err() {
                        break;
                    }
                    // The start's binaries done: the rest shares the CPUs with the target.
                    if left.fetch_sub(1, Ordering::Relaxed) == 1 && relax.load(Ordering::Relaxed) {
                        yielding.relax();
                    }
                }
            })
            .expect("spawning the learning thread");
        // In the start's class from its first instruction, not once it got a CPU.
        thread.spawned(&handle);
        thread.hurry();
        Learner {
            jobs: Some(jobs),
            done,
            queued: 0,
            cancel,
            thread,
            pending,
            relaxing,
        }
    }

    /// lrec has started: the thread shares the CPUs with the target from now on, once the
    /// binaries submitted so far are met.
    pub fn relax(&self) {
        self.relaxing.store(true, Ordering::Relaxed);
        if self.pending.load(Ordering::Relaxed) == 0 {
            self.thread.relax();
        }
    }

    pub fn submit(&mut self, job: Job) {
        self.pending.fetch_add(1, Ordering::Relaxed);
        if self.jobs.as_ref().is_some_and(|j| j.send(job).is_ok()) {
            self.queued += 1;
        } else {
            self.pending.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Binaries met so far.
    pub fn finished(&mut self) -> Vec<Learned> {
        let done: Vec<Learned> = self.done.try_iter().collect();
        self.queued -= done.len();
        done
    }

    /// Whether binaries are being met.
    pub fn busy(&self) -> bool {
        self.queued > 0
    }

    /// Stops the work in progress (its result says it was stopped) and the rest.
    pub fn stop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
        self.jobs = None;
    }
}

impl Drop for Learner {
    fn drop(&mut self) {
        self.stop();
    }
}
