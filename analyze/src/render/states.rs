//! Thread states (`lrec --states`): an xtop-like table of average active threads by any
//! grouping, and CSV rows for DuckDB or pandas.

use std::collections::{BTreeSet, HashMap};
use std::io::{self, Write};

use super::csv;
use crate::syscalls::syscall_name;
use crate::{FrameKind, Profile, ProfileSample, SampleKind, ThreadState};

/// A column thread states can be grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StateKey {
    /// running, runnable, sleeping, disk sleep, …
    State,
    /// The system call the thread is in.
    Syscall,
    /// Where in the kernel it waits (its innermost kernel function outside the scheduler).
    Wchan,
    /// The thread's name.
    Comm,
    Pid,
    Tid,
    /// The user function it is in while in the kernel (system call, fault, preemption).
    Leaf,
    /// The innermost Lua function of its stack: known while it is blocked in an interval
    /// that `lrec --off-cpu` recorded (with `--off-cpu --states`), else `-`.
    Lua,
}

/// Kernel functions a blocked task passes through on its way to the scheduler; the wait
/// channel is the first frame outside them, as /proc/PID/wchan reports it.
const SCHEDULER: &[&str] = &[
    "__schedule",
    "schedule",
    "__switch_to",
    "preempt_schedule",
    "io_schedule",
    "do_nanosleep",
    "__cond_resched",
    "__mutex_lock",
    "mutex_lock",
    "rwsem_down_",
    "wait_for_completion",
    "__wait_for_common",
    "usleep_range",
    "finish_task_switch",
];

fn in_scheduler(name: &str) -> bool {
    SCHEDULER.iter().any(|p| name.starts_with(p))
}

/// `ps`'s letter spelled out; a thread in state R is running when it is on a CPU and
/// waits for one otherwise.
fn state_name(t: &ThreadState) -> &'static str {
    match t.state {
        'R' if t.on_cpu => "running",
        'R' => "runnable",
        'S' => "sleeping",
        'D' => "disk sleep",
        'I' => "idle",
        'T' | 't' => "stopped",
        'Z' => "zombie",
        'X' => "dead",
        'P' => "parked",
        _ => "unknown",
    }
}

/// One thread-state sample's columns.
struct Row<'a> {
    sample: &'a ProfileSample,
    state: ThreadState,
    wchan: &'a str,
    leaf: &'a str,
    lua: &'a str,
}

impl Row<'_> {
    fn value(&self, key: StateKey, profile: &Profile) -> String {
        let s = self.sample;
        match key {
            StateKey::State => state_name(&self.state).to_string(),
            StateKey::Syscall => syscall(&self.state),
            StateKey::Wchan => self.wchan.to_string(),
            StateKey::Comm => profile.thread_name(s).to_string(),
            StateKey::Pid => s.pid.to_string(),
            StateKey::Tid => s.tid.to_string(),
            StateKey::Leaf => self.leaf.to_string(),
            StateKey::Lua => self.lua.to_string(),
        }
    }
}

fn syscall(t: &ThreadState) -> String {
    match t.syscall {
        None => "-".to_string(),
        Some(nr) => syscall_name(nr).map_or_else(|| format!("syscall_{nr}"), str::to_string),
    }
}

fn rows<'a>(profile: &'a Profile, names: &'a [String]) -> Vec<Row<'a>> {
    profile
        .samples
        .iter()
        .filter_map(|s| {
            let SampleKind::State(state) = s.kind else {
                return None;
            };
            let frame = |id: &&u32| profile.frame(**id);
            let wchan = s
                .frames
                .iter()
                .rev()
                .filter(|id| frame(id).kind == FrameKind::Kernel)
                .map(|&id| profile.frame(id).function.as_str())
                .find(|name| !in_scheduler(name))
                .unwrap_or("-");
            let innermost = |kinds: &[FrameKind]| {
                s.frames
                    .iter()
                    .rfind(|id| kinds.contains(&frame(id).kind))
                    .map_or("-", |&id| names[id as usize].as_str())
            };
            Some(Row {
                sample: s,
                state,
                wchan,
                leaf: innermost(&[FrameKind::User, FrameKind::Inlined]),
                lua: innermost(&[FrameKind::Lua]),
            })
        })
        .collect()
}

