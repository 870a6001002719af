//! The last Lua stack of each thread, kept to convert the next one: a thread's consecutive
//! samples share most of a deep stack (all but the few innermost frames), and the frames
//! they share need no proto lookup again.
//!
//! A frame of the new walk equal, byte for byte, to the old one's at the same distance
//! from the outermost frame (and every frame outside it equal too) converts to the same
//! capture frame: a proto key keeps its id for the whole recording, and BPF proved every
//! frame it named from a remembered call site in the sample itself.

use lrec_format::LuaFrame;
use rustc_hash::FxHashMap;

use crate::raw::RawLuaFrame;

/// Threads whose last stack is kept: beyond, they are all let go.
const MAX_THREADS: usize = 1024;

/// A thread's last stack.
pub(super) struct Last {
    pid: u32,
    puc: bool,
    raw: Vec<RawLuaFrame>,
    frames: Vec<LuaFrame>,
}

#[derive(Default)]
pub(super) struct LastStacks {
    by_tid: FxHashMap<u32, Last>,
}

impl LastStacks {
    /// Takes thread `tid`'s last stack out, if it was walked in process `pid` by the same
    /// VM kind (`puc`).
    pub(super) fn take(&mut self, tid: u32, pid: u32, puc: bool) -> Option<Last> {
        self.by_tid
            .remove(&tid)
            .filter(|l| l.pid == pid && l.puc == puc)
    }

    /// Keeps the stack a sample converted: its walk `raw` and its `frames` (reusing
    /// `old`'s buffers).
    pub(super) fn keep(
        &mut self,
        (tid, pid, puc): (u32, u32, bool),
        raw: Vec<RawLuaFrame>,
        frames: &[LuaFrame],
        old: Option<Last>,
    ) {
        debug_assert_eq!(raw.len(), frames.len());
        let last = match old {
            Some(mut l) => {
                l.frames.clear();
                l.frames.extend_from_slice(frames);
                Last { raw, ..l }
            }
            None => Last {
                pid,
                puc,
                raw,
                frames: frames.to_vec(),
            },
        };
        if self.by_tid.len() >= MAX_THREADS {
            self.by_tid.clear();
        }
        self.by_tid.insert(tid, last);
    }
}

impl Last {
    /// How many outermost frames of a walk are this stack's: equal to its own.
    pub(super) fn shared(&self, raw: &[RawLuaFrame]) -> usize {
        self.raw
            .iter()
            .rev()
            .zip(raw.iter().rev())
            .take_while(|(a, b)| a == b)
            .count()
    }

    /// The capture frames of its `n` outermost frames.
    pub(super) fn tail(&self, n: usize) -> &[LuaFrame] {
        &self.frames[self.frames.len() - n..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(ptr: u64) -> RawLuaFrame {
        RawLuaFrame {
            ptr,
            ..Default::default()
        }
    }

    fn frame(function: u32) -> LuaFrame {
        LuaFrame {
            function,
            ..Default::default()
        }
    }

    #[test]
    fn a_stack_shares_its_equal_outer_frames() {
        let mut s = LastStacks::default();
        // Innermost first: 3 called by 2 called by 1.
        let frames = [frame(30), frame(20), frame(10)];
        s.keep((9, 7, false), vec![raw(3), raw(2), raw(1)], &frames, None);
        let l = s.take(9, 7, false).unwrap();
        // 4 now runs where 3 did: two frames shared.
        let walk = vec![raw(4), raw(2), raw(1)];
        assert_eq!(l.shared(&walk), 2);
        assert_eq!(l.tail(2), &frames[1..]);
        // Deeper and shallower walks share their outer frames too.
        assert_eq!(l.shared(&[raw(5), raw(3), raw(2), raw(1)]), 3);
        assert_eq!(l.shared(&[raw(1)]), 1);
        assert_eq!(l.shared(&[raw(2)]), 0);
        // Kept again: the new frames replace the old.
        s.keep(
            (9, 7, false),
            walk,
            &[frame(40), frame(20), frame(10)],
            Some(l),
        );
        let l = s.take(9, 7, false).unwrap();
        assert_eq!(l.tail(3)[0].function, 40);
    }

    #[test]
    fn another_process_or_vm_kind_shares_nothing() {
        let mut s = LastStacks::default();
        for (pid, puc) in [(8, false), (7, true)] {
            s.keep((9, 7, false), vec![raw(1)], &[frame(1)], None);
            assert!(s.take(9, pid, puc).is_none());
        }
        // Taken out either way.
        assert!(s.take(9, 7, false).is_none());
    }
}
