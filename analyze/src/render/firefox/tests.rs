//! The Firefox Profiler output's shape, on a hand-made profile.
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
                let name = &names[t["funcTable"]["name"][ft["func"][f].as_u64().unwrap() as usize]
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
        json!([
            "Other",
            "interpreted",
            "JIT-compiled",
            "JIT compiler",
            "GC",
            "C"
        ])
    );
    assert_eq!(v["meta"]["interval"], 10.0);
    // The reference is the recording's start: 1e12 ns after the epoch.
    assert_eq!(v["meta"]["startTime"], 1_000_000.0);
    // Three sampled threads, and the main thread of process 5, which no sample caught.
    assert_eq!(v["threads"].as_array().unwrap().len(), 4);
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
    let main5 = thread_by_tid(&v, "5");
    assert_eq!(
        (main5["name"].as_str(), main5["processName"].as_str()),
        (Some("helper"), Some("helper"))
    );
    assert_eq!(main5["isMainThread"], true);
    assert_eq!(main5["samples"]["length"], 0);
    let mut p = profile();
    p.processes.insert(5, "lua-host".into());
    let v = render(&p);
    let helper = thread_by_tid(&v, "6");
    assert_eq!(
        (helper["name"].as_str(), helper["processName"].as_str()),
        (Some("helper"), Some("lua-host"))
    );
    assert_eq!(thread_by_tid(&v, "5")["name"], "lua-host");
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
        [
            "[JIT compiler] (Lua/JIT compiler)",
            "lj_asm (Lua/JIT compiler)"
        ]
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

/// Lua functions carry their file and line, native ones their library.
#[test]
fn functions_have_files_lines_and_libraries() {
    let mut p = profile();
    p.binaries = vec![crate::BinaryInfo {
        path: "/usr/bin/app".into(),
        build_id: Some(vec![0xab; 20]),
        ..Default::default()
    }];
    let v = render(&p);
    assert_eq!(v["meta"]["stackwalk"], 1);
    assert_eq!(v["libs"][0]["name"], "app");
    assert_eq!(v["libs"][0]["path"], "/usr/bin/app");
    assert_eq!(v["libs"][0]["codeId"], "ab".repeat(20));
    assert_eq!(v["libs"][0]["breakpadId"], format!("{}0", "AB".repeat(16)));
    let app = thread_by_tid(&v, "1");
    let (funcs, strings) = (&app["funcTable"], &app["stringArray"]);
    let string = |i: &Value| strings[i.as_u64().unwrap() as usize].as_str().unwrap();
    let n = funcs["length"].as_u64().unwrap() as usize;
    let mut seen = Vec::new();
    for i in 0..n {
        let name = string(&funcs["name"][i]);
        let file = funcs["fileName"][i]
            .as_u64()
            .map(|_| string(&funcs["fileName"][i]));
        let line = funcs["lineNumber"][i].as_u64();
        let lib = match funcs["resource"][i].as_i64().unwrap() {
            -1 => None,
            r => {
                let r = r as usize;
                assert_eq!(app["resourceTable"]["type"][r], 1);
                let lib = app["resourceTable"]["lib"][r].as_u64().unwrap() as usize;
                Some(v["libs"][lib]["name"].as_str().unwrap())
            }
        };
        seen.push((name, file, line, lib));
    }
    seen.sort();
    assert_eq!(
        seen,
        [
            ("[GC]", None, None, None),
            ("gc_step", None, None, Some("app")),
            ("hot app.lua:9", Some("app.lua"), Some(3), None),
            ("lua_pcall", None, None, Some("app")),
            ("main", None, None, Some("app")),
            ("work app.lua:3", Some("app.lua"), Some(3), None),
        ]
    );
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
    // 1/1, 1/2, 5/6, 5/5 (process 5's main thread) and the timed-only 1/3.
    assert_eq!(v["threads"].as_array().unwrap().len(), 5);
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
