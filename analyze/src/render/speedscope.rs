//! speedscope's JSON file format (<https://www.speedscope.app/file-format-schema.json>):
//! one "sampled" profile per thread, its samples in time order.
//!
//! speedscope lays a sampled profile's samples end to end, each as wide as its weight, and
//! tells frames apart by their index in `shared.frames`. So every sample weighs one
//! sampling period, a profile spans `0..` the sum of its weights (as speedscope's own
//! exporter writes), and frames that would show the same name, file and line share one
//! index (a Lua function's frames differ by current line and JIT mark, which the name shows
//! only under `--lines`/`--mark-jit`).

use std::io::{self, Write};

use serde::Serialize;

use super::TRUNCATED_FRAME;
use crate::stages::Interner;
use crate::{FrameKind, Profile, ProfileSample};

/// The `$schema` every speedscope file names.
pub const SCHEMA_URL: &str = "https://www.speedscope.app/file-format-schema.json";

#[derive(Serialize)]
struct File<'a> {
    #[serde(rename = "$schema")]
    schema: &'static str,
    name: String,
    exporter: String,
    #[serde(rename = "activeProfileIndex")]
    active_profile_index: usize,
    shared: Shared<'a>,
    profiles: Vec<SampledProfile>,
}

#[derive(Serialize)]
struct Shared<'a> {
    frames: Vec<FrameEntry<'a>>,
}

#[derive(Serialize, Clone, PartialEq, Eq, Hash)]
struct FrameEntry<'a> {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<u32>,
}

#[derive(Serialize)]
struct SampledProfile {
    #[serde(rename = "type")]
    kind: &'static str,
    name: String,
    unit: &'static str,
    #[serde(rename = "startValue")]
    start_value: u64,
    #[serde(rename = "endValue")]
    end_value: u64,
    samples: Vec<Vec<u32>>,
    weights: Vec<u64>,
}

/// Writes the profile as a speedscope JSON file.
pub fn write_speedscope(profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
    serde_json::to_writer(out, &file(profile)).map_err(io::Error::from)
}

fn file(profile: &Profile) -> File<'_> {
    let (frames, index) = frame_table(profile);
    // Without a frequency a sample weighs 1 of unit "none": a sample count.
    let (unit, period) = match (
        profile.mode.is_timed(),
        super::period_ns(profile.header.frequency_hz),
    ) {
        (true, _) => ("microseconds", None),
        (_, None) => ("none", Some(1)),
        (_, Some(p)) => ("nanoseconds", Some(p as u64)),
    };
    let mut by_thread: Vec<Vec<&ProfileSample>> = vec![Vec::new(); profile.threads.len()];
    for s in &profile.samples {
        by_thread[s.thread].push(s);
    }
    let mut profiles: Vec<SampledProfile> = profile
        .threads
        .iter()
        .zip(by_thread)
        .map(|(thread, mut samples)| {
            // Stable: samples of one instant keep the order the capture holds.
            samples.sort_by_key(|s| s.time_ns);
            let weights: Vec<u64> = samples
                .iter()
                .map(|s| period.unwrap_or_else(|| profile.weight(s)))
                .collect();
            let stacks: Vec<Vec<u32>> = samples
                .iter()
                .map(|s| {
                    let truncated = s.truncated().then_some(index.truncated);
                    truncated
                        .into_iter()
                        .chain(s.frames.iter().map(|&id| index.of_frame[id as usize]))
                        .collect()
                })
                .collect();
            SampledProfile {
                kind: "sampled",
                name: format!("{} [{}]", thread.name, thread.tid),
                unit,
                start_value: 0,
                end_value: weights.iter().sum(),
                weights,
                samples: stacks,
            }
        })
        .collect();
    // speedscope lists the profiles in this order and opens the first: the busiest
    // thread first, not a main thread that only waited (stable: ties keep thread order).
    profiles.sort_by_key(|p| std::cmp::Reverse(p.samples.len()));
    File {
        schema: SCHEMA_URL,
        name: super::program(profile),
        exporter: format!("lanalyze {}", env!("CARGO_PKG_VERSION")),
        active_profile_index: 0,
        shared: Shared { frames },
        profiles,
    }
}

/// The file of kernel frames (perf's name for the kernel's symbols).
const KERNEL_FILE: &str = "[kernel.kallsyms]";

/// Where each profile frame went in `shared.frames`.
struct FrameIndex {
    of_frame: Vec<u32>,
    truncated: u32,
}

