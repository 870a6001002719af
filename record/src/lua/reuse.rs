//! The last Lua stack of each thread, kept to convert the next one: a thread's consecutive
//! samples share most of a deep stack (all but the few innermost frames), and the frames
//! they share need neither a proto lookup nor a check again.
//!
//! A frame of the new walk equal, byte for byte, to the old one's at the same distance
//! from the outermost frame (and every frame outside it equal too) converts to the same
//! capture frame: a proto key keeps its id for the whole recording. Its check is reused
//! only if it began after the new walk ended, as [`super::check`] requires of any check;
//! a shared frame whose check is older is converted and checked again, with all the
//! frames inside it.

use lrec_format::LuaFrame;
use rustc_hash::FxHashMap;

use crate::raw::RawLuaFrame;

/// Threads whose last stack is kept: beyond, they are all let go.
const MAX_THREADS: usize = 1024;

/// A thread's last stack, all of whose frames stood.
pub(super) struct Last {
    pid: u32,
    puc: bool,
    raw: Vec<RawLuaFrame>,
    frames: Vec<LuaFrame>,
    /// `checked[i]`: when the oldest check of frames `i..` began (`u64::MAX`: none of
    /// them was checked).
    checked: Vec<u64>,
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

    /// Keeps the stack a sample converted in full: its walk `raw`, its `frames`, and the
    /// check times of its first `checked.len()` frames, the rest being `old`'s last ones.
    pub(super) fn keep(
        &mut self,
        (tid, pid, puc): (u32, u32, bool),
        raw: Vec<RawLuaFrame>,
        frames: &[LuaFrame],
        mut checked: Vec<u64>,
        old: Option<Last>,
    ) {
        debug_assert_eq!(raw.len(), frames.len());
        let head = checked.len();
        let mut last = match old {
            Some(mut l) => {
                let tail = raw.len() - head;
                let from = l.checked.len() - tail;
                checked.extend_from_slice(&l.checked[from..]);
                l.frames.clear();
                l.frames.extend_from_slice(frames);
                Last { raw, checked, ..l }
            }
            None => Last {
                pid,
                puc,
                raw,
                frames: frames.to_vec(),
                checked,
            },
        };
        for i in (0..head).rev() {
            let outer = last.checked.get(i + 1).copied().unwrap_or(u64::MAX);
            last.checked[i] = last.checked[i].min(outer);
        }
        if self.by_tid.len() >= MAX_THREADS {
            self.by_tid.clear();
        }
        self.by_tid.insert(tid, last);
    }
}

impl Last {
    /// How many outermost frames of a walk, ended at `walked_ns`, are this stack's: equal
    /// to its own, with checks begun after the walk.
    pub(super) fn shared(&self, raw: &[RawLuaFrame], walked_ns: u64) -> usize {
        let same = self
            .raw
            .iter()
            .rev()
            .zip(raw.iter().rev())
            .take_while(|(a, b)| a == b)
            .count();
        let old = self.raw.len();
        (0..=same)
            .rev()
            .find(|&s| s == 0 || self.checked[old - s] >= walked_ns)
            .unwrap_or(0)
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
    fn a_stack_shares_its_equal_outer_frames_checked_after_its_walk() {
        let mut s = LastStacks::default();
        // Innermost first: 3 called by 2 called by 1; 2 was checked at time 50.
        let walk = vec![raw(3), raw(2), raw(1)];
        let frames = [frame(30), frame(20), frame(10)];
        s.keep(
            (9, 7, false),
            walk,
            &frames,
            vec![u64::MAX, 50, u64::MAX],
            None,
        );
        let l = s.take(9, 7, false).unwrap();
        assert_eq!(l.checked, [50, 50, u64::MAX]);
        // 4 now runs where 3 did: two frames shared while the walk ended by time 50.
        let walk = vec![raw(4), raw(2), raw(1)];
        assert_eq!(l.shared(&walk, 50), 2);
        assert_eq!(l.tail(2), &frames[1..]);
        // Walked after the check of 2: only 1, which had none, is shared.
        assert_eq!(l.shared(&walk, 51), 1);
        // Deeper and shallower walks share their outer frames too.
        assert_eq!(l.shared(&[raw(5), raw(3), raw(2), raw(1)], 0), 3);
        assert_eq!(l.shared(&[raw(1)], 0), 1);
        assert_eq!(l.shared(&[raw(2)], 0), 0);
        // Kept again with a new head: the tail keeps its check times.
        s.keep(
            (9, 7, false),
            walk,
            &[frame(40), frame(20), frame(10)],
            vec![60],
            Some(l),
        );
        let l = s.take(9, 7, false).unwrap();
        assert_eq!(l.checked, [50, 50, u64::MAX]);
        assert_eq!(l.tail(3)[0].function, 40);
    }

    #[test]
    fn another_process_or_vm_kind_shares_nothing() {
        let mut s = LastStacks::default();
        for (pid, puc) in [(8, false), (7, true)] {
            s.keep(
                (9, 7, false),
                vec![raw(1)],
                &[frame(1)],
                vec![u64::MAX],
                None,
            );
            assert!(s.take(9, pid, puc).is_none());
        }
        // Taken out either way.
        assert!(s.take(9, 7, false).is_none());
    }
}
