//! Flame graph SVG, drawn by inferno from the collapsed stacks.

use std::io::{self, Write};

use super::{folded_stacks, StackOptions};
use crate::Profile;

/// Writes an interactive SVG flame graph.
pub fn write_flamegraph(
    profile: &Profile,
    opts: StackOptions,
    out: &mut dyn Write,
) -> io::Result<()> {
    let lines: Vec<String> = folded_stacks(profile, opts)
        .into_iter()
        .map(|(stack, count)| format!("{stack} {count}"))
        .collect();
    let mut options = inferno::flamegraph::Options::default();
    options.title = title(profile);
    options.count_name = "samples".into();
    if lines.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the profile holds no samples to draw",
        ));
    }
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out)
}

fn title(profile: &Profile) -> String {
    let h = &profile.header;
    let what = if h.command_line.is_empty() {
        "lrec profile".to_owned()
    } else {
        h.command_line.join(" ")
    };
    if h.frequency_hz > 0 {
        format!(
            "{what} ({} Hz, {} samples)",
            h.frequency_hz, profile.stats.samples
        )
    } else {
        what
    }
}
