//! Captures without secrets: `lanalyze CAPTURE --strip -o SHARED.lrec`.
//!
//! A recorded capture holds raw user-stack bytes and registers, which can hold anything
//! the target had in memory (keys, tokens, user data). A stripped capture holds only what
//! the analysis made of them: named frames, each sample as frame ids with its time, thread
//! and flags, the header, thread names, lost counts, the end record, and a summary of the
//! binaries, Lua VMs and warnings. Every output of lanalyze reads it like the original
//! (filters, `--lines` and `--mark-jit` included: frames keep those details).
//! What `lrec --latency` measured holds no memory of the target: its records are copied
//! as they are (with the names of their threads), so `--latency` reads both alike.

use std::collections::BTreeMap;
use std::io::Write;

use lrec_format::{
    resolved_flags as flags, resolved_frame_kind, CaptureWriter, End, FormatError, Lost, LuaStates,
    Record, ResolvedDetails, ResolvedFrame, ResolvedFrames, ResolvedSample, ResolvedSummary,
    ThreadName,
};

use crate::metadata::Metadata;
use crate::profile::{Frame, FrameKind, LuaLines, Profile, ProfileSample, StackEnd, Stats};
use crate::stages::{index_threads, sample_stats};
use crate::Options;

/// Frames per [`ResolvedFrames`] record.
const FRAMES_PER_RECORD: usize = 4096;

/// Writes `profile` (and the census and paths of `heaps`) as a stripped capture to `out`.
pub fn write_stripped(
    profile: &Profile,
    heaps: &[crate::heap::HeapReport],
    out: impl Write,
) -> Result<(), FormatError> {
    let mut w = CaptureWriter::new(out, &profile.header)?;
    let mut names: BTreeMap<(u32, u32), &String> = BTreeMap::new();
    // Threads that were timed but not sampled keep their names too.
    if let Some(l) = &profile.latency {
        names.extend(l.thread_names.iter().map(|(&key, name)| (key, name)));
    }
    names.extend(profile.threads.iter().map(|t| ((t.pid, t.tid), &t.name)));
    // Each process's name, also when its main thread was not sampled.
    for (&pid, name) in &profile.processes {
        names.entry((pid, pid)).or_insert(name);
    }
    for ((pid, tid), name) in names {
        let name = name.clone();
        w.push(&ThreadName { pid, tid, name }.into())?;
    }
    w.push(
        &ResolvedSummary {
            binaries: profile.binaries.clone(),
            lua_vms: profile.lua_vms.clone(),
            warnings: profile.warnings.clone(),
        }
        .into(),
    )?;
    let details = ResolvedDetails {
        binary_names: profile.binary_names.clone(),
        lua_states: (profile.stats.lua_states.iter())
            .map(|(&(pid, puc), &vms)| LuaStates {
                pid,
                puc,
                vms: vms as u64,
            })
            .collect(),
    };
    w.push(&details.into())?;
    for (i, frames) in profile.frames.chunks(FRAMES_PER_RECORD).enumerate() {
        let record = ResolvedFrames {
            first: (i * FRAMES_PER_RECORD) as u32,
            frames: frames.iter().map(resolved_frame).collect(),
        };
        w.push(&record.into())?;
    }
    for s in &profile.samples {
        w.push(&resolved_sample(s).into())?;
    }
    if let Some(l) = &profile.latency {
        w.push(&Record::Latency(l.record.clone()))?;
        for c in &l.calls {
            w.push(&Record::LatencyCall(c.clone()))?;
        }
    }
    for h in heaps {
        w.push(&h.to_resolved().into())?;
    }
    let last = profile.stats.last_time_ns.unwrap_or_default();
    if profile.stats.lost > 0 {
        let lost = Lost {
            time_ns: last,
            count: profile.stats.lost,
        };
        w.push(&lost.into())?;
    }
    if let Some(causes) = &profile.stats.lost_causes {
        w.push(&causes.clone().into())?;
    }
    let end = End {
        time_ns: last,
        samples: profile.stats.samples,
        lost: profile.stats.lost,
        reason: profile
            .end_reason
            .clone()
            .unwrap_or_else(|| "cut short (no end record)".into()),
    };
    w.push(&end.into())?;
    w.finish()?;
    Ok(())
}

/// Whether a capture is a stripped one.
pub(crate) fn is_stripped(meta: &Metadata) -> bool {
    meta.resolved_summary.is_some()
}

