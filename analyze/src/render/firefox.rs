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

use super::TRUNCATED_FRAME;
use crate::lua::luajit;
use crate::{Frame, FrameId, FrameKind, Profile};

/// Writes the profile as Firefox Profiler JSON.
pub fn write_firefox(profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
    serde_json::to_writer(out, &firefox_profile(profile)).map_err(io::Error::from)
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

/// A process per pid (named as the process is) and a thread per track, in order.
fn add_threads(
    profile: &Profile,
    tracks: &[Track],
    clock: &Clock,
    fx: &mut FxProfile,
) -> Vec<ThreadHandle> {
    let mut processes: BTreeMap<u32, ProcessHandle> = BTreeMap::new();
    tracks
        .iter()
        .map(|t| {
            let process = *processes.entry(t.pid).or_insert_with(|| {
                // The process's own name, not a thread's: its main thread may not have run.
                let of_pid = || tracks.iter().filter(|u| u.pid == t.pid);
                let main = of_pid().find(|u| u.tid == u.pid).map(|u| u.name);
                let name = match profile.processes.get(&t.pid) {
                    Some(name) => name.as_str(),
                    None => main.unwrap_or(t.name),
                };
                let start = of_pid().map(|u| u.first_ns).min().unwrap_or(u64::MAX);
                fx.add_process(name, t.pid, clock.at(start))
            });
            let thread = fx.add_thread(process, t.tid, clock.at(t.first_ns), t.tid == t.pid);
            fx.set_thread_name(thread, t.name);
            thread
        })
        .collect()
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
mod tests {
    use super::*;
    use crate::{LuaLines, ProfileSample, StackEnd, Thread, Warning};
    use serde_json::{json, Value};

    fn lua(name: &str, jit: bool) -> Frame {
        Frame {
            lines: Some(LuaLines {
                first: 3,
                current: 4,
            }),
            jit,
            ..Frame::named(name, Some("app.lua".into()), FrameKind::Lua)
        }
    }

    fn native(name: &str) -> Frame {
        Frame::named(name, Some("app".into()), FrameKind::User)
    }

    fn sample(thread: usize, time_ns: u64, frames: &[u32]) -> ProfileSample {
        let (pid, tid) = [(1, 1), (1, 2), (5, 6)][thread];
        crate::render::test_util::sample((pid, tid, thread), time_ns, frames, false)
    }

    fn thread(pid: u32, tid: u32, name: &str, samples: u64) -> Thread {
        Thread {
            pid,
            tid,
            name: name.into(),
            samples,
        }
    }

    fn profile() -> Profile {
        let gc = |s: ProfileSample| ProfileSample {
            vm_state: Some(-3),
            ..s
        };
        let mut p = Profile {
            frames: vec![
                native("main"),
                native("lua_pcall"),
                lua("work app.lua:3", false),
                lua("hot app.lua:9", true),
                Frame::named("[GC]", None, FrameKind::Lua),
                native("gc_step"),
                Frame::named("do_syscall_64", None, FrameKind::Kernel),
                Frame::named("[JIT compiler]", None, FrameKind::Lua),
                native("lj_asm"),
            ],
            threads: vec![
                thread(1, 1, "app", 3),
                thread(1, 2, "worker", 1),
                thread(5, 6, "helper", 1),
            ],
            samples: vec![
                sample(0, 30, &[0, 1, 2, 3]),
                gc(sample(0, 10, &[0, 1, 2, 4, 5])),
                sample(0, 20, &[0, 1, 2, 5]),
                ProfileSample {
                    end: StackEnd::Truncated,
                    ..sample(1, 15, &[0, 6])
                },
                ProfileSample {
                    vm_state: Some(-5),
                    ..sample(2, 40, &[0, 1, 2, 7, 8])
                },
            ],
            warnings: vec![Warning {
                message: "something odd".into(),
                count: 2,
            }],
            ..Profile::default()
        };
        p.header.frequency_hz = 100;
        p.header.target_pid = 1;
        p.header.monotonic_start_ns = 5;
        p.header.wall_clock_start_ns = 1_000_000_000_000;
        p.stats.samples = 5;
        p.stats.lost = 3;
        p
    }

    fn render(p: &Profile) -> Value {
        let mut out = Vec::new();
        write_firefox(p, &mut out).unwrap();
        serde_json::from_slice(&out).unwrap()
    }

    fn thread_by_tid<'a>(v: &'a Value, tid: &str) -> &'a Value {
        let threads = v["threads"].as_array().unwrap();
        threads.iter().find(|t| t["tid"] == tid).unwrap()
    }

    /// Each sample's stack, root first, as `name (category[/subcategory])`.
    fn stacks(v: &Value, t: &Value) -> Vec<Vec<String>> {
        let categories = &v["meta"]["categories"];
        let (st, ft, names) = (&t["stackTable"], &t["frameTable"], &t["stringArray"]);
        let samples = t["samples"]["stack"].as_array().unwrap();
        samples
            .iter()
            .map(|s| {
                let mut frames = Vec::new();
                let mut stack = s.as_u64();
                while let Some(i) = stack.map(|i| i as usize) {
                    let f = st["frame"][i].as_u64().unwrap() as usize;
                    let name = &names[t["funcTable"]["name"]
                        [ft["func"][f].as_u64().unwrap() as usize]
                        .as_u64()
                        .unwrap() as usize];
                    let c = &categories[ft["category"][f].as_u64().unwrap() as usize];
                    let sub = match ft["subcategory"][f].as_u64().unwrap() as usize {
                        0 => String::new(),
                        n => format!("/{}", c["subcategories"][n].as_str().unwrap()),
                    };
                    frames.push(format!(
                        "{} ({}{sub})",
                        name.as_str().unwrap(),
                        c["name"].as_str().unwrap()
                    ));
                    stack = st["prefix"][i].as_u64();
                }
                frames.reverse();
                frames
            })
            .collect()
    }

    #[test]
    fn threads_processes_and_times() {
        let v = render(&profile());
        let names: Vec<&str> = v["meta"]["categories"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["Other", "Lua", "C / native", "Kernel"]);
        assert_eq!(
            v["meta"]["categories"][1]["subcategories"],
            json!(["Other", "interpreted", "JIT-compiled", "JIT compiler", "GC", "C"])
        );
        assert_eq!(v["meta"]["interval"], 10.0);
        // The reference is the recording's start: 1e12 ns after the epoch.
        assert_eq!(v["meta"]["startTime"], 1_000_000.0);
        assert_eq!(v["threads"].as_array().unwrap().len(), 3);
        let app = thread_by_tid(&v, "1");
        assert_eq!(
            (app["pid"].as_str(), app["isMainThread"].as_bool()),
            (Some("1"), Some(true))
        );
        assert_eq!(app["name"], "app");
        assert_eq!(app["samples"]["length"], 3);
        // 10, 20, 30 ns after the start at 5 ns, in milliseconds.
        assert_eq!(app["samples"]["timeDeltas"], json!([5e-6, 1e-5, 1e-5]));
        assert_eq!(
            app["samples"]["threadCPUDelta"],
            json!([10_000, 10_000, 10_000])
        );
        let worker = thread_by_tid(&v, "2");
        assert_eq!(
            (worker["name"].as_str(), worker["processName"].as_str()),
            (Some("worker"), Some("app"))
        );
        assert_eq!(worker["isMainThread"], false);
        // A process whose main thread was never sampled: named after a thread only when
        // the capture does not name the process.
        let helper = thread_by_tid(&v, "6");
        assert_eq!(
            (helper["pid"].as_str(), helper["processName"].as_str()),
            (Some("5"), Some("helper"))
        );
        assert_eq!(helper["isMainThread"], false);
        let mut p = profile();
        p.processes.insert(5, "lua-host".into());
        let v = render(&p);
        let helper = thread_by_tid(&v, "6");
        assert_eq!(
            (helper["name"].as_str(), helper["processName"].as_str()),
            (Some("helper"), Some("lua-host"))
        );
    }

    #[test]
    fn frames_are_categorized_by_kind_and_vm_state() {
        let v = render(&profile());
        assert_eq!(
            stacks(&v, thread_by_tid(&v, "1")),
            [
                vec![
                    "main (C / native)",
                    "lua_pcall (C / native)",
                    "work app.lua:3 (Lua/interpreted)",
                    "[GC] (Lua/GC)",
                    "gc_step (Lua/GC)"
                ],
                vec![
                    "main (C / native)",
                    "lua_pcall (C / native)",
                    "work app.lua:3 (Lua/interpreted)",
                    "gc_step (Lua/C)"
                ],
                vec![
                    "main (C / native)",
                    "lua_pcall (C / native)",
                    "work app.lua:3 (Lua/interpreted)",
                    "hot app.lua:9 (Lua/JIT-compiled)"
                ],
            ]
        );
        assert_eq!(
            stacks(&v, thread_by_tid(&v, "2")),
            [vec![
                "[truncated] (Other)",
                "main (C / native)",
                "do_syscall_64 (Kernel)"
            ]]
        );
        assert_eq!(
            stacks(&v, thread_by_tid(&v, "6"))[0][3..],
            ["[JIT compiler] (Lua/JIT compiler)", "lj_asm (Lua/JIT compiler)"]
        );
        // Lua frames are the profiler's "JavaScript" frames.
        let app = thread_by_tid(&v, "1");
        let names = &app["stringArray"];
        let funcs = &app["funcTable"];
        for (i, js) in funcs["isJS"].as_array().unwrap().iter().enumerate() {
            let name = names[funcs["name"][i].as_u64().unwrap() as usize]
                .as_str()
                .unwrap();
            assert_eq!(
                js.as_bool().unwrap(),
                name.contains(".lua") || name == "[GC]",
                "{name}"
            );
        }
    }

    #[test]
    fn counts_and_warnings_are_markers_on_the_main_thread() {
        let v = render(&profile());
        let app = thread_by_tid(&v, "1");
        let markers = &app["markers"];
        let names: Vec<&str> = markers["name"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                app["stringArray"][n.as_u64().unwrap() as usize]
                    .as_str()
                    .unwrap()
            })
            .collect();
        assert_eq!(names, ["Capture", "Lost samples", "Warning"]);
        assert_eq!(markers["data"][0]["lost"], 3.0);
        // String fields are indices into the thread's strings.
        let string = |v: &Value| app["stringArray"][v.as_u64().unwrap() as usize].clone();
        assert_eq!(
            string(&markers["data"][0]["ended"]),
            "cut short (no end record)"
        );
        assert_eq!(markers["data"][1]["lost"], 3.0);
        assert_eq!(string(&markers["data"][2]["message"]), "something odd");
        assert_eq!(markers["data"][2]["count"], 2.0);
        assert_eq!(thread_by_tid(&v, "2")["markers"]["length"], 0);
    }

    #[test]
    fn timed_calls_are_interval_markers_on_their_threads() {
        let mut p = profile();
        let probe = lrec_format::LatencyProbe {
            id: 3,
            name: "slow_op".into(),
            ..Default::default()
        };
        let call = |tid, start_ns| lrec_format::LatencyCall {
            probe: 3,
            pid: 1,
            tid,
            start_ns,
            duration_ns: 1_000_000,
        };
        p.latency = Some(crate::Latencies {
            record: lrec_format::Latency {
                probes: vec![probe],
                ..Default::default()
            },
            // Thread 1/3 was not sampled: it gets a track of its own.
            calls: vec![call(2, 5 + 2_000_000), call(3, 5)],
            thread_names: [((1, 3), "timer".to_string())].into(),
            start_ns: 5,
        });
        let v = render(&p);
        assert_eq!(v["threads"].as_array().unwrap().len(), 4);
        for (tid, start) in [("2", 2.0), ("3", 0.0)] {
            let t = thread_by_tid(&v, tid);
            let markers = &t["markers"];
            assert_eq!(markers["length"], 1, "{tid}");
            let name = markers["name"][0].as_u64().unwrap() as usize;
            assert_eq!(t["stringArray"][name], "slow_op");
            assert_eq!(markers["startTime"][0], start);
            assert_eq!(markers["endTime"][0], start + 1.0);
        }
        let timer = thread_by_tid(&v, "3");
        assert_eq!(
            (timer["name"].as_str(), timer["processName"].as_str()),
            (Some("timer"), Some("app"))
        );
    }

    #[test]
    fn an_empty_profile_is_still_a_profile() {
        let v = render(&Profile::default());
        assert_eq!(v["threads"], json!([]));
    }
}