/// Writes the average number of threads in each group (xtop's "average active
/// threads"): samples of the group divided by the number of thread-state samples taken.
pub fn write_states(profile: &Profile, keys: &[StateKey], out: &mut dyn Write) -> io::Result<()> {
    let names = profile.display_names();
    let rows = rows(profile, &names);
    if rows.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the capture holds no thread states: record with `lrec --states`",
        ));
    }
    let snapshots = rows
        .iter()
        .map(|r| r.sample.time_ns)
        .collect::<BTreeSet<u64>>();
    let mut groups: HashMap<Vec<String>, u64> = HashMap::new();
    for r in &rows {
        let key = keys.iter().map(|&k| r.value(k, profile)).collect();
        *groups.entry(key).or_default() += 1;
    }
    let mut groups: Vec<(Vec<String>, u64)> = groups.into_iter().collect();
    groups.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let n = snapshots.len() as f64;
    let span = match (snapshots.first(), snapshots.last()) {
        (Some(a), Some(b)) => (b - a) as f64 / 1e9,
        _ => 0.0,
    };
    writeln!(
        out,
        "{} thread-state samples over {span:.1} s, {} threads each on average",
        snapshots.len(),
        format_avg(rows.len() as f64 / n)
    )?;
    let headers: Vec<String> = keys
        .iter()
        .map(|k| format!("{k:?}").to_uppercase())
        .collect();
    let mut widths: Vec<usize> = headers.iter().map(String::len).collect();
    for (key, _) in &groups {
        for (w, v) in widths.iter_mut().zip(key) {
            *w = (*w).max(v.len()).min(60);
        }
    }
    write!(out, "{:>11} {:>6}", "AVG_THREADS", "%")?;
    for (h, w) in headers.iter().zip(&widths) {
        write!(out, "  {h:<w$}")?;
    }
    writeln!(out)?;
    for (key, count) in &groups {
        let avg = *count as f64 / n;
        let pct = 100.0 * *count as f64 / rows.len() as f64;
        write!(out, "{:>11} {pct:>5.1}%", format_avg(avg))?;
        for (v, w) in key.iter().zip(&widths) {
            write!(out, "  {v:<w$}")?;
        }
        writeln!(out)?;
    }
    Ok(())
}

fn format_avg(v: f64) -> String {
    format!("{v:.2}")
}

/// Writes one CSV row per thread per thread-state sample.
pub fn write_states_csv(profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
    let names = profile.display_names();
    let start = profile.header.monotonic_start_ns;
    writeln!(
        out,
        "time_s,pid,tid,comm,state,on_cpu,syscall,syscall_ms,wchan,leaf,lua"
    )?;
    for r in rows(profile, &names) {
        let s = r.sample;
        let in_syscall_ms = r
            .state
            .syscall_ns
            .map_or(String::new(), |ns| format!("{:.3}", ns as f64 / 1e6));
        writeln!(
            out,
            "{:.6},{},{},{},{},{},{},{},{},{},{}",
            s.time_ns.saturating_sub(start) as f64 / 1e9,
            s.pid,
            s.tid,
            csv(profile.thread_name(s)),
            state_name(&r.state),
            r.state.on_cpu,
            syscall(&r.state),
            in_syscall_ms,
            csv(r.wchan),
            csv(r.leaf),
            csv(r.lua),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::test_util::sample;
    use crate::{Frame, Mode, Thread};

    /// Two snapshots of two threads: a sleeper in clock_nanosleep (kernel stack
    /// `hrtimer_nanosleep` under the scheduler) and a spinner on a CPU.
    fn profile() -> Profile {
        let frames = vec![
            Frame::named("nap", None, FrameKind::User),
            Frame::named("hrtimer_nanosleep", None, FrameKind::Kernel),
            Frame::named("do_nanosleep", None, FrameKind::Kernel),
            Frame::named("schedule", None, FrameKind::Kernel),
        ];
        let sleeping = ThreadState {
            state: 'S',
            on_cpu: false,
            syscall: Some(230),
            syscall_ns: Some(2_000_000),
        };
        let running = ThreadState {
            state: 'R',
            on_cpu: true,
            ..ThreadState::default()
        };
        let mut samples = Vec::new();
        for t in [1_000, 2_000] {
            let mut s = sample((1, 1, 0), t, &[0, 1, 2, 3], false);
            s.kind = SampleKind::State(sleeping);
            samples.push(s);
            let mut s = sample((1, 2, 1), t, &[], false);
            s.kind = SampleKind::State(running);
            samples.push(s);
        }
        let thread = |tid, name: &str| Thread {
            pid: 1,
            tid,
            name: name.into(),
            samples: 2,
        };
        Profile {
            samples,
            frames,
            threads: vec![thread(1, "sleeper"), thread(2, "spin,ner")],
            mode: Mode::States,
            ..Profile::default()
        }
    }

    #[test]
    fn groups_average_threads_with_wait_channel_outside_the_scheduler() {
        let mut out = Vec::new();
        let keys = [
            StateKey::Comm,
            StateKey::State,
            StateKey::Syscall,
            StateKey::Wchan,
        ];
        write_states(&profile(), &keys, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("2 thread-state samples"), "{text}");
        assert!(
            text.contains("1.00  50.0%  sleeper   sleeping  clock_nanosleep  hrtimer_nanosleep"),
            "{text}"
        );
        assert!(
            text.contains("1.00  50.0%  spin,ner  running   -"),
            "{text}"
        );
    }

    #[test]
    fn csv_has_a_row_per_thread_per_sample_and_quotes_commas() {
        let mut out = Vec::new();
        write_states_csv(&profile(), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        assert_eq!(
            lines[1],
            "0.000001,1,1,sleeper,sleeping,false,clock_nanosleep,2.000,hrtimer_nanosleep,nap,-"
        );
        assert!(
            lines[2].contains(",\"spin,ner\",running,true,-,,-,-"),
            "{text}"
        );
    }

    #[test]
    fn a_capture_without_states_says_how_to_record_them() {
        let mut p = profile();
        p.samples.clear();
        let err = write_states(&p, &[StateKey::State], &mut Vec::new()).unwrap_err();
        assert!(err.to_string().contains("lrec --states"));
    }
}
