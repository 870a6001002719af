//! The frames BPF named from a call site it remembered in an earlier sample, without
//! reading their protos in the sample ([`FRAME_CHECK_PROTO`]): the read moved from the
//! target's CPU to lrec's. A collected proto's address may hold other code since the site
//! was remembered, so lrec checks, after the sample, that the proto there still has the
//! frame's key; a frame that fails it, and the frames below it (located through the
//! site's call), are dropped, and the stack is marked broken.
//!
//! A sample carries the time its walk ended. A read begun after that time serves it, and
//! every other sample walked before the read began: a proto that was replaced when a
//! sample ran and is back, with the same key, when lrec reads it would have to be replaced
//! twice, by code of the same name, lines and size. So a proto is read about once per
//! drain of the ring buffer, by the first sample naming it, for all the samples the ring
//! held. A proto that can no longer be read (its process has exited) keeps its last
//! check, or stands if it had none: BPF read it when it remembered the site.
//!
//! The reads go a page at a time ([`Pages`]): a chunk's protos are allocated together, so
//! the few hundred protos of a deep stack lie in a few pages.

use rustc_hash::FxHashMap;

use super::ProtoKey;
use crate::procfs::{monotonic_ns, read_vm};
use crate::raw::{RawLuaFrame, FRAME_CHECK_PROTO};

const PAGE: u64 = 4096;
/// Pages kept (16 MiB): beyond, they are all let go.
const MAX_PAGES: usize = 4096;

/// A page of a target's memory: when it was read (CLOCK_MONOTONIC ns, before the read;
/// 0: not yet) and its bytes (None: it could not be read).
type Page = (u64, Option<Box<[u8]>>);

/// The recorded processes' memory, read a page at a time, by (pid, page address).
#[derive(Default)]
pub struct Pages {
    pages: FxHashMap<(u32, u64), Page>,
    /// Reads of this sample see the target's memory as of this time or later.
    after: u64,
}

impl Pages {
    /// Reads all of `buf` at `addr` in process `pid`, from pages read after
    /// [`Pages::after`] (read again when older).
    pub fn read(&mut self, pid: u32, addr: u64, buf: &mut [u8]) -> bool {
        let mut done = 0;
        while done < buf.len() {
            let at = addr + done as u64;
            let page = at & !(PAGE - 1);
            if self.pages.len() >= MAX_PAGES && !self.pages.contains_key(&(pid, page)) {
                self.pages.clear();
            }
            let entry = self.pages.entry((pid, page)).or_insert((0, None));
            if entry.0 == 0 || entry.0 < self.after {
                let now = monotonic_ns();
                let mut b = vec![0u8; PAGE as usize].into_boxed_slice();
                *entry = (now, read_vm(pid, page, &mut b).then_some(b));
            }
            let Some(bytes) = &entry.1 else {
                return false;
            };
            let off = (at - page) as usize;
            let n = (buf.len() - done).min(PAGE as usize - off);
            buf[done..done + n].copy_from_slice(&bytes[off..off + n]);
            done += n;
        }
        true
    }
}

#[derive(Default)]
pub(super) struct ProtoChecks {
    /// Each checked proto's last check: when it began (CLOCK_MONOTONIC ns) and whether
    /// it held.
    last: FxHashMap<ProtoKey, (u64, bool)>,
    pages: Pages,
    /// Samples whose frames were cut.
    pub(super) cut: u64,
}

