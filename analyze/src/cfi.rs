//! Which addresses of an image its call frame information covers.
//!
//! framehop unwinds an address without CFI by frame-pointer heuristics, silently; in code
//! built without frame pointers (or in JIT code, or a static binary's `.iplt`) that skips
//! callers and yields a wrong stack. The unwinder asks this index first and stops, marking
//! the stack truncated, where no FDE covers a frame.
//!
//! It also keeps the two kinds of FDE that framehop cannot unwind right:
//! - signal trampolines (`__restore_rt`, CIE augmentation "S"): their CFA is an expression
//!   reading the interrupted registers from the signal frame, which framehop does not
//!   evaluate;
//! - functions whose CFI says "CFA = rbp + 16" from their first byte on, as LuaJIT's
//!   `lj_vm_ffi_call` does: that is false before `push rbp; mov rbp, rsp` has run and after
//!   `leave`, so a leaf sampled there would unwind through a stale rbp.

use gimli::{
    BaseAddresses, CallFrameInstruction, CallFrameInstructionIter, CieOrFde,
    CommonInformationEntry, DebugFrame, EhFrame, EndianSlice, LittleEndian, Register, UnwindOffset,
    UnwindSection, X86_64,
};

use crate::image::Image;

/// Sorted, merged `[start, end)` ranges of SVMAs covered by an FDE, and the FDEs framehop
/// needs help with.
#[derive(Debug, Default)]
pub struct CfiIndex {
    ranges: Vec<(u64, u64)>,
    /// Sorted `[start, end)` of signal trampolines.
    signal: Vec<(u64, u64)>,
    /// Sorted `[start, end)` of FDEs whose CFA is rbp-based at their first byte.
    frame_at_entry: Vec<(u64, u64)>,
}

/// What an address is to the unwinder, beyond being covered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Special {
    /// The return point of a signal handler: the caller is the interrupted context,
    /// saved in the signal frame's `ucontext_t` at the stack pointer.
    SignalTrampoline,
    /// Before the frame is set up or after `leave` in a function whose CFI claims the
    /// frame from its first byte: the return address is at `[sp + 8 * words]`.
    ReturnAt { words: u64 },
}

impl CfiIndex {
    pub fn of(image: &Image) -> CfiIndex {
        // Collected unsorted into the index's own fields, then put in order.
        let mut index = CfiIndex::default();
        let addr = |name: &str| image.section(name).map_or(0, |s| s.addr);
        if let Some(data) = image.data(".eh_frame") {
            let bases = BaseAddresses::default()
                .set_eh_frame(addr(".eh_frame"))
                .set_eh_frame_hdr(addr(".eh_frame_hdr"))
                .set_text(addr(".text"));
            collect(&EhFrame::new(data, LittleEndian), &bases, &mut index);
        }
        if let Some(data) = image.data(".debug_frame") {
            collect(
                &DebugFrame::new(data, LittleEndian),
                &BaseAddresses::default(),
                &mut index,
            );
        }
        index.signal.sort_unstable();
        index.frame_at_entry.sort_unstable();
        CfiIndex {
            signal: index.signal,
            frame_at_entry: index.frame_at_entry,
            ..CfiIndex::from_ranges(index.ranges)
        }
    }

    pub fn from_ranges(mut ranges: Vec<(u64, u64)>) -> CfiIndex {
        ranges.retain(|(s, e)| s < e);
        ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for (s, e) in ranges {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        CfiIndex {
            ranges: merged,
            ..CfiIndex::default()
        }
    }

    pub fn covers(&self, svma: u64) -> bool {
        within(&self.ranges, svma).is_some()
    }

    /// How to unwind `svma` where framehop would not do it right. `first_frame`: the
    /// address is where the thread was stopped (not a return address), so it may be at
    /// any instruction, also in a prologue or an epilogue.
    pub fn special(&self, svma: u64, first_frame: bool) -> Option<Special> {
        if within(&self.signal, svma).is_some() {
            return Some(Special::SignalTrampoline);
        }
        if !first_frame {
            return None;
        }
        let (start, end) = within(&self.frame_at_entry, svma)?;
        // `push rbp` (1 byte) not yet run, or the last byte (`ret`, after `leave`).
        if svma == start || svma + 1 == end {
            Some(Special::ReturnAt { words: 0 })
        } else if svma == start + 1 {
            Some(Special::ReturnAt { words: 1 })
        } else {
            None
        }
    }
}

/// The range of sorted, disjoint `ranges` holding `svma`.
fn within(ranges: &[(u64, u64)], svma: u64) -> Option<(u64, u64)> {
    let i = ranges.partition_point(|&(s, _)| s <= svma);
    let r = *ranges.get(i.checked_sub(1)?)?;
    (svma < r.1).then_some(r)
}

/// Adds the range of every FDE that parses; a damaged entry ends the walk (what was found
/// before it still counts).
fn collect<'a, S>(section: &S, bases: &BaseAddresses, out: &mut CfiIndex)
where
    S: UnwindSection<EndianSlice<'a, LittleEndian>>,
{
    let mut cies: Vec<Cie> = Vec::new();
    let mut entries = section.entries(bases);
    while let Ok(Some(entry)) = entries.next() {
        if let CieOrFde::Fde(partial) = entry {
            // Each CIE is parsed once, not once for each of its FDEs.
            let cie = |section: &S, bases: &BaseAddresses, offset: S::Offset| {
                let key = UnwindOffset::into(offset);
                if let Some(c) = cies.iter().find(|c| c.offset == key) {
                    return Ok(c.cie.clone());
                }
                let cie = section.cie_from_offset(bases, offset)?;
                cies.push(Cie {
                    offset: key,
                    cie: cie.clone(),
                    cfa_register: cfa_register_after(cie.instructions(section, bases), None),
                });
                Ok(cie)
            };
            if let Ok(fde) = partial.parse(cie) {
                let start = fde.initial_address();
                let range = (start, start.saturating_add(fde.len()));
                out.ranges.push(range);
                if fde.is_signal_trampoline() {
                    out.signal.push(range);
                }
                let at_entry = cies
                    .iter()
                    .find(|c| c.offset == fde.cie().offset())
                    .and_then(|c| c.cfa_register);
                if cfa_register_after(fde.instructions(section, bases), at_entry)
                    == Some(X86_64::RBP)
                {
                    out.frame_at_entry.push(range);
                }
            }
        }
    }
}

/// A CIE as parsed once, with the register its initial instructions base the CFA on.
struct Cie<'a> {
    offset: usize,
    cie: CommonInformationEntry<EndianSlice<'a, LittleEndian>>,
    cfa_register: Option<Register>,
}

