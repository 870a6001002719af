//! The frames BPF named from a call site it remembered in an earlier sample, without
//! reading their protos in the sample ([`FRAME_CHECK_PROTO`]): the read moved from the
//! target's CPU to lrec's. A collected proto's address may hold other code since the site
//! was remembered, so lrec checks, after the sample, that the proto there still has the
//! frame's key; a frame that fails it, and the frames below it (located through the
//! site's call), are dropped, and the stack is marked broken.
//!
//! One read checks a proto for every sample taken before it: a proto that was replaced
//! when the sample ran and is back, with the same key, when lrec reads it would have to be
//! replaced twice, by code of the same name, lines and size. A proto that can no longer be
//! read (its process has exited) keeps its last check, or stands if it had none: BPF read
//! it when it remembered the site.

use rustc_hash::FxHashMap;

use super::ProtoKey;
use crate::procfs::monotonic_ns;
use crate::raw::{RawLuaFrame, FRAME_CHECK_PROTO};

/// How long after its time a sample's walk may still run: a sample's time is taken just
/// before BPF walks its stack, and a check counts for the samples whose walks ended before
/// it began. (A walk takes tens of microseconds at most: BPF cannot sleep.)
const WALK_NS: u64 = 1_000_000;

/// Each checked proto's last check: when (CLOCK_MONOTONIC ns, taken before the read, the
/// clock of the samples' times) and whether it held.
#[derive(Default)]
pub(super) struct ProtoChecks {
    last: FxHashMap<ProtoKey, (u64, bool)>,
    /// Samples whose frames were cut.
    pub(super) cut: u64,
}

impl ProtoChecks {
    /// How many of a sample's `frames` (innermost first, taken at `time_ns` in process
    /// `pid`) stand: those above the first whose proto fails its check, all if none does.
    /// `unchanged` reads whether a frame's proto still has its key (None: unreadable).
    pub(super) fn standing(
        &mut self,
        pid: u32,
        time_ns: u64,
        frames: &[RawLuaFrame],
        unchanged: impl Fn(&RawLuaFrame) -> Option<bool>,
    ) -> usize {
        for (i, f) in frames.iter().enumerate() {
            if f.check & FRAME_CHECK_PROTO == 0 {
                continue;
            }
            let key = proto_key!(pid, f);
            let last = self.last.get(&key).copied();
            let holds = match last {
                Some((at, holds)) if at >= time_ns.saturating_add(WALK_NS) => holds,
                _ => {
                    let at = monotonic_ns();
                    let holds = unchanged(f).unwrap_or(last.is_none_or(|(_, held)| held));
                    self.last.insert(key, (at, holds));
                    holds
                }
            };
            if !holds {
                self.cut += 1;
                return i;
            }
        }
        frames.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(ptr: u64, check: bool) -> RawLuaFrame {
        RawLuaFrame {
            ptr,
            sizebc: 10,
            check: if check { FRAME_CHECK_PROTO } else { 0 },
            ..Default::default()
        }
    }

    #[test]
    fn a_replaced_proto_drops_its_frame_and_those_below() {
        let mut c = ProtoChecks::default();
        let frames = [
            frame(1, false),
            frame(2, true),
            frame(3, true),
            frame(4, false),
        ];
        assert_eq!(c.standing(7, 0, &frames, |_| Some(true)), 4);
        let mut c = ProtoChecks::default();
        assert_eq!(c.standing(7, 0, &frames, |f| Some(f.ptr != 3)), 2);
        // Frames without the mark are never read.
        assert_eq!(c.standing(7, 0, &frames[..1], |_| unreachable!()), 1);
    }

    #[test]
    fn one_read_serves_the_samples_taken_before_it() {
        let mut c = ProtoChecks::default();
        let frames = [frame(2, true)];
        let reads = std::cell::Cell::new(0);
        let read = |_: &RawLuaFrame| {
            reads.set(reads.get() + 1);
            Some(true)
        };
        let t0 = monotonic_ns() - 2 * WALK_NS;
        c.standing(7, t0, &frames, read);
        c.standing(7, t0, &frames, read);
        assert_eq!(reads.get(), 1);
        // One taken just before the read may have been walked after it.
        c.standing(7, monotonic_ns(), &frames, read);
        assert_eq!(reads.get(), 2);
        // A sample taken after the read is read for again.
        c.standing(7, monotonic_ns() + 1_000_000_000, &frames, read);
        assert_eq!(reads.get(), 3);
    }

    #[test]
    fn an_unreadable_proto_keeps_its_last_check() {
        let mut c = ProtoChecks::default();
        let frames = [frame(2, true)];
        assert_eq!(c.standing(7, 0, &frames, |_| None), 1);
        assert_eq!(c.standing(7, u64::MAX, &frames, |_| Some(false)), 0);
        assert_eq!(c.standing(7, u64::MAX, &frames, |_| None), 0);
    }
}
