//! Two profiles compared: BEFORE and AFTER a change, as shares of their own samples, so
//! that captures of different lengths or rates compare.

use std::collections::BTreeMap;
use std::io::{self, BufRead, Write};

use super::{flamegraph, top_functions, write_folded, StackOptions};
use crate::Profile;

/// One function's shares of samples before and after, in percent.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionChange {
    pub name: String,
    pub self_before: f64,
    pub self_after: f64,
    pub total_before: f64,
    pub total_after: f64,
}

impl FunctionChange {
    /// Change in self share, in percentage points.
    pub fn self_delta(&self) -> f64 {
        self.self_after - self.self_before
    }

    /// Change in total share, in percentage points.
    pub fn total_delta(&self) -> f64 {
        self.total_after - self.total_before
    }
}

/// Every function of either profile, ranked by the size of the change of its self share,
/// then of its total share, then by name.
pub fn function_changes(before: &Profile, after: &Profile) -> Vec<FunctionChange> {
    let mut by_name: BTreeMap<String, FunctionChange> = BTreeMap::new();
    for (profile, is_after) in [(before, false), (after, true)] {
        let total = profile.stats.samples.max(1) as f64;
        for f in top_functions(profile) {
            let c = by_name
                .entry(f.name.clone())
                .or_insert_with(|| FunctionChange {
                    name: f.name,
                    self_before: 0.0,
                    self_after: 0.0,
                    total_before: 0.0,
                    total_after: 0.0,
                });
            let (s, t) = (
                100.0 * f.self_samples as f64 / total,
                100.0 * f.total_samples as f64 / total,
            );
            if is_after {
                (c.self_after, c.total_after) = (s, t);
            } else {
                (c.self_before, c.total_before) = (s, t);
            }
        }
    }
    let mut out: Vec<FunctionChange> = by_name.into_values().collect();
    out.sort_by(|a, b| {
        let key = |c: &FunctionChange| (c.self_delta().abs(), c.total_delta().abs());
        key(b)
            .partial_cmp(&key(a))
            .unwrap_or(std::cmp::Ordering::Equal)
            .then_with(|| a.name.cmp(&b.name))
    });
    out
}

/// Writes the `n` functions whose self share changed most, with their total shares.
pub fn write_diff_top(
    before: &Profile,
    after: &Profile,
    n: usize,
    out: &mut dyn Write,
) -> io::Result<()> {
    writeln!(
        out,
        "{:>7} {:>7} {:>8}  {:>7} {:>7} {:>8}  FUNCTION",
        "SELF%-", "SELF%+", "Δ SELF", "TOTAL%-", "TOTAL%+", "Δ TOTAL"
    )?;
    for c in function_changes(before, after).into_iter().take(n) {
        writeln!(
            out,
            "{:>6.2}% {:>6.2}% {:>+7.2}pt  {:>6.2}% {:>6.2}% {:>+7.2}pt  {}",
            c.self_before,
            c.self_after,
            c.self_delta(),
            c.total_before,
            c.total_after,
            c.total_delta(),
            c.name
        )?;
    }
    writeln!(
        out,
        "(- before: {} samples; + after: {} samples; Δ in percentage points of each \
         profile's samples)",
        before.stats.samples, after.stats.samples
    )
}

/// `stack BEFORE AFTER` lines, BEFORE's counts scaled to AFTER's sample count (inferno's
/// and Brendan Gregg's difffolded format, normalised).
pub fn diff_folded_lines(
    before: &Profile,
    after: &Profile,
    opts: StackOptions,
) -> io::Result<Vec<String>> {
    let render = |p: &Profile| -> Vec<u8> {
        let mut text = Vec::new();
        write_folded(p, opts, &mut text).expect("writes to memory");
        text
    };
    let mut diffed = Vec::new();
    let options = inferno::differential::Options {
        normalize: true,
        ..Default::default()
    };
    inferno::differential::from_readers(
        options,
        render(before).as_slice(),
        render(after).as_slice(),
        &mut diffed,
    )?;
    // inferno's order depends on a hash map's: sorted, like --folded.
    let mut lines = diffed.lines().collect::<io::Result<Vec<String>>>()?;
    lines.sort_unstable();
    Ok(lines)
}

