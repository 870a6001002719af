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
