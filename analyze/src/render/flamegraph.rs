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
    let title = match h.frequency_hz {
        0 => super::command(profile),
        hz => format!(
            "{} ({hz} Hz, {} samples)",
            super::command(profile),
            profile.stats.samples
        ),
    };
    draw(&lines, title, out)
}

/// Draws collapsed stack lines (`stack COUNT`, or `stack BEFORE AFTER` for a differential
/// flame graph).
pub(super) fn draw(lines: &[String], title: String, out: &mut dyn Write) -> io::Result<()> {
    if lines.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the profile holds no samples to draw",
        ));
    }
    let mut options = inferno::flamegraph::Options::default();
    options.title = title;
    options.count_name = "samples".into();
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out)
}