/// The CFA register after `instructions` up to their first advance, from `register`.
fn cfa_register_after(
    mut instructions: CallFrameInstructionIter<EndianSlice<'_, LittleEndian>>,
    mut register: Option<Register>,
) -> Option<Register> {
    while let Ok(Some(i)) = instructions.next() {
        match i {
            CallFrameInstruction::DefCfa { register: r, .. }
            | CallFrameInstruction::DefCfaSf { register: r, .. }
            | CallFrameInstruction::DefCfaRegister { register: r } => register = Some(r),
            CallFrameInstruction::DefCfaExpression { .. } => register = None,
            CallFrameInstruction::AdvanceLoc { .. } | CallFrameInstruction::SetLoc { .. } => break,
            _ => {}
        }
    }
    register
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_and_answer() {
        let idx = CfiIndex::from_ranges(vec![(30, 40), (10, 20), (20, 25), (50, 50)]);
        assert_eq!(idx.special(10, true), None);
        assert_eq!(idx.ranges, vec![(10, 25), (30, 40)]);
        assert!(idx.covers(10) && idx.covers(24) && idx.covers(30));
        assert!(!idx.covers(9) && !idx.covers(25) && !idx.covers(40) && !idx.covers(50));
        assert!(!CfiIndex::default().covers(0));
    }

    #[test]
    fn prologue_and_epilogue_of_a_frame_claimed_from_entry() {
        let idx = CfiIndex {
            ranges: vec![(0x100, 0x1a0)],
            signal: vec![(0x180, 0x1a0)],
            frame_at_entry: vec![(0x100, 0x140)],
        };
        let ret = |words| Some(Special::ReturnAt { words });
        assert_eq!(idx.special(0x100, true), ret(0));
        assert_eq!(idx.special(0x101, true), ret(1));
        assert_eq!(idx.special(0x102, true), None);
        assert_eq!(idx.special(0x13f, true), ret(0));
        assert_eq!(idx.special(0x140, true), None);
        // A return address is after a call: the frame is set up there.
        assert_eq!(idx.special(0x13f, false), None);
        assert_eq!(idx.special(0x180, false), Some(Special::SignalTrampoline));
        assert_eq!(idx.special(0x19f, true), Some(Special::SignalTrampoline));
    }

    /// The index of a binary of this machine, if it has it.
    fn index_of(path: &str) -> Option<CfiIndex> {
        let Ok(data) = std::fs::read(path) else {
            eprintln!("SKIPPED: no {path}");
            return None;
        };
        let binary =
            lrec_inspect::elf::binary_record(path, &data, lrec_inspect::elf::DebugInfo::None);
        Some(CfiIndex::of(&Image::from_binary(&binary)))
    }

    /// glibc's `__restore_rt` is the one signal trampoline of libc.
    #[test]
    fn libc_has_one_signal_trampoline() {
        let Some(idx) = index_of("/lib/x86_64-linux-gnu/libc.so.6") else {
            return;
        };
        assert_eq!(idx.signal.len(), 1, "{:x?}", idx.signal);
        assert!(idx.signal[0].1 - idx.signal[0].0 < 32, "{:x?}", idx.signal);
    }

    /// LuaJIT's `lj_vm_ffi_call` claims its rbp frame from its first byte (Debian's luajit).
    #[test]
    fn luajit_ffi_call_claims_its_frame_from_entry() {
        let Some(idx) = index_of("/usr/bin/luajit") else {
            return;
        };
        assert_eq!(idx.frame_at_entry.len(), 1, "{:x?}", idx.frame_at_entry);
        assert!(idx.signal.is_empty());
    }

    #[test]
    fn this_test_binary_is_covered_at_its_own_code() {
        let exe = std::env::current_exe().unwrap();
        let data = std::fs::read(&exe).unwrap();
        let binary = lrec_inspect::elf::binary_record(
            &exe.to_string_lossy(),
            &data,
            lrec_inspect::elf::DebugInfo::None,
        );
        let idx = CfiIndex::of(&Image::from_binary(&binary));
        assert!(idx.ranges.len() > 100, "{} ranges", idx.ranges.len());
        let text = binary.section(".text").unwrap();
        // Most of .text is covered; the last byte after all code is not.
        assert!(idx.covers(idx.ranges[idx.ranges.len() / 2].0));
        assert!(!idx.covers(text.addr + text.size + 0x100_0000));
    }
}
