//! The functions that took the most samples, by self time.

use std::io::{self, Write};

use rustc_hash::{FxHashMap, FxHashSet};

use crate::{FrameId, Profile};

/// Samples of one function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionCounts {
    pub name: String,
    /// Samples in which it is the leaf.
    pub self_samples: u64,
    /// Samples in which it is anywhere on the stack (counted once per sample).
    pub total_samples: u64,
}

/// Every function, by self samples, then total samples, then name.
pub fn top_functions(profile: &Profile) -> Vec<FunctionCounts> {
    let names = profile.display_names();
    // Distinct stacks first: far fewer than samples.
    let mut stacks: FxHashMap<&[FrameId], u64> = FxHashMap::default();
    for sample in &profile.samples {
        *stacks.entry(&sample.frames).or_default() += profile.weight(sample);
    }
    let mut by_name: FxHashMap<&str, (u64, u64)> = FxHashMap::default();
    let mut seen: FxHashSet<&str> = FxHashSet::default();
    for (frames, n) in stacks {
        seen.clear();
        for &id in frames {
            let name = names[id as usize].as_str();
            // A recursive function counts once per sample in its total.
            if seen.insert(name) {
                by_name.entry(name).or_default().1 += n;
            }
        }
        if let Some(&leaf) = frames.last() {
            by_name.entry(names[leaf as usize].as_str()).or_default().0 += n;
        }
    }
    let mut out: Vec<FunctionCounts> = by_name
        .into_iter()
        .map(|(name, (self_samples, total_samples))| FunctionCounts {
            name: name.to_owned(),
            self_samples,
            total_samples,
        })
        .collect();
    out.sort_by(|a, b| {
        (b.self_samples, b.total_samples, &a.name).cmp(&(a.self_samples, a.total_samples, &b.name))
    });
    out
}

/// Writes a table of the `n` functions with the most self samples.
pub fn write_top(profile: &Profile, n: usize, out: &mut dyn Write) -> io::Result<()> {
    let total = profile.total_weight().max(1) as f64;
    let pct = |x: u64| 100.0 * x as f64 / total;
    if profile.unit() != "samples" {
        writeln!(out, "(self and total in microseconds)")?;
    }
    writeln!(
        out,
        "{:>8} {:>7} {:>8} {:>7}  FUNCTION",
        "SELF", "SELF%", "TOTAL", "TOTAL%"
    )?;
    for f in top_functions(profile).into_iter().take(n) {
        writeln!(
            out,
            "{:>8} {:>6.2}% {:>8} {:>6.2}%  {}",
            f.self_samples,
            pct(f.self_samples),
            f.total_samples,
            pct(f.total_samples),
            f.name
        )?;
    }
    writeln!(
        out,
        "({} {}; {} truncated stacks, {} failed unwinds)",
        profile.stats.samples,
        match profile.mode {
            crate::Mode::Cpu => "samples",
            crate::Mode::OffCpu => "off-CPU intervals",
            crate::Mode::Wall => "samples and off-CPU intervals",
            crate::Mode::States => "thread states",
        },
        profile.stats.truncated,
        profile.stats.failed_unwinds
    )?;
    if !profile.stats.vm_states.is_empty() {
        writeln!(out, "(Lua VM state: {})", super::info::vm_states(profile))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Frame, FrameKind, ProfileSample};

    #[test]
    fn self_and_total_counts() {
        let f = |n: &str| Frame::named(n, None, FrameKind::User);
        let s = |frames: &[u32]| ProfileSample {
            time_ns: 0,
            pid: 1,
            tid: 1,
            thread: 0,
            frames: frames.to_vec(),
            ..ProfileSample::default()
        };
        let profile = Profile {
            frames: vec![f("main"), f("a"), f("b")],
            samples: vec![s(&[0, 1]), s(&[0, 1, 2]), s(&[0, 1]), s(&[0, 2, 2])],
            ..Profile::default()
        };
        let top = top_functions(&profile);
        let get = |n: &str| top.iter().find(|f| f.name == n).unwrap().clone();
        assert_eq!(top[0].name, "a", "equal self: more total first");
        assert_eq!((get("a").self_samples, get("a").total_samples), (2, 3));
        assert_eq!((get("b").self_samples, get("b").total_samples), (2, 2));
        assert_eq!(
            (get("main").self_samples, get("main").total_samples),
            (0, 4)
        );
    }
}
