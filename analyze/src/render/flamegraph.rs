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
    let program = super::program(profile);
    let samples = profile.stats.samples;
    let title = match (profile.mode, profile.header.frequency_hz) {
        (crate::Mode::OffCpu, _) => format!("{program}: off-CPU time"),
        (crate::Mode::Wall, _) => format!("{program}: wall-clock time, on and off CPU"),
        (crate::Mode::States, _) => format!("{program}: thread states"),
        (_, 0) => format!("{program}: {samples} samples"),
        (_, hz) => format!("{program}: CPU, {hz} Hz, {samples} samples"),
    };
    draw(
        &lines,
        title,
        Some(super::command(profile)),
        profile.unit(),
        out,
    )
}

/// inferno's layout (0.12, its defaults): text is `FONT_WIDTH` × its size wide per
/// character, the title is 17 px and the subtitle 12 px, both centred in a 1,200 px image
/// whose title line also holds "Reset Zoom" (left) and "Search" (right).
const FONT_WIDTH: f64 = 0.59;
const IMAGE_WIDTH: f64 = 1200.0;
const TITLE_PX: f64 = 17.0;
const SUBTITLE_PX: f64 = 12.0;
/// The room between the buttons, ~85 px each with their margins.
const TITLE_ROOM: f64 = IMAGE_WIDTH - 2.0 * 100.0;

/// How wide inferno draws `text` at font size `px`.
#[cfg(test)]
fn text_width(text: &str, px: f64) -> f64 {
    text.chars().count() as f64 * FONT_WIDTH * px
}

/// The title and subtitle cut (in the middle) to fit their lines.
fn fit(title: String, subtitle: Option<String>) -> (String, Option<String>) {
    let max_title = (TITLE_ROOM / (FONT_WIDTH * TITLE_PX)) as usize;
    let max_subtitle = ((IMAGE_WIDTH - 40.0) / (FONT_WIDTH * SUBTITLE_PX)) as usize;
    (
        super::ellipsize(&title, max_title),
        subtitle.map(|s| super::ellipsize(&s, max_subtitle)),
    )
}

/// Draws collapsed stack lines (`stack COUNT`, or `stack BEFORE AFTER` for a differential
/// flame graph).
pub(crate) fn draw(
    lines: &[String],
    title: String,
    subtitle: Option<String>,
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
    (options.title, options.subtitle) = fit(title, subtitle);
    options.count_name = unit.into();
    // A label that does not fit keeps its start, the function's name (inferno's default
    // keeps the end: `..es/workloads/lua/chains.lua:33` for `recurse fixtures/…`).
    options.text_truncate_direction = inferno::flamegraph::TextTruncateDirection::Right;
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Frame, FrameKind, Profile, Thread};

    /// A profile of `lrec … -- COMMAND` with one sample.
    fn profile(command: &[&str]) -> Profile {
        let mut p = Profile {
            frames: vec![Frame::named("main", None, FrameKind::User)],
            threads: vec![Thread {
                pid: 7,
                tid: 7,
                name: "lua-host".into(),
                samples: 1,
            }],
            samples: vec![crate::render::test_util::sample((7, 7, 0), 0, &[0], false)],
            ..Profile::default()
        };
        p.header.command_line = command.iter().map(|w| w.to_string()).collect();
        p.header.frequency_hz = 499;
        p.header.target_pid = 7;
        p.stats.samples = 1;
        p
    }

    /// The text of the SVG element with this id.
    fn text_of(svg: &str, id: &str) -> String {
        let at = svg.find(&format!("id=\"{id}\"")).unwrap();
        let start = at + svg[at..].find('>').unwrap() + 1;
        let end = start + svg[start..].find('<').unwrap();
        svg[start..end].to_string()
    }

    #[test]
    fn titles_are_short_and_fit_between_the_buttons() {
        let long = "/very/long/path/to/a/build/tree/of/the/project/fixtures/bin/lua-host";
        let words = [
            "/work/main/target/release/lrec",
            "-F",
            "499",
            "-o",
            "/tmp/a/long/directory/name/for/the/capture/file.lrec",
            "--",
            long,
            "/very/long/path/to/fixtures/workloads/lua/host/worker.lua",
            "4",
            "3",
        ];
        let p = profile(&words);
        let mut svg = Vec::new();
        write_flamegraph(&p, StackOptions::default(), &mut svg).unwrap();
        let svg = String::from_utf8(svg).unwrap();
        let title = text_of(&svg, "title");
        assert_eq!(title, "lua-host worker.lua 4 3: CPU, 499 Hz, 1 samples");
        assert!(text_width(&title, TITLE_PX) <= TITLE_ROOM);
        // The whole command line goes to the subtitle, cut to fit the image.
        let subtitle = text_of(&svg, "subtitle");
        assert!(subtitle.starts_with("/work/main/target/release/lrec -F 499"));
        assert!(text_width(&subtitle, SUBTITLE_PX) <= IMAGE_WIDTH - 40.0);

        // Attached (-p): the main thread's name and the pid.
        let p = profile(&["lrec", "-p", "7", "-d", "5"]);
        assert_eq!(crate::render::program(&p), "lua-host (pid 7)");

        // The differential graph: both programs, the counts, the rest below.
        let (before, after) = (profile(&words), profile(&words));
        let mut svg = Vec::new();
        crate::render::write_diff_flamegraph(&before, &after, StackOptions::default(), &mut svg)
            .unwrap();
        let svg = String::from_utf8(svg).unwrap();
        let title = text_of(&svg, "title");
        assert!(title.starts_with("Differential: lua-host"), "{title}");
        assert!(title.ends_with(", 1 → 1 samples"), "{title}");
        assert!(text_width(&title, TITLE_PX) <= TITLE_ROOM, "{title}");
        let subtitle = text_of(&svg, "subtitle");
        assert!(subtitle.starts_with("red grew, blue shrank"), "{subtitle}");
        assert!(text_width(&subtitle, SUBTITLE_PX) <= IMAGE_WIDTH - 40.0);
    }
}
