//! Collapsed stacks (`root;…;leaf COUNT`), the input format of flame graph tools.

use std::collections::BTreeMap;
use std::io::{self, Write};

use rustc_hash::FxHashMap;

use super::{StackOptions, TRUNCATED_FRAME};
use crate::{FrameId, Profile};

/// Each distinct stack line (without count) and its weight (samples, or microseconds for
/// off-CPU and wall-clock profiles), sorted lexicographically so that output is
/// deterministic.
pub fn folded_stacks(profile: &Profile, opts: StackOptions) -> BTreeMap<String, u64> {
    // Count distinct (thread, truncated, frames) first: far fewer than samples.
    let mut distinct: FxHashMap<(usize, bool, &[FrameId]), u64> = FxHashMap::default();
    for sample in &profile.samples {
        let thread = if opts.thread_names || opts.per_pid {
            sample.thread
        } else {
            0
        };
        *distinct
            .entry((thread, sample.truncated(), &sample.frames))
            .or_default() += profile.weight(sample);
    }
    let names: Vec<String> = profile
        .display_names()
        .iter()
        .map(|n| sanitize(n))
        .collect();
    let mut stacks: BTreeMap<String, u64> = BTreeMap::new();
    for ((thread, truncated, frames), count) in distinct {
        let mut parts: Vec<&str> = Vec::with_capacity(frames.len() + 2);
        let (thread_name, process);
        if opts.per_pid {
            let t = &profile.threads[thread];
            let name = profile
                .main_thread(t.pid)
                .map_or(t, |i| &profile.threads[i]);
            process = sanitize(&format!("{} [{}]", name.name, t.pid));
            parts.push(&process);
        }
        if opts.thread_names {
            thread_name = sanitize(&profile.threads[thread].name);
            parts.push(&thread_name);
        }
        if truncated {
            parts.push(TRUNCATED_FRAME);
        }
        parts.extend(frames.iter().map(|&id| names[id as usize].as_str()));
        let line = if parts.is_empty() {
            "[unknown]".to_string()
        } else {
            parts.join(";")
        };
        *stacks.entry(line).or_default() += count;
    }
    stacks
}

/// The `stack COUNT` lines, sorted.
pub fn folded_lines(profile: &Profile, opts: StackOptions) -> Vec<String> {
    folded_stacks(profile, opts)
        .into_iter()
        .map(|(stack, count)| format!("{stack} {count}"))
        .collect()
}

