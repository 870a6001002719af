//! Records of time off CPU and of thread states (`lrec --off-cpu`, `--states`): blocked
//! intervals with their stacks, what was counted without one, and thread-state samples.

use serde::{Deserialize, Serialize};

use super::{Sample, SampleRef};

/// A thread's time off CPU: from `start_ns` it was blocked for `duration_ns` (the blocked
/// intervals of one system call add up), in `state`; `sample` holds its registers, user
/// stack and kernel stack as they were when it blocked (taken when it next returned from
/// the system call, before running user code; `sample.time_ns` is that moment).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct OffCpu {
    pub start_ns: u64,
    pub duration_ns: u64,
    /// The task's `__state` when it left the CPU (1 sleeping, 2 disk sleep, …; see
    /// [`task_state_letter`]), or [`OFF_CPU_LUA_YIELD`].
    pub state: u32,
    pub sample: Sample,
}

/// [`OffCpu::state`] of a Lua coroutine's wait, not a thread's: from its lua_yield to its
/// lua_resume (OpenResty's ngx.sleep, cosocket reads). `sample` is taken at lua_resume:
/// the resumer's registers and stack, and the coroutine's Lua frames
/// ([`super::lua_flags::SUSPENDED`]). No task state has this bit.
pub const OFF_CPU_LUA_YIELD: u32 = 0x8000_0000;

/// An [`OffCpu`] decoded in place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffCpuRef<'a> {
    pub start_ns: u64,
    pub duration_ns: u64,
    pub state: u32,
    #[serde(borrow)]
    pub sample: SampleRef<'a>,
}

impl OffCpuRef<'_> {
    pub fn to_owned(&self) -> OffCpu {
        OffCpu {
            start_ns: self.start_ns,
            duration_ns: self.duration_ns,
            state: self.state,
            sample: self.sample.to_owned(),
        }
    }
}

/// The letter `ps` shows for a task's `__state` and `exit_state` (R, S, D, T, t, X, Z, I,
/// P).
pub fn task_state_letter(state: u32, exit_state: u32) -> char {
    const TASK_UNINTERRUPTIBLE: u32 = 2;
    const TASK_NOLOAD: u32 = 0x400;
    match (state, exit_state) {
        (_, 16) => 'X',
        (_, e) if e & 32 != 0 => 'Z',
        (0, _) => 'R',
        (s, _) if s & TASK_NOLOAD != 0 && s & TASK_UNINTERRUPTIBLE != 0 => 'I',
        (s, _) if s & 1 != 0 => 'S',
        (s, _) if s & TASK_UNINTERRUPTIBLE != 0 => 'D',
        (s, _) if s & 4 != 0 => 'T',
        (s, _) if s & 8 != 0 => 't',
        (s, _) if s & 0x100 != 0 => 'P',
        _ => '?',
    }
}

/// One thread as a thread-state sample saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ThreadState {
    pub pid: u32,
    pub tid: u32,
    /// `task->__state` and `task->exit_state` ([`task_state_letter`]).
    pub state: u32,
    pub exit_state: u32,
    /// Running on a CPU at that moment (state 0 and not on a CPU: waiting for one).
    pub on_cpu: bool,
    /// The system call it was in, if any (known only when lrec traced system calls).
    pub syscall: Option<u32>,
    /// Since when it was in that system call (CLOCK_MONOTONIC ns).
    pub syscall_since_ns: u64,
    /// Since when it was off CPU, when it was (0 if unknown).
    pub off_cpu_since_ns: u64,
    /// Its saved user instruction pointer: where its user code is while it is in the
    /// kernel (stale while it runs user code).
    pub user_ip: u64,
    /// Kernel return addresses, innermost first.
    pub kernel_stack: Vec<u64>,
}

/// Every recorded thread at one moment (`lrec --states`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ThreadStates {
    pub time_ns: u64,
    pub threads: Vec<ThreadState>,
}

/// Off-CPU time one thread spent without a recorded stack. `#[repr(C)]` with the layout of
/// `struct lrec_thread_totals` in ebpf/sample.h, so lrec reads it from BPF as is (asserted
/// in record/src/raw.rs).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ThreadOffCpuTotals {
    pub pid: u32,
    pub tid: u32,
    /// Blocked intervals shorter than the minimum.
    pub short_count: u64,
    pub short_ns: u64,
    /// Preempted: runnable, waiting for a CPU.
    pub runnable_count: u64,
    pub runnable_ns: u64,
    /// Blocked, but the thread ran user code before its stack could be taken (a page
    /// fault, or a block outside a system call), or was still blocked, or had not yet
    /// returned from the system call it blocked in, when the recording ended.
    pub unpaired_count: u64,
    pub unpaired_ns: u64,
}

impl ThreadOffCpuTotals {
    /// Adds `other`'s counts and times (not its ids).
    pub fn add(&mut self, other: &ThreadOffCpuTotals) {
        self.short_count += other.short_count;
        self.short_ns += other.short_ns;
        self.runnable_count += other.runnable_count;
        self.runnable_ns += other.runnable_ns;
        self.unpaired_count += other.unpaired_count;
        self.unpaired_ns += other.unpaired_ns;
    }
}

/// What `lrec --off-cpu` counted but did not record with stacks (written at the end).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct OffCpuTotals {
    /// Blocked intervals shorter than this were counted, not recorded.
    pub min_ns: u64,
    pub threads: Vec<ThreadOffCpuTotals>,
}

/// The recording's window (CLOCK_MONOTONIC ns), written at the end with `--off-cpu` or
/// `--states`: from when sampling started to `-d`'s end or, without one, the moment
/// sampling stopped. The capture's CPU samples, off-CPU time (recorded with stacks and
/// counted without) and thread states all lie inside it: an interval that began before
/// it counts from its start, one still open at its end counts to its end. Captures of
/// lrec before this record have none (their off-CPU time may reach outside the span of
/// their CPU samples).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct OffCpuWindow {
    pub start_ns: u64,
    pub end_ns: u64,
    /// The threads with intervals the window cut (Lua coroutine waits count under the
    /// thread that resumed them).
    pub threads: Vec<WindowCuts>,
}

/// How many of one thread's off-CPU intervals the recording's window cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct WindowCuts {
    pub pid: u32,
    pub tid: u32,
    /// Began before the window: counted from its start.
    pub at_start: u64,
    /// Still open at its end: counted to it.
    pub at_end: u64,
}