impl ProtoChecks {
    /// How many of a sample's `frames` (innermost first, in process `pid`, walked until
    /// `walked_ns`) stand: those above the first whose proto fails its check, all if none
    /// does. `unchanged` reads (from the pages given) whether a frame's proto still has
    /// its key (None: unreadable). `checked` gets, for each standing frame, when the check
    /// it stands by began (`u64::MAX`: a frame BPF read, with nothing to check).
    pub(super) fn standing(
        &mut self,
        pid: u32,
        walked_ns: u64,
        frames: &[RawLuaFrame],
        checked: &mut Vec<u64>,
        unchanged: impl Fn(&mut Pages, &RawLuaFrame) -> Option<bool>,
    ) -> usize {
        self.pages.after = walked_ns;
        for (i, f) in frames.iter().enumerate() {
            if f.check & FRAME_CHECK_PROTO == 0 {
                checked.push(u64::MAX);
                continue;
            }
            let key = proto_key!(pid, f);
            let last = self.last.get(&key).copied();
            let (at, holds) = match last {
                Some((at, holds)) if at >= walked_ns => (at, holds),
                _ => {
                    let at = monotonic_ns();
                    let read = unchanged(&mut self.pages, f);
                    let holds = read.unwrap_or(last.is_none_or(|(_, held)| held));
                    self.last.insert(key, (at, holds));
                    (at, holds)
                }
            };
            if !holds {
                self.cut += 1;
                return i;
            }
            checked.push(at);
        }
        frames.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

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
        let frames = [
            frame(1, false),
            frame(2, true),
            frame(3, true),
            frame(4, false),
        ];
        let mut c = ProtoChecks::default();
        assert_eq!(
            c.standing(7, 0, &frames, &mut Vec::new(), |_, _| Some(true)),
            4
        );
        let mut c = ProtoChecks::default();
        assert_eq!(
            c.standing(7, 0, &frames, &mut Vec::new(), |_, f| Some(f.ptr != 3)),
            2
        );
        assert_eq!(c.cut, 1);
        // Frames without the mark are never read.
        assert_eq!(
            c.standing(7, 0, &frames[..1], &mut Vec::new(), |_, _| unreachable!()),
            1
        );
    }

    #[test]
    fn one_read_serves_the_samples_walked_before_it() {
        let mut c = ProtoChecks::default();
        let frames = [frame(2, true), frame(3, true)];
        let reads = Cell::new(0);
        let read = |_: &mut Pages, _: &RawLuaFrame| {
            reads.set(reads.get() + 1);
            Some(true)
        };
        assert_eq!(c.standing(7, 0, &frames, &mut Vec::new(), read), 2);
        assert_eq!(c.standing(7, 0, &frames, &mut Vec::new(), read), 2);
        assert_eq!(reads.get(), 2);
        // A sample walked after those reads began is read for again.
        assert_eq!(
            c.standing(7, monotonic_ns() + 1, &frames, &mut Vec::new(), read),
            2
        );
        assert_eq!(reads.get(), 4);
    }

    #[test]
    fn an_unreadable_proto_keeps_its_last_check() {
        let mut c = ProtoChecks::default();
        let frames = [frame(2, true)];
        assert_eq!(c.standing(7, 0, &frames, &mut Vec::new(), |_, _| None), 1);
        let later = monotonic_ns() + 1;
        assert_eq!(
            c.standing(7, later, &frames, &mut Vec::new(), |_, _| Some(false)),
            0
        );
        assert_eq!(
            c.standing(
                7,
                later + 1_000_000_000,
                &frames,
                &mut Vec::new(),
                |_, _| None
            ),
            0
        );
    }

    #[test]
    fn pages_are_read_once_and_across_their_ends() {
        // This process's own memory, read as a target's.
        let data: Vec<u8> = (0..3 * PAGE as usize).map(|i| (i % 251) as u8).collect();
        // 3 bytes before the end of a page within data.
        let at = ((data.as_ptr() as u64 + PAGE) & !(PAGE - 1)) - 3;
        let i = (at - data.as_ptr() as u64) as usize;
        let mut pages = Pages::default();
        let mut buf = [0u8; 8];
        assert!(pages.read(std::process::id(), at, &mut buf));
        assert_eq!(buf, data[i..i + 8]);
        assert_eq!(pages.pages.len(), 2);
        let read_at = pages.pages.values().map(|p| p.0).max();
        assert!(pages.read(std::process::id(), at + 4, &mut buf[..4]));
        assert_eq!(pages.pages.values().map(|p| p.0).max(), read_at);
        // Pages read before a sample's walk ended are read again.
        pages.after = monotonic_ns() + 1;
        assert!(pages.read(std::process::id(), at + 4, &mut buf[..4]));
        assert!(pages.pages.values().map(|p| p.0).max() > read_at);
        assert!(!pages.read(std::process::id(), 8, &mut buf));
    }
}
