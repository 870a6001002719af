//! Samples that are not CPU samples and need no unwinding: off-CPU time lrec counted per
//! thread without a stack, and thread states (`lrec --states`).

use std::collections::HashMap;

use lrec_format::task_state_letter;

use crate::address_space::ProcessMaps;
use crate::metadata::Metadata;
use crate::profile::{Frame, FrameKind, OffCpu, RecordingWindow, SampleKind, ThreadState, Wait};
use crate::stages::{locate, ChunkFrames, UnwoundChunk, UnwoundSample, WarningCounter};
use crate::unwind::CodeAddress;
use crate::Options;

/// The recording's window and the intervals it cut, each thread named (`None` for a
/// capture without it: before lrec recorded it, or without `--off-cpu` and `--states`).
pub(crate) fn recording_window(meta: &Metadata) -> Option<RecordingWindow> {
    let w = meta.off_cpu_window.as_ref()?;
    Some(RecordingWindow {
        start_ns: w.start_ns,
        end_ns: w.end_ns,
        cuts: (w.threads.iter())
            .map(|c| (*c, meta.thread_name(c.pid, c.tid)))
            .collect(),
    })
}

/// Time off CPU that lrec counted per thread without a stack, as samples without frames
/// (their leaf marks what they are), placed at the recording's end. Not time-resolved:
/// left out of a `--time` window.
pub(crate) fn unstacked_off_cpu(
    meta: &Metadata,
    opts: &Options,
    warnings: &mut WarningCounter,
) -> UnwoundChunk {
    let mut samples = Vec::new();
    let totals = match &meta.off_cpu_totals {
        Some(_) if opts.time.is_some() => {
            warnings.add(
                "off-CPU time counted without stacks (short blocks, waits for a CPU) is not \
                 time-stamped: left out of the --time window"
                    .into(),
            );
            None
        }
        totals => totals.as_ref(),
    };
    let end = match (&meta.off_cpu_window, &meta.end) {
        (Some(w), _) => w.end_ns,
        (None, Some(e)) => e.time_ns,
        (None, None) => 0,
    };
    let threads = totals.map_or(&[][..], |t| &t.threads);
    for t in threads.iter().filter(|t| opts.keeps(0, t.pid, t.tid, 0)) {
        for (ns, wait) in [
            (t.short_ns, Wait::Short),
            (t.runnable_ns, Wait::Runnable),
            (t.unpaired_ns, Wait::Unpaired),
        ] {
            if ns > 0 {
                let kind = SampleKind::OffCpu(OffCpu {
                    start_ns: end,
                    duration_ns: ns,
                    wait,
                });
                let sample = UnwoundSample::unwalked(end, t.pid, t.tid, vec![], vec![], kind);
                samples.push(sample);
            }
        }
    }
    UnwoundChunk {
        frames: Vec::new(),
        samples,
    }
}

/// Each thread of each thread-state sample, as a sample whose frames are its user code's
/// location (while it is in the kernel) and its kernel stack.
pub(crate) fn state_samples(
    meta: &Metadata,
    maps: &HashMap<u32, ProcessMaps>,
    opts: &Options,
) -> UnwoundChunk {
    let start = meta.header.as_ref().map_or(0, |h| h.monotonic_start_ns);
    let mut frames = ChunkFrames::default();
    let mut samples = Vec::new();
    for snapshot in &meta.thread_states {
        for t in &snapshot.threads {
            if !opts.keeps(start, t.pid, t.tid, snapshot.time_ns) {
                continue;
            }
            let state = task_state_letter(t.state, t.exit_state);
            // While a thread runs user code its saved registers are stale.
            let in_kernel = !(t.on_cpu && t.syscall.is_none());
            let space = maps.get(&t.pid).and_then(|m| m.at(snapshot.time_ns));
            let user = match space {
                Some(space) if in_kernel && t.user_ip != 0 => {
                    let address = CodeAddress {
                        avma: t.user_ip,
                        is_return: false,
                        region: space.region_index(t.user_ip),
                        sp: 0,
                        vm_work: false,
                    };
                    vec![frames.id(locate(space, &address))]
                }
                _ => Vec::new(),
            };
            let kind = SampleKind::State(ThreadState {
                state,
                on_cpu: t.on_cpu,
                syscall: t.syscall,
                syscall_ns: t
                    .syscall
                    .map(|_| snapshot.time_ns.saturating_sub(t.syscall_since_ns)),
            });
            let (time, kernel) = (snapshot.time_ns, t.kernel_stack.clone());
            samples.push(UnwoundSample::unwalked(
                time, t.pid, t.tid, user, kernel, kind,
            ));
        }
    }
    UnwoundChunk {
        frames: frames.list,
        samples,
    }
}

