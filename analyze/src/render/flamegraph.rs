//! Flame graph SVG, drawn by inferno from the collapsed stacks.

use std::io::{self, Write};

use super::{folded_lines, StackOptions};
use crate::Profile;

/// Writes an interactive SVG flame graph.
pub fn write_flamegraph(
    profile: &Profile,
    opts: StackOptions,
    out: &mut dyn Write,
) -> io::Result<()> {
    let lines = folded_lines(profile, opts);
    let h = &profile.header;
    let command = super::command(profile);
    let title = match (profile.mode, h.frequency_hz) {
        (crate::Mode::OffCpu, _) => format!("Off-CPU time: {command}"),
        (crate::Mode::Wall, _) => format!("Wall-clock time, on and off CPU: {command}"),
        (crate::Mode::States, _) => format!("Thread states: {command}"),
        (_, 0) => command,
        (_, hz) => format!("{command} ({hz} Hz, {} samples)", profile.stats.samples),
    };
    draw(&lines, title, profile.unit(), out)
}

/// Draws collapsed stack lines (`stack COUNT`, or `stack BEFORE AFTER` for a differential
/// flame graph).
pub(super) fn draw(
    lines: &[String],
    title: String,
    unit: &str,
    out: &mut dyn Write,
) -> io::Result<()> {
    if lines.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the profile holds no samples to draw",
        ));
    }
    let mut options = inferno::flamegraph::Options::default();
    options.title = title;
    options.count_name = unit.into();
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out)
}
