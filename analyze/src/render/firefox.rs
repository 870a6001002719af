//! The Firefox Profiler's processed profile format, built with samply's
//! `fxprof-processed-profile` crate: a process per pid, a track per thread, every sample at
//! its time, frames colored by category (Lua, with its interpreted, JIT-compiled,
//! JIT compiler, GC and C subcategories; C / native; Kernel), the
//! capture's counts and warnings as markers on the main thread, and each call that
//! `lrec --latency-events` timed as a marker on its thread. profiler.firefox.com and the
//! Perfetto UI open it.
//!
//! The profile holds names, not addresses, so every frame is a label.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};

use fxprof_processed_profile::{
    CategoryColor, CategoryHandle, CategoryPairHandle, CpuDelta, Frame as FxFrame, FrameFlags,
    FrameInfo, ProcessHandle, Profile as FxProfile, ReferenceTimestamp, SamplingInterval,
    StackHandle, StringHandle, ThreadHandle, Timestamp,
};
use rustc_hash::FxHashMap;

mod markers;
mod sources;

use super::TRUNCATED_FRAME;
use crate::lua::luajit;
use crate::{Frame, FrameId, FrameKind, Profile};

/// Writes the profile as Firefox Profiler JSON.
pub fn write_firefox(profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
    let mut v = serde_json::to_value(firefox_profile(profile))?;
    sources::add_sources(&mut v, profile);
    serde_json::to_writer(out, &v).map_err(io::Error::from)
}

/// The profile in the crate's model, which serializes to the processed format.
fn firefox_profile(profile: &Profile) -> FxProfile {
    let clock = Clock::new(profile);
    let period_ns = super::period_ns(profile.header.frequency_hz).map(|p| p as u64);
    // An unknown period: the Firefox Profiler's own default interval.
    let interval = SamplingInterval::from_nanos(period_ns.unwrap_or(1_000_000));
    let mut fx = FxProfile::new(&super::command(profile), clock.reference, interval);
    // Frames are labels: there is nothing left to symbolicate.
    fx.set_symbolicated(true);
    if !profile.header.kernel_release.is_empty() {
        fx.set_os_name(&format!("Linux {}", profile.header.kernel_release));
    }
    let categories = Categories::add(&mut fx);
    let tracks = tracks(profile);
    let threads = add_threads(profile, &tracks, &clock, &mut fx);

    // cpu-clock fires only while the thread runs: each sample is one period on the CPU
    // (none claimed when the period is unknown).
    let cpu_delta = period_ns.map_or(CpuDelta::ZERO, CpuDelta::from_nanos);
    let names: Vec<StringHandle> = profile
        .app_names()
        .iter()
        .map(|n| fx.intern_string(n))
        .collect();
    let truncated = fx.intern_string(TRUNCATED_FRAME);
    let mut order: Vec<usize> = (0..profile.samples.len()).collect();
    order.sort_by_key(|&i| profile.samples[i].time_ns);
    type StackKey<'a> = (usize, bool, Option<&'static str>, &'a [FrameId]);
    let mut stacks: FxHashMap<StackKey, Option<StackHandle>> = FxHashMap::default();
    let mut infos = Vec::new();
    for s in order.into_iter().map(|i| &profile.samples[i]) {
        let thread = threads[s.thread];
        let state = s.vm_state.and_then(luajit::state_frame);
        let key = (s.thread, s.truncated(), state, s.frames.as_slice());
        let stack = *stacks.entry(key).or_insert_with(|| {
            infos.clear();
            if s.truncated() {
                infos.push(label(truncated, CategoryHandle::OTHER.into(), false));
            }
            let frames: Vec<&Frame> = s.frames.iter().map(|&id| profile.frame(id)).collect();
            let of_frame = categories.of_stack(&frames, state);
            for ((f, &id), category) in frames.iter().zip(&s.frames).zip(of_frame) {
                let lua = f.kind == FrameKind::Lua;
                infos.push(label(names[id as usize], category, lua));
            }
            fx.intern_stack_frames(thread, infos.drain(..))
        });
        // Off-CPU and wall profiles weigh each sample in microseconds (as the other
        // outputs do); time off CPU is no CPU time.
        let on_cpu = if s.off_cpu().is_some() {
            CpuDelta::ZERO
        } else {
            cpu_delta
        };
        let weight = i32::try_from(profile.weight(s)).unwrap_or(i32::MAX);
        fx.add_sample(thread, clock.at(s.time_ns), stack, on_cpu, weight);
    }
    if let Some(main) = main_thread(profile) {
        markers::add_markers(profile, &clock, &mut fx, threads[main]);
    }
    if let Some(l) = &profile.latency {
        let by_thread = tracks.iter().zip(&threads);
        let by_thread = by_thread
            .map(|(t, &handle)| ((t.pid, t.tid), handle))
            .collect();
        markers::add_latency_markers(l, &clock, &mut fx, &by_thread);
    }
    fx
}

