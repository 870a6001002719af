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

/// `;` separates frames and a newline ends a stack: neither may appear inside a name.
fn sanitize(name: &str) -> String {
    name.replace(';', ":").replace(['\n', '\r'], " ")
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
