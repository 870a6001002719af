//! The frames a LuaJIT walk takes from its CPU's memo (ebpf/luajit_memo.h): BPF keeps each
//! CPU's last full walk and, where a later walk's stack is unchanged below its innermost
//! frames, names that walk's run of frames instead of sending them again. The walk that
//! made the memo sent them (`LREC_MEMO_MADE`); BPF uses a memo only once its sample reached
//! the ring, and lrec reads each CPU's records in order, so the memo a walk names
//! (`LREC_MEMO_TAKEN`) is the last one kept here for its CPU and VM kind (LuaJIT's walk
//! and PUC Lua's keep one each: ebpf/luajit_memo.h, ebpf/puc_memo.h).

use std::borrow::Cow;

use lrec_format::{lua_flags, Sample};
use rustc_hash::FxHashMap;

use crate::raw::{LuaWalk, RawLuaFrame};

/// `lrec_lua_stack.memo`.
pub const MEMO_MADE: u8 = 1;
pub const MEMO_TAKEN: u8 = 2;

#[derive(Default)]
pub(super) struct Memos {
    /// Each CPU's last memo of each VM kind (LuaJIT, PUC Lua: BPF keeps one of each): its
    /// sequence number and frames.
    by_cpu: FxHashMap<(u32, bool), (u64, Vec<RawLuaFrame>)>,
    /// Frames taken from a memo, and walks whose memo was not here (cut where the run
    /// began, marked broken).
    pub taken: u64,
    pub missing: u64,
}

impl Memos {
    /// The frames of `walk`, sampled on `cpu`: a run taken from the memo put in place, and a
    /// memo made kept for the walks after it.
    pub fn resolve<'a>(&mut self, cpu: u32, mut walk: LuaWalk<'a>) -> LuaWalk<'a> {
        let h = walk.header;
        let key = (cpu, u32::from(h.flags) & lua_flags::PUC != 0);
        let (at, from, len) = (
            usize::from(h.memo_at),
            usize::from(h.memo_from),
            usize::from(h.memo_len),
        );
        match h.memo {
            MEMO_MADE => {
                if let Some(made) = walk.frames.get(at..at + len) {
                    let (seq, frames) = self.by_cpu.entry(key).or_default();
                    *seq = h.memo_seq;
                    frames.clear();
                    frames.extend_from_slice(made);
                }
            }
            MEMO_TAKEN => {
                let run = self
                    .by_cpu
                    .get(&key)
                    .filter(|(seq, _)| *seq == h.memo_seq)
                    .and_then(|(_, frames)| frames.get(from..from + len));
                let sent = &walk.frames;
                let at = at.min(sent.len());
                let mut frames = Vec::with_capacity(sent.len() + len);
                frames.extend_from_slice(&sent[..at]);
                match run {
                    Some(run) => {
                        frames.extend_from_slice(run);
                        frames.extend_from_slice(&sent[at..]);
                        self.taken += len as u64;
                    }
                    None => {
                        // Never expected (BPF names only a memo whose sample it sent):
                        // the frames below the run would be a stack with a hole, so the
                        // walk ends where the run began, marked broken.
                        walk.header.flags |= lua_flags::BROKEN as u16;
                        self.missing += 1;
                    }
                }
                walk.header.nframes = frames.len() as u16;
                walk.frames = Cow::Owned(frames);
            }
            _ => {}
        }
        walk
    }
}

impl super::LuaVms {
    /// Keeps the memo a walk not otherwise looked at made (a sample taken too late).
    pub fn keep_memo(&mut self, sample: &Sample, walk: Option<LuaWalk>) {
        if let Some(walk) = walk {
            self.memos.resolve(sample.cpu, walk);
        }
    }

