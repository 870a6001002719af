//! Output formats. Each reads a [`Profile`](crate::Profile) and writes to any `io::Write`.

mod diff;
mod firefox;
mod flamegraph;
mod folded;
mod info;
mod latency;
mod pprof;
mod speedscope;
mod states;
mod top;

pub use diff::{write_diff_flamegraph, write_diff_folded, write_diff_top};
pub use firefox::write_firefox;
pub(crate) use flamegraph::draw as draw_flamegraph;
pub use flamegraph::write_flamegraph;
pub use folded::{folded_lines, folded_stacks, write_folded};
pub use info::write_info;
pub use latency::{format_ns, write_latency, write_latency_csv, Durations, Row};
pub use pprof::write_pprof;
pub use speedscope::write_speedscope;
pub use states::{write_states, write_states_csv, StateKey};
pub use top::{top_functions, write_top, FunctionCounts};

/// How stacks are turned into lines of frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StackOptions {
    /// Start every stack with the thread's name, as perf + stackcollapse do.
    pub thread_names: bool,
    /// Start every stack with its process, `name [pid]` (for pre-fork servers).
    pub per_pid: bool,
}

impl Default for StackOptions {
    fn default() -> Self {
        StackOptions {
            thread_names: true,
            per_pid: false,
        }
    }
}

/// Root frame of stacks that could not be followed to their root function.
pub const TRUNCATED_FRAME: &str = "[truncated]";

/// Nanoseconds of CPU time one sample stands for, the sampling period; `None` when the
/// capture does not say its frequency.
pub(crate) fn period_ns(frequency_hz: u32) -> Option<f64> {
    (frequency_hz > 0).then(|| 1e9 / f64::from(frequency_hz))
}

/// `1ms`, `250us`, `1.5s`: a duration as people write it.
pub fn format_duration(ns: u64) -> String {
    let (value, unit) = match ns {
        n if n >= 1_000_000_000 => (n as f64 / 1e9, "s"),
        n if n >= 1_000_000 => (n as f64 / 1e6, "ms"),
        n if n >= 1_000 => (n as f64 / 1e3, "us"),
        n => (n as f64, "ns"),
    };
    let text = format!("{value:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text}{unit}")
}

/// A CSV field (RFC 4180), quoted when it holds a comma, a quote or a line break.
pub(crate) fn csv(v: &str) -> String {
    if v.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", v.replace('"', "\"\""))
    } else {
        v.to_string()
    }
}

/// What was recorded: the lrec command line (titles of the outputs).
pub(crate) fn command(profile: &crate::Profile) -> String {
    match profile.header.command_line.as_slice() {
        [] => "lrec profile".to_owned(),
        words => words.join(" "),
    }
}

/// Who was recorded, short enough for a title: the command lrec ran (after `--`, each
/// path as its file name), else the target's main thread and pid.
pub(crate) fn program(profile: &crate::Profile) -> String {
    let words = &profile.header.command_line;
    if let Some(at) = words.iter().position(|w| w == "--") {
        let cmd: Vec<&str> = words[at + 1..]
            .iter()
            .map(|w| match w.starts_with('-') {
                true => w.as_str(),
                false => w.rsplit('/').next().unwrap_or(w),
            })
            .collect();
        if !cmd.is_empty() {
            return ellipsize(&cmd.join(" "), 48);
        }
    }
    let pid = profile.header.target_pid;
    match profile.threads.iter().find(|t| t.tid == pid) {
        Some(t) => ellipsize(&format!("{} (pid {pid})", t.name), 48),
        None if pid != 0 => format!("pid {pid}"),
        None => "lrec profile".to_owned(),
    }
}

/// `text` cut in the middle with `…` to at most `max` characters.
pub(crate) fn ellipsize(text: &str, max: usize) -> String {
    let n = text.chars().count();
    if n <= max || max < 3 {
        return text.to_owned();
    }
    let head = (max - 1) / 2;
    let tail = max - 1 - head;
    let mut out: String = text.chars().take(head).collect();
    out.push('…');
    out.extend(text.chars().skip(n - tail));
    out
}

/// Builders of the renderers' test profiles.
#[cfg(test)]
pub(crate) mod test_util {
    use crate::{ProfileSample, StackEnd};

    /// A sample of thread index `thread` (`pid`, `tid`), root-first `frames`, truncated or
    /// complete.
    pub(crate) fn sample(
        (pid, tid, thread): (u32, u32, usize),
        time_ns: u64,
        frames: &[u32],
        truncated: bool,
    ) -> ProfileSample {
        ProfileSample {
            time_ns,
            pid,
            tid,
            thread,
            frames: frames.to_vec(),
            end: if truncated {
                StackEnd::Truncated
            } else {
                StackEnd::Complete
            },
            ..ProfileSample::default()
        }
    }
}