/// The profile a stripped capture holds, filtered by `opts`.
pub(crate) fn read_stripped(meta: &mut Metadata, opts: &Options) -> Profile {
    let header = meta.header.clone().unwrap_or_default();
    let summary = meta.resolved_summary.take().unwrap_or_default();
    let details = meta.resolved_details.take().unwrap_or_default();
    let frames: Vec<Frame> = meta.resolved_frames.iter().map(frame).collect();
    let valid = |s: &ResolvedSample| s.frames.iter().all(|&f| (f as usize) < frames.len());
    let mut damaged = 0u64;
    let mut samples: Vec<ProfileSample> = Vec::with_capacity(meta.resolved_samples.len());
    for s in std::mem::take(&mut meta.resolved_samples) {
        if !opts.keeps(header.monotonic_start_ns, s.pid, s.tid, s.time_ns) {
            continue;
        }
        if !valid(&s) {
            damaged += 1;
            continue;
        }
        samples.push(profile_sample(s));
    }
    let threads = index_threads(&mut samples, |pid, tid| meta.thread_name(pid, tid));
    let processes = meta.process_names(&threads);
    let mut warnings = summary.warnings;
    warnings.extend(meta.read_warnings.iter().map(|w| crate::Warning {
        message: w.to_string(),
        count: 1,
    }));
    if damaged > 0 {
        warnings.push(crate::Warning {
            message: "stripped capture: samples naming frames it does not hold were skipped".into(),
            count: damaged,
        });
    }
    warnings.sort();
    Profile {
        end_reason: meta.end.as_ref().map(|e| e.reason.clone()),
        stats: Stats {
            lua_states: (details.lua_states.iter())
                .map(|s| ((s.pid, s.puc), s.vms as usize))
                .collect(),
            ..sample_stats(&samples, meta.lost, meta.lost_causes.clone())
        },
        header,
        samples,
        frames,
        threads,
        processes,
        binaries: summary.binaries,
        binary_names: details.binary_names,
        lua_vms: summary.lua_vms,
        warnings,
        naming: opts.naming,
        mode: crate::Mode::Cpu,
        latency: meta.latencies(opts),
        window: None,
    }
}

fn resolved_frame(f: &Frame) -> ResolvedFrame {
    ResolvedFrame {
        function: f.function.clone(),
        module: f.module.clone(),
        kind: match f.kind {
            FrameKind::User => resolved_frame_kind::USER,
            FrameKind::Inlined => resolved_frame_kind::INLINED,
            FrameKind::Kernel => resolved_frame_kind::KERNEL,
            FrameKind::Lua => resolved_frame_kind::LUA,
            FrameKind::Wait => resolved_frame_kind::WAIT,
        },
        lua_lines: f.lines.map(|l| (l.first, l.current)),
        jit: f.jit,
    }
}

fn frame(f: &ResolvedFrame) -> Frame {
    Frame {
        function: f.function.clone(),
        module: f.module.clone(),
        kind: match f.kind {
            resolved_frame_kind::INLINED => FrameKind::Inlined,
            resolved_frame_kind::KERNEL => FrameKind::Kernel,
            resolved_frame_kind::LUA => FrameKind::Lua,
            resolved_frame_kind::WAIT => FrameKind::Wait,
            _ => FrameKind::User,
        },
        lines: f
            .lua_lines
            .map(|(first, current)| LuaLines { first, current }),
        jit: f.jit,
    }
}

fn resolved_sample(s: &ProfileSample) -> ResolvedSample {
    let bit = |set: bool, bit: u32| if set { bit } else { 0 };
    ResolvedSample {
        time_ns: s.time_ns,
        pid: s.pid,
        tid: s.tid,
        frames: s.frames.clone(),
        flags: bit(s.truncated(), flags::TRUNCATED)
            | bit(s.end == StackEnd::Failed, flags::FAILED)
            | bit(s.kernel_mode, flags::KERNEL_MODE)
            | bit(s.jit_mapped == Some(true), flags::JIT_MAPPED)
            | bit(s.jit_mapped == Some(false), flags::JIT_UNMAPPED),
        vm_state: s.vm_state,
    }
}

fn profile_sample(s: ResolvedSample) -> ProfileSample {
    let has = |bit: u32| s.flags & bit != 0;
    ProfileSample {
        time_ns: s.time_ns,
        pid: s.pid,
        tid: s.tid,
        thread: 0,
        end: if has(flags::FAILED) {
            StackEnd::Failed
        } else if has(flags::TRUNCATED) {
            StackEnd::Truncated
        } else {
            StackEnd::Complete
        },
        kernel_mode: has(flags::KERNEL_MODE),
        jit_mapped: if has(flags::JIT_MAPPED) {
            Some(true)
        } else if has(flags::JIT_UNMAPPED) {
            Some(false)
        } else {
            None
        },
        vm_state: s.vm_state,
        frames: s.frames,
        kind: crate::SampleKind::Cpu,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_and_samples_round_trip() {
        let frames = [
            Frame::named("main", Some("app".into()), FrameKind::User),
            Frame {
                lines: Some(LuaLines {
                    first: 9,
                    current: 12,
                }),
                jit: true,
                ..Frame::named("hot app.lua:9", Some("app.lua".into()), FrameKind::Lua)
            },
            Frame::named("do_syscall_64", None, FrameKind::Kernel),
        ];
        for f in &frames {
            assert_eq!(&frame(&resolved_frame(f)), f);
        }
        let sample = ProfileSample {
            time_ns: 5,
            pid: 1,
            tid: 2,
            thread: 0,
            frames: vec![0, 1, 2],
            end: StackEnd::Truncated,
            kernel_mode: true,
            vm_state: Some(-3),
            jit_mapped: Some(false),
            kind: crate::SampleKind::Cpu,
        };
        assert_eq!(profile_sample(resolved_sample(&sample)), sample);
    }
}