/// Writes `stack COUNT` lines.
pub fn write_folded(profile: &Profile, opts: StackOptions, out: &mut dyn Write) -> io::Result<()> {
    for line in folded_lines(profile, opts) {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// Makes a name (from the target: a Lua chunk name, a symbol) safe in a folded line, where
/// `;` separates frames, a line break ends the stack and the last one or two
/// space-separated numbers are counts (inferno reads `stack BEFORE AFTER` as a difference):
/// `;` becomes `:`, a line break a space, and a name ending in a space and a number keeps
/// the number behind `_` instead (`frame 12` → `frame_12`), so that it cannot be read as a
/// count. Nothing else changes; the README's "Folded stacks" says the same.
pub fn sanitize(name: &str) -> String {
    let mut s = name.replace(';', ":").replace(['\n', '\r'], " ");
    if let Some(at) = s.rfind(' ') {
        let tail = &s[at + 1..];
        let number = !tail.is_empty()
            && tail.bytes().all(|b| b.is_ascii_digit() || b == b'.')
            && tail.bytes().any(|b| b.is_ascii_digit());
        if number {
            s.replace_range(at..=at, "_");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Frame, FrameKind, ProfileSample, Thread};

    fn frame(name: &str, kind: FrameKind) -> Frame {
        Frame::named(name, None, kind)
    }

    fn sample(thread: usize, frames: &[u32], truncated: bool) -> ProfileSample {
        let ids = (1, 1 + thread as u32, thread);
        crate::render::test_util::sample(ids, 0, frames, truncated)
    }

    fn profile() -> Profile {
        Profile {
            frames: vec![
                frame("main", FrameKind::User),
                frame("work", FrameKind::User),
                frame("inlined_helper", FrameKind::Inlined),
                frame("do_syscall_64", FrameKind::Kernel),
                frame("odd;name", FrameKind::User),
                frame("entry_SYSCALL_64", FrameKind::Kernel),
            ],
            threads: vec![
                Thread {
                    pid: 1,
                    tid: 1,
                    name: "app".into(),
                    samples: 4,
                },
                Thread {
                    pid: 1,
                    tid: 2,
                    name: "worker".into(),
                    samples: 2,
                },
            ],
            samples: vec![
                sample(0, &[0, 1, 2], false),
                sample(1, &[0, 1], false),
                sample(0, &[0, 1, 2], false),
                sample(0, &[0, 1, 5, 3], false),
                sample(0, &[4], true),
                sample(1, &[0, 1], false),
            ],
            ..Profile::default()
        }
    }

    #[test]
    fn folded_is_sorted_counted_and_marks_kernel_and_truncation() {
        let mut out = Vec::new();
        write_folded(&profile(), StackOptions::default(), &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "app;[truncated];odd:name 1\n\
             app;main;work;entry_SYSCALL_64_[k];do_syscall_64_[k] 1\n\
             app;main;work;inlined_helper 2\n\
             worker;main;work 2\n"
        );
    }

    #[test]
    fn names_cannot_forge_frames_or_counts() {
        // What a target controls: chunk names and symbols.
        let nasty = [
            "=a;b",
            "line\nbreak",
            "cr\rname",
            "tab\there",
            "frame 12",
            "frame 1.5",
            "two  spaces 7",
            "end with space ",
            "\u{fffd}not utf-8",
        ];
        for n in nasty {
            let s = sanitize(n);
            assert!(!s.contains([';', '\n', '\r']), "{s:?}");
            // Appended to a stack with a count, the count and the frame read back whole,
            // whether one or two counts are looked for (inferno's difference columns).
            let line = format!("root;{s} 3");
            let (stack, count) = line.rsplit_once(' ').unwrap();
            assert_eq!(count, "3");
            let last = stack.rsplit_once(' ').map_or("", |(_, t)| t);
            assert!(
                !last.chars().all(|c| c.is_ascii_digit() || c == '.') || last.is_empty(),
                "{line:?}"
            );
            assert_eq!(stack.split(';').count(), 2, "{line:?}");
        }
        // Through inferno (the flame graph) and the difference of two profiles.
        let mut p = profile();
        for (i, n) in nasty.iter().enumerate() {
            p.frames.push(frame(n, FrameKind::Lua));
            let id = p.frames.len() as u32 - 1;
            p.samples.push(sample(i % 2, &[0, id], false));
        }
        let total = p.samples.len();
        let mut svg = Vec::new();
        crate::render::write_flamegraph(&p, StackOptions::default(), &mut svg).unwrap();
        let svg = String::from_utf8(svg).unwrap();
        assert!(
            svg.contains(&format!("all ({total} samples, 100%)")),
            "{svg}"
        );
        assert!(svg.contains("frame_12 (1 samples"), "a name forged a count");
        let mut diff = Vec::new();
        crate::render::write_diff_folded(&p, &p, StackOptions::default(), &mut diff).unwrap();
        let diff = String::from_utf8(diff).unwrap();
        let mut before_total = 0;
        for line in diff.lines() {
            let mut tail = line.rsplitn(3, ' ');
            let (after, before) = (tail.next().unwrap(), tail.next().unwrap());
            assert_eq!(after, before, "{line}");
            before_total += before.parse::<usize>().unwrap();
        }
        assert_eq!(before_total, total);
        assert_eq!(sanitize("frame 12"), "frame_12");
        assert_eq!(sanitize("hot chains.lua:12"), "hot chains.lua:12");
        assert_eq!(sanitize("=a;b"), "=a:b");
    }

    #[test]
    fn without_thread_names_threads_merge() {
        let stacks = folded_stacks(
            &profile(),
            StackOptions {
                thread_names: false,
                per_pid: false,
            },
        );
        assert_eq!(stacks["main;work"], 2);
        assert_eq!(stacks["main;work;inlined_helper"], 2);
        assert_eq!(stacks["[truncated];odd:name"], 1);
        assert_eq!(stacks.values().sum::<u64>(), 6);
    }
}