fn label(name: StringHandle, category_pair: CategoryPairHandle, lua: bool) -> FrameInfo {
    FrameInfo {
        frame: FxFrame::Label(name),
        category_pair,
        // The profiler's "JavaScript" stack filter then shows the Lua frames alone.
        flags: if lua {
            FrameFlags::IS_JS
        } else {
            FrameFlags::empty()
        },
    }
}

/// Sample times on the profile's clock: nanoseconds since the recording started.
struct Clock {
    reference: ReferenceTimestamp,
    /// The CLOCK_MONOTONIC time the reference stands for.
    base_ns: u64,
}

impl Clock {
    fn new(profile: &Profile) -> Clock {
        let h = &profile.header;
        let first = profile.samples.iter().map(|s| s.time_ns).min();
        // The recording's start, unless the capture does not know it or a sample came
        // earlier (timestamps are unsigned offsets).
        let base_ns = match (h.monotonic_start_ns, first) {
            (0, first) => first.unwrap_or(0),
            (start, Some(first)) => start.min(first),
            (start, None) => start,
        };
        let wall_ns =
            h.wall_clock_start_ns as f64 - h.monotonic_start_ns.saturating_sub(base_ns) as f64;
        Clock {
            reference: ReferenceTimestamp::from_millis_since_unix_epoch(wall_ns / 1e6),
            base_ns,
        }
    }

    fn at(&self, time_ns: u64) -> Timestamp {
        Timestamp::from_nanos_since_reference(time_ns.saturating_sub(self.base_ns))
    }
}

/// The frame categories, as the profiler colors them. Everything a Lua VM runs is one
/// "Lua" category, split into subcategories: a call node whose samples ran both
/// interpreted and compiled (or a C function called from Lua, in and out of the GC) keeps
/// the Lua colour, and the split shows in the category breakdown.
struct Categories {
    lua: CategoryPairHandle,
    jit_compiled: CategoryPairHandle,
    jit_compiler: CategoryPairHandle,
    gc: CategoryPairHandle,
    /// Native code above the innermost Lua frame: C functions and FFI calls made from
    /// Lua, and the VM's own helpers.
    lua_c: CategoryPairHandle,
    native: CategoryPairHandle,
    kernel: CategoryPairHandle,
}

impl Categories {
    fn add(fx: &mut FxProfile) -> Categories {
        let lua = fx.add_category("Lua", CategoryColor::Yellow);
        Categories {
            lua: fx.add_subcategory(lua, "interpreted"),
            jit_compiled: fx.add_subcategory(lua, "JIT-compiled"),
            jit_compiler: fx.add_subcategory(lua, "JIT compiler"),
            gc: fx.add_subcategory(lua, "GC"),
            lua_c: fx.add_subcategory(lua, "C"),
            native: fx.add_category("C / native", CategoryColor::Blue).into(),
            kernel: fx.add_category("Kernel", CategoryColor::Orange).into(),
        }
    }

    /// The category of each frame of a stack (root first) sampled in Lua VM state
    /// `state` (its frame's label, `[GC]`, `[JIT compiler]`): by kind; native frames
    /// above the innermost Lua frame are Lua's C work, or the state's.
    fn of_stack(&self, frames: &[&Frame], state: Option<&str>) -> Vec<CategoryPairHandle> {
        let innermost_lua = frames.iter().rposition(|f| f.kind == FrameKind::Lua);
        let state = state.and_then(|s| self.of_state(s));
        frames
            .iter()
            .enumerate()
            .map(|(i, f)| match f.kind {
                FrameKind::Kernel | FrameKind::Wait => self.kernel,
                FrameKind::Lua => match self.of_state(&f.function) {
                    Some(category) => category,
                    None if f.jit => self.jit_compiled,
                    None => self.lua,
                },
                FrameKind::User | FrameKind::Inlined => match innermost_lua {
                    Some(l) if l < i => state.unwrap_or(self.lua_c),
                    _ => self.native,
                },
            })
            .collect()
    }

