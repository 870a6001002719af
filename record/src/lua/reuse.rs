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

/// A thread's last stack: its walk and the capture frames it converted to, innermost
/// first, updated in place by the next walk (only the frames that changed are written).
#[derive(Default)]
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
    /// Takes thread `tid`'s last stack out: empty unless it was walked in process `pid` by
    /// the same VM kind (`puc`).
    pub(super) fn take(&mut self, tid: u32, pid: u32, puc: bool) -> Last {
        match self.by_tid.remove(&tid) {
            Some(l) if l.pid == pid && l.puc == puc => l,
            Some(mut l) => {
                // Its buffers serve again.
                (l.pid, l.puc) = (pid, puc);
                l.raw.clear();
                l.frames.clear();
                l
            }
            None => Last {
                pid,
                puc,
                ..Last::default()
            },
        }
    }

    /// Thread `tid`'s last stack's frames, innermost first (none when it has none).
    pub(super) fn frames(&self, tid: u32) -> &[LuaFrame] {
        self.by_tid.get(&tid).map_or(&[], |l| &l.frames)
    }

    /// Keeps thread `tid`'s last stack.
    pub(super) fn keep(&mut self, tid: u32, last: Last) {
        if self.by_tid.len() >= MAX_THREADS {
            self.by_tid.clear();
        }
        self.by_tid.insert(tid, last);
    }
}

impl Last {
    /// How many outermost frames of a walk are this stack's: equal to its own, compared
    /// as bytes (a frame has no padding) a block at a time.
    pub(super) fn shared(&self, raw: &[RawLuaFrame]) -> usize {
        const BLOCK: usize = 16;
        let m = self.raw.len().min(raw.len());
        let (a, b) = (&self.raw[self.raw.len() - m..], &raw[raw.len() - m..]);
        let mut n = 0;
        while n < m {
            let k = (m - n).min(BLOCK);
            let (x, y) = (&a[m - n - k..m - n], &b[m - n - k..m - n]);
            if bytes(x) == bytes(y) {
                n += k;
                continue;
            }
            return n + x
                .iter()
                .rev()
                .zip(y.iter().rev())
                .take_while(|(p, q)| p == q)
                .count();
        }
        n
    }

    /// Takes walk `raw` for this stack, its `shared` outermost frames being this stack's
    /// already: the others are converted by `convert`.
    pub(super) fn update(
        &mut self,
        raw: &[RawLuaFrame],
        shared: usize,
        convert: impl FnMut(&RawLuaFrame) -> LuaFrame,
    ) {
        let (old, new) = (self.raw.len() - shared, raw.len() - shared);
        self.raw.splice(..old, raw[..new].iter().copied());
        self.frames.splice(..old, raw[..new].iter().map(convert));
    }

    /// The capture frames, innermost first.
    #[cfg(test)]
    pub(super) fn frames(&self) -> &[LuaFrame] {
        &self.frames
    }
}

/// The bytes of `frames`.
fn bytes(frames: &[RawLuaFrame]) -> &[u8] {
    // SAFETY: RawLuaFrame is plain old data without padding (raw.rs asserts its size), so
    // every byte of the slice is initialized.
    unsafe { std::slice::from_raw_parts(frames.as_ptr().cast(), std::mem::size_of_val(frames)) }
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

    /// Walks of `ptrs`, innermost first, converted to frames of function ptr * 10.
    fn update(l: &mut Last, ptrs: &[u64]) -> usize {
        let walk: Vec<RawLuaFrame> = ptrs.iter().map(|&p| raw(p)).collect();
        let shared = l.shared(&walk);
        l.update(&walk, shared, |f| frame(f.ptr as u32 * 10));
        shared
    }

    fn functions(l: &Last) -> Vec<u32> {
        l.frames().iter().map(|f| f.function).collect()
    }

    #[test]
    fn a_stack_shares_its_equal_outer_frames() {
        let mut s = LastStacks::default();
        let mut l = s.take(9, 7, false);
        // Innermost first: 3 called by 2 called by 1.
        assert_eq!(update(&mut l, &[3, 2, 1]), 0);
        assert_eq!(functions(&l), [30, 20, 10]);
        s.keep(9, l);
        let mut l = s.take(9, 7, false);
        // 4 now runs where 3 did: two frames shared.
        assert_eq!(update(&mut l, &[4, 2, 1]), 2);
        assert_eq!(functions(&l), [40, 20, 10]);
        // Deeper and shallower walks share their outer frames too.
        assert_eq!(update(&mut l, &[5, 3, 2, 1]), 2);
        assert_eq!(functions(&l), [50, 30, 20, 10]);
        assert_eq!(update(&mut l, &[1]), 1);
        assert_eq!(functions(&l), [10]);
        assert_eq!(update(&mut l, &[2]), 0);
        assert_eq!(functions(&l), [20]);
    }

    #[test]
    fn deep_stacks_compare_by_blocks() {
        let mut l = Last::default();
        let deep: Vec<u64> = (1..=40).rev().collect();
        update(&mut l, &deep);
        for changed in [0, 1, 15, 16, 17, 39] {
            let mut walk = deep.clone();
            walk[changed] = 100;
            assert_eq!(
                update(&mut l, &walk),
                39 - changed,
                "frame {changed} changed"
            );
            assert_eq!(l.frames()[changed].function, 1000);
            update(&mut l, &deep);
        }
        assert_eq!(update(&mut l, &deep), 40);
    }

    #[test]
    fn another_process_or_vm_kind_shares_nothing() {
        let mut s = LastStacks::default();
        for (pid, puc) in [(8, false), (7, true)] {
            let mut l = s.take(9, 7, false);
            update(&mut l, &[1]);
            s.keep(9, l);
            let l = s.take(9, pid, puc);
            assert!(l.frames().is_empty());
            s.keep(9, l);
        }
    }
}