/// Writes `stack BEFORE AFTER` lines (BEFORE normalised to AFTER's sample count).
pub fn write_diff_folded(
    before: &Profile,
    after: &Profile,
    opts: StackOptions,
    out: &mut dyn Write,
) -> io::Result<()> {
    for line in diff_folded_lines(before, after, opts)? {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// Writes a differential flame graph: AFTER's stacks, red where they take a larger share
/// than before, blue where smaller.
pub fn write_diff_flamegraph(
    before: &Profile,
    after: &Profile,
    opts: StackOptions,
    out: &mut dyn Write,
) -> io::Result<()> {
    let lines = diff_folded_lines(before, after, opts)?;
    let title = format!(
        "Differential: {} → {}, {} → {} samples",
        super::ellipsize(&super::program(before), 28),
        super::ellipsize(&super::program(after), 28),
        before.stats.samples,
        after.stats.samples
    );
    let subtitle = format!(
        "red grew, blue shrank (shares of all samples); before: {}; after: {}",
        super::command(before),
        super::command(after)
    );
    flamegraph::draw(&lines, title, Some(subtitle), "samples", out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Frame, FrameKind, ProfileSample, Stats, Thread};

    /// A profile whose samples are `(stack, count)`, frames named by their index.
    fn profile(stacks: &[(&[&str], u64)]) -> Profile {
        let mut frames: Vec<Frame> = Vec::new();
        let mut samples = Vec::new();
        for (stack, n) in stacks {
            let ids: Vec<u32> = stack
                .iter()
                .map(|name| {
                    let pos = frames.iter().position(|f| f.function == *name);
                    pos.unwrap_or_else(|| {
                        frames.push(Frame::named(*name, None, FrameKind::User));
                        frames.len() - 1
                    }) as u32
                })
                .collect();
            for _ in 0..*n {
                samples.push(ProfileSample {
                    frames: ids.clone(),
                    ..ProfileSample::default()
                });
            }
        }
        Profile {
            stats: Stats {
                samples: samples.len() as u64,
                ..Stats::default()
            },
            threads: vec![Thread {
                pid: 0,
                tid: 0,
                name: "app".into(),
                samples: samples.len() as u64,
            }],
            frames,
            samples,
            ..Profile::default()
        }
    }

    #[test]
    fn shares_not_counts_are_compared() {
        // hot: 30 % of 100 samples before, 60 % of 400 after.
        let before = profile(&[(&["main", "hot"], 30), (&["main", "cold"], 70)]);
        let after = profile(&[(&["main", "hot"], 240), (&["main", "cold"], 160)]);
        let changes = function_changes(&before, &after);
        assert_eq!(changes[0].name, "cold");
        assert!((changes[0].self_delta() + 30.0).abs() < 1e-9);
        let hot = changes.iter().find(|c| c.name == "hot").unwrap();
        assert!((hot.self_delta() - 30.0).abs() < 1e-9);
        assert!((hot.self_before - 30.0).abs() < 1e-9);
        let main = changes.iter().find(|c| c.name == "main").unwrap();
        assert_eq!((main.self_delta(), main.total_delta()), (0.0, 0.0));
    }

    #[test]
    fn folded_diff_scales_before_to_after() {
        let before = profile(&[(&["main", "hot"], 30), (&["main", "cold"], 70)]);
        let after = profile(&[(&["main", "hot"], 240), (&["main", "cold"], 160)]);
        let lines = diff_folded_lines(&before, &after, StackOptions::default()).unwrap();
        assert_eq!(lines, ["app;main;cold 280 160", "app;main;hot 120 240"]);
    }
}
