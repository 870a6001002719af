//! Turns a sample's registers and stack bytes into code addresses, leaf first.

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64};
use framehop::{FrameAddress, Unwinder};
use lrec_format::Regs;

use crate::address_space::AddressSpace;

/// Deeper stacks are cut here and marked truncated (a loop in corrupt data, or recursion).
pub const MAX_FRAMES: usize = 2048;

/// Per-thread state reused across samples: framehop's rule cache and a frame buffer.
pub struct UnwindCache {
    rules: CacheX86_64,
    frames: Vec<CodeAddress>,
}

impl UnwindCache {
    pub fn new() -> UnwindCache {
        UnwindCache {
            rules: CacheX86_64::new(),
            frames: Vec::with_capacity(256),
        }
    }
}

impl Default for UnwindCache {
    fn default() -> Self {
        Self::new()
    }
}

/// A user-space code address found by unwinding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeAddress {
    pub avma: u64,
    /// A return address: the call instruction is the byte before it.
    pub is_return: bool,
    /// The region of the address space holding `lookup_avma()`.
    pub region: Option<usize>,
}

impl CodeAddress {
    /// The address to look up symbols and unwind info at.
    pub fn lookup_avma(&self) -> u64 {
        if self.is_return {
            self.avma - 1
        } else {
            self.avma
        }
    }
}

/// How an unwind ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StackEnd {
    /// The root function was reached (its unwind info says there is no caller).
    Complete,
    /// Some frames were found, then unwinding stopped early.
    Truncated,
    /// Nothing beyond the leaf could be found.
    Failed,
}

/// The user part of a stack, leaf first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserStack<'a> {
    pub frames: &'a [CodeAddress],
    pub end: StackEnd,
    /// Start addresses of mappings without unwind info that unwinding had to pass through
    /// (framehop then falls back to frame pointers).
    pub without_unwind_info: Vec<u64>,
}

/// Unwinds from `regs` over `stack` (the bytes at `regs.sp` upward).
///
/// Every frame is unwound by its CFI or not at all: a return address outside executable
/// memory, or a frame whose address no FDE covers, ends the stack there as truncated.
/// framehop would otherwise fall back to frame pointers, which over code built without
/// them skips callers silently, and a profiler must not show that. A stack is complete
/// only when the last frame's own CFI says it has no caller.
pub fn unwind_user<'c>(
    space: &AddressSpace,
    regs: &Regs,
    stack: &[u8],
    cache: &'c mut UnwindCache,
) -> UserStack<'c> {
    let sp = regs.sp;
    let mut read_stack = |addr: u64| -> Result<u64, ()> {
        let off = usize::try_from(addr.checked_sub(sp).ok_or(())?).map_err(|_| ())?;
        let bytes = stack.get(off..off.checked_add(8).ok_or(())?).ok_or(())?;
        Ok(u64::from_le_bytes(bytes.try_into().unwrap()))
    };
    let frames = &mut cache.frames;
    frames.clear();
    let mut without_unwind_info = Vec::new();
    let mut iter = space.unwinder.iter_frames(
        regs.ip,
        UnwindRegsX86_64::new(regs.ip, regs.sp, regs.bp),
        &mut cache.rules,
        &mut read_stack,
    );
    let end = loop {
        if frames.len() >= MAX_FRAMES {
            break StackEnd::Truncated;
        }
        let frame = match iter.next() {
            Ok(Some(f)) => f,
            // Only reached from a frame with CFI: its unwind info said there is no caller
            // (`_start`, `clone3`).
            Ok(None) => break StackEnd::Complete,
            Err(_) => break StackEnd::Truncated,
        };
        let (avma, is_return) = match frame {
            FrameAddress::InstructionPointer(avma) => (avma, false),
            FrameAddress::ReturnAddress(avma) => (avma.get(), true),
        };
        let lookup = if is_return { avma - 1 } else { avma };
        let region = space.region_index(lookup);
        let executable = region.filter(|&i| space.region_at(i).executable);
        if is_return && executable.is_none() {
            break StackEnd::Truncated;
        }
        frames.push(CodeAddress {
            avma,
            is_return,
            region: executable,
        });
        // The next frame would be unwound by this one's rule. Without CFI here framehop
        // would guess with frame pointers and could skip callers: stop instead.
        let covered = executable.is_some_and(|i| space.region_at(i).cfi_covers(lookup));
        if !covered {
            if let Some(r) = executable.map(|i| space.region_at(i)) {
                if !r.has_unwind_info && !without_unwind_info.contains(&r.start) {
                    without_unwind_info.push(r.start);
                }
            }
            break StackEnd::Truncated;
        }
    };
    let end = match end {
        StackEnd::Truncated if frames.len() <= 1 => StackEnd::Failed,
        e => e,
    };
    UserStack {
        frames,
        end,
        without_unwind_info,
    }
}