/// The leaf that marks time off CPU (`min_ns`: lrec's --off-cpu-min).
pub(crate) fn wait_frame(wait: Wait, min_ns: u64) -> Frame {
    let name = match wait {
        Wait::Blocked('S') => "[sleeping]".to_string(),
        Wait::Blocked('D') => "[disk sleep]".to_string(),
        Wait::Blocked('I') => "[idle]".to_string(),
        Wait::Blocked('T' | 't') => "[stopped]".to_string(),
        Wait::Blocked(other) => format!("[off-CPU: {other}]"),
        Wait::Runnable => "[runnable: waiting for a CPU]".to_string(),
        Wait::Short => format!(
            "[off-CPU < {}, not recorded]",
            crate::render::format_duration(min_ns)
        ),
        Wait::Unpaired => "[off-CPU, stack not taken]".to_string(),
        Wait::LuaYield => "[coroutine yielded]".to_string(),
    };
    Frame::named(name, None, FrameKind::Wait)
}

/// With `lrec --off-cpu --states`: a thread-state sample taken while its thread was in a
/// blocked interval that `--off-cpu` recorded gets that interval's user and Lua stack (the
/// thread ran no user code in between), in place of its user leaf alone; its state, time
/// and kernel stack stay its own. Off-CPU samples themselves leave the profile (`states`
/// is what --states shows). A Lua coroutine's wait is no thread's block: not used.
pub(crate) fn states_with_off_cpu_stacks(unwound: &mut [UnwoundChunk], states: &mut UnwoundChunk) {
    // Per thread: (start, end, chunk, sample) of its recorded blocks.
    let mut blocks: HashMap<u32, Vec<(u64, u64, usize, usize)>> = HashMap::new();
    for (c, chunk) in unwound.iter().enumerate() {
        for (i, s) in chunk.samples.iter().enumerate() {
            if let SampleKind::OffCpu(o) = &s.kind {
                if matches!(o.wait, Wait::Blocked(_)) {
                    let span = (o.start_ns, o.start_ns + o.duration_ns, c, i);
                    blocks.entry(s.tid).or_default().push(span);
                }
            }
        }
    }
    for spans in blocks.values_mut() {
        spans.sort_unstable();
    }
    let mut borrowed: Vec<Vec<UnwoundSample>> = unwound.iter().map(|_| Vec::new()).collect();
    states.samples.retain(|st| {
        let SampleKind::State(state) = &st.kind else {
            return true;
        };
        if state.state == 'R' {
            return true;
        }
        // A thread's blocks do not overlap: the last one starting at or before the sample.
        let block = blocks.get(&st.tid).and_then(|b| {
            let after = b.partition_point(|&(start, ..)| start <= st.time_ns);
            b[..after].last().filter(|&&(_, end, ..)| st.time_ns <= end)
        });
        let Some(&(_, _, c, i)) = block else {
            return true;
        };
        let mut s = unwound[c].samples[i].clone();
        s.time_ns = st.time_ns;
        s.kernel = st.kernel.clone();
        s.kernel_mode = st.kernel_mode;
        s.kind = st.kind;
        borrowed[c].push(s);
        false
    });
    for (chunk, extra) in unwound.iter_mut().zip(borrowed) {
        chunk
            .samples
            .retain(|s| !matches!(s.kind, SampleKind::OffCpu(_)));
        chunk.samples.extend(extra);
    }
}