    /// The category of a VM state's frame label.
    fn of_state(&self, label: &str) -> Option<CategoryPairHandle> {
        match label {
            luajit::GC_FRAME => Some(self.gc),
            luajit::JIT_COMPILER_FRAME => Some(self.jit_compiler),
            _ => None,
        }
    }
}

/// A thread's track: a thread of the profile, or one with timed calls only.
struct Track<'a> {
    pid: u32,
    tid: u32,
    name: &'a str,
    /// Its first sample or timed call (`u64::MAX`: none).
    first_ns: u64,
}

/// The tracks of [`Profile::threads`], in their order, then of the threads that
/// `lrec --latency-events` timed calls of but no sample caught.
fn tracks(profile: &Profile) -> Vec<Track<'_>> {
    let mut tracks: Vec<Track> = profile
        .threads
        .iter()
        .map(|t| Track {
            pid: t.pid,
            tid: t.tid,
            name: &t.name,
            first_ns: u64::MAX,
        })
        .collect();
    for s in &profile.samples {
        tracks[s.thread].first_ns = tracks[s.thread].first_ns.min(s.time_ns);
    }
    let sampled: BTreeSet<(u32, u32)> = tracks.iter().map(|t| (t.pid, t.tid)).collect();
    let mut timed_only: BTreeMap<(u32, u32), Track> = BTreeMap::new();
    if let Some(l) = &profile.latency {
        for c in &l.calls {
            if sampled.contains(&(c.pid, c.tid)) {
                continue;
            }
            let track = timed_only.entry((c.pid, c.tid)).or_insert_with(|| Track {
                pid: c.pid,
                tid: c.tid,
                name: l
                    .thread_names
                    .get(&(c.pid, c.tid))
                    .map_or("", String::as_str),
                first_ns: u64::MAX,
            });
            track.first_ns = track.first_ns.min(c.start_ns);
        }
    }
    tracks.extend(timed_only.into_values());
    tracks
}

/// A process per pid (named as the process is) and a thread per track, in order. A
/// process whose main thread has no track gets it, empty and named as the process: the
/// app draws a process as its main thread's track, and without one it draws a nameless
/// empty track above the process's threads.
fn add_threads(
    profile: &Profile,
    tracks: &[Track],
    clock: &Clock,
    fx: &mut FxProfile,
) -> Vec<ThreadHandle> {
    let mut processes: BTreeMap<u32, (ProcessHandle, &str, u64)> = BTreeMap::new();
    let handles = tracks
        .iter()
        .map(|t| {
            let (process, ..) = *processes.entry(t.pid).or_insert_with(|| {
                // The process's own name, not a thread's: its main thread may not have run.
                let of_pid = || tracks.iter().filter(|u| u.pid == t.pid);
                let main = of_pid().find(|u| u.tid == u.pid).map(|u| u.name);
                let name = match profile.processes.get(&t.pid) {
                    Some(name) => name.as_str(),
                    None => main.unwrap_or(t.name),
                };
                let start = of_pid().map(|u| u.first_ns).min().unwrap_or(u64::MAX);
                (fx.add_process(name, t.pid, clock.at(start)), name, start)
            });
            let thread = fx.add_thread(process, t.tid, clock.at(t.first_ns), t.tid == t.pid);
            fx.set_thread_name(thread, t.name);
            thread
        })
        .collect();
    for (&pid, &(process, name, start)) in &processes {
        if !tracks.iter().any(|t| t.pid == pid && t.tid == pid) {
            let main = fx.add_thread(process, pid, clock.at(start), true);
            fx.set_thread_name(main, name);
        }
    }
    handles
}

/// The thread that carries the capture's markers: the recorded process's main thread,
/// else any main thread, else the busiest.
fn main_thread(profile: &Profile) -> Option<usize> {
    let threads = &profile.threads;
    let target = profile.header.target_pid;
    profile
        .main_thread(target)
        .or_else(|| threads.iter().position(|t| t.tid == t.pid))
        .or_else(|| (0..threads.len()).max_by_key(|&i| threads[i].samples))
}

#[cfg(test)]
mod tests;