    /// Lua frames taken unchanged from their CPU's last full walk, and walks cut where the
    /// memo they named was not received.
    pub fn frames_from_memos(&self) -> (u64, u64) {
        (self.memos.taken, self.memos.missing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raw::RawLuaStack;

    fn frame(ptr: u64) -> RawLuaFrame {
        RawLuaFrame {
            ptr,
            ..RawLuaFrame::default()
        }
    }

    fn walk(memo: u8, seq: u64, at: u16, from: u16, len: u16, ptrs: &[u64]) -> LuaWalk<'static> {
        LuaWalk {
            header: RawLuaStack {
                nframes: ptrs.len() as u16,
                memo,
                memo_seq: seq,
                memo_at: at,
                memo_from: from,
                memo_len: len,
                ..RawLuaStack::default()
            },
            frames: Cow::Owned(ptrs.iter().map(|&p| frame(p)).collect()),
        }
    }

    fn ptrs(w: &LuaWalk) -> Vec<u64> {
        w.frames.iter().map(|f| f.ptr).collect()
    }

    #[test]
    fn a_run_is_put_where_it_was_taken() {
        let mut m = Memos::default();
        // A trace's frame (not noted), then the memo's five frames.
        let made = m.resolve(0, walk(MEMO_MADE, 7, 1, 0, 5, &[9, 1, 2, 3, 4, 5]));
        assert_eq!(ptrs(&made), [9, 1, 2, 3, 4, 5]);
        // A new innermost frame, the memo's frames 2.. (three), then a frame below them.
        let taken = m.resolve(0, walk(MEMO_TAKEN, 7, 1, 2, 3, &[8, 6]));
        assert_eq!(ptrs(&taken), [8, 3, 4, 5, 6]);
        assert_eq!(taken.header.nframes, 5);
        assert_eq!(taken.header.flags, 0);
        assert_eq!((m.taken, m.missing), (3, 0));
    }

    #[test]
    fn a_memo_of_another_cpu_or_number_is_not_taken() {
        let mut m = Memos::default();
        m.resolve(0, walk(MEMO_MADE, 7, 0, 0, 3, &[1, 2, 3]));
        for (cpu, seq) in [(1, 7), (0, 6)] {
            let w = m.resolve(cpu, walk(MEMO_TAKEN, seq, 1, 0, 2, &[8, 6]));
            assert_eq!(ptrs(&w), [8], "cut where the run began");
            assert_ne!(w.header.flags & lua_flags::BROKEN as u16, 0);
        }
        assert_eq!((m.taken, m.missing), (0, 2));
        // A run past the memo's end is missing too.
        let w = m.resolve(0, walk(MEMO_TAKEN, 7, 0, 2, 2, &[]));
        assert!(w.frames.is_empty());
        assert_eq!(m.missing, 3);
    }

    #[test]
    fn each_vm_kind_has_its_own_memo() {
        let mut m = Memos::default();
        let mut puc = walk(MEMO_MADE, 1, 0, 0, 2, &[5, 6]);
        puc.header.flags = lua_flags::PUC as u16;
        m.resolve(0, walk(MEMO_MADE, 1, 0, 0, 2, &[1, 2]));
        m.resolve(0, puc);
        let w = m.resolve(0, walk(MEMO_TAKEN, 1, 0, 0, 2, &[]));
        assert_eq!(ptrs(&w), [1, 2]);
    }

    #[test]
    fn the_last_memo_of_a_cpu_replaces_the_one_before() {
        let mut m = Memos::default();
        m.resolve(2, walk(MEMO_MADE, 1, 0, 0, 2, &[1, 2]));
        m.resolve(2, walk(MEMO_MADE, 2, 0, 0, 2, &[3, 4]));
        let w = m.resolve(2, walk(MEMO_TAKEN, 2, 0, 0, 2, &[]));
        assert_eq!(ptrs(&w), [3, 4]);
        let w = m.resolve(2, walk(MEMO_TAKEN, 1, 0, 0, 2, &[]));
        assert!(w.frames.is_empty());
    }
}