/// speedscope's frames: one per distinct (name, file, line), plus the `[truncated]` root.
fn frame_table(profile: &Profile) -> (Vec<FrameEntry<'_>>, FrameIndex) {
    let mut table: Interner<FrameEntry> = Interner::default();
    let of_frame = profile
        .frames
        .iter()
        .zip(profile.app_names())
        .map(|(f, name)| {
            table.id(FrameEntry {
                name,
                // Kernel code: named bare, marked by its file as perf's importer does.
                file: match f.kind {
                    FrameKind::Kernel => Some(KERNEL_FILE),
                    _ => f.module.as_deref(),
                },
                // Where the Lua function is defined (0: unknown).
                line: f
                    .lines
                    .filter(|l| f.kind == FrameKind::Lua && l.first > 0)
                    .map(|l| l.first),
            })
        })
        .collect();
    let truncated = table.id(FrameEntry {
        name: TRUNCATED_FRAME.to_owned(),
        file: None,
        line: None,
    });
    let index = FrameIndex {
        of_frame,
        truncated,
    };
    (table.list, index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Frame, LuaLines, Naming, Thread};
    use serde_json::{json, Value};

    fn lua(name: &str, first: u32, current: u32, jit: bool) -> Frame {
        Frame {
            lines: Some(LuaLines { first, current }),
            jit,
            ..Frame::named(name, Some("app.lua".into()), FrameKind::Lua)
        }
    }

    fn sample(thread: usize, time_ns: u64, frames: &[u32], truncated: bool) -> ProfileSample {
        let ids = (1, [1, 2][thread], thread);
        crate::render::test_util::sample(ids, time_ns, frames, truncated)
    }

    fn profile() -> Profile {
        let mut p = Profile {
            frames: vec![
                Frame::named("main", Some("app".into()), FrameKind::User),
                lua("work app.lua:3", 3, 4, false),
                lua("work app.lua:3", 3, 5, true),
                Frame::named("do_syscall_64", None, FrameKind::Kernel),
            ],
            threads: vec![
                Thread {
                    pid: 1,
                    tid: 1,
                    name: "app".into(),
                    samples: 3,
                },
                Thread {
                    pid: 1,
                    tid: 2,
                    name: "worker".into(),
                    samples: 1,
                },
            ],
            samples: vec![
                sample(0, 30, &[0, 2], false),
                sample(1, 5, &[0, 3], false),
                sample(0, 10, &[0, 1], false),
                sample(0, 20, &[0], true),
            ],
            ..Profile::default()
        };
        p.header.frequency_hz = 100;
        p
    }

    fn render(p: &Profile) -> Value {
        let mut out = Vec::new();
        write_speedscope(p, &mut out).unwrap();
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn the_busiest_thread_comes_first_and_is_opened() {
        // A main thread that only waited (1 sample) before a busy one (3).
        let mut p = profile();
        p.threads.swap(0, 1);
        for s in &mut p.samples {
            s.thread = 1 - s.thread;
        }
        let v = render(&p);
        assert_eq!(v["activeProfileIndex"], 0);
        assert_eq!(v["profiles"][0]["name"], "app [1]");
        assert_eq!(v["profiles"][1]["name"], "worker [2]");
    }

    #[test]
    fn one_profile_per_thread_in_time_order_weighted_by_period() {
        let v = render(&profile());
        assert_eq!(v["$schema"], SCHEMA_URL);
        assert_eq!(v["activeProfileIndex"], 0);
        let frames = &v["shared"]["frames"];
        // The two `work` frames differ only by current line and JIT mark: one entry.
        assert_eq!(
            *frames,
            json!([
                {"name": "main", "file": "app"},
                {"name": "work app.lua:3", "file": "app.lua", "line": 3},
                {"name": "do_syscall_64", "file": "[kernel.kallsyms]"},
                {"name": "[truncated]"},
            ])
        );
        let app = &v["profiles"][0];
        assert_eq!(app["name"], "app [1]");
        assert_eq!(app["unit"], "nanoseconds");
        assert_eq!(app["samples"], json!([[0, 1], [3, 0], [0, 1]]));
        assert_eq!(app["weights"], json!([10_000_000, 10_000_000, 10_000_000]));
        assert_eq!(
            (app["startValue"].as_u64(), app["endValue"].as_u64()),
            (Some(0), Some(30_000_000))
        );
        assert_eq!(v["profiles"][1]["samples"], json!([[0, 2]]));
    }

    #[test]
    fn naming_splits_frames_and_zero_hz_counts_samples() {
        let mut p = profile();
        p.naming = Naming {
            lines: true,
            mark_jit: true,
        };
        p.header.frequency_hz = 0;
        let v = render(&p);
        let names: Vec<&str> = v["shared"]["frames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "main",
                "work app.lua:3@4",
                "work app.lua:3@5_[j]",
                "do_syscall_64",
                "[truncated]"
            ]
        );
        let app = &v["profiles"][0];
        assert_eq!(app["unit"], "none");
        assert_eq!(app["weights"], json!([1, 1, 1]));
        assert_eq!(app["endValue"], 3);
    }

    #[test]
    fn an_empty_profile_is_still_a_file() {
        let v = render(&Profile::default());
        assert_eq!(v["profiles"], json!([]));
        assert_eq!(v["shared"]["frames"], json!([{"name": "[truncated]"}]));
    }
}
