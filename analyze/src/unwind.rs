//! Turns a sample's registers and stack bytes into code addresses, leaf first.

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64};
use framehop::{FrameAddress, Unwinder};
use lrec_format::Regs;

use crate::address_space::AddressSpace;
use crate::cfi::Special;

/// Where the interrupted registers are in a signal frame on x86-64 Linux, from the stack
/// pointer at the signal trampoline (`ucontext_t`: 40 bytes of flags, link and
/// `stack_t`, then `gregs[]`, in which rbp is 10, rsp 15 and rip 16).
const SIGNAL_RBP: u64 = 40 + 10 * 8;
const SIGNAL_RSP: u64 = 40 + 15 * 8;
const SIGNAL_RIP: u64 = 40 + 16 * 8;

/// Deeper stacks are cut here and marked truncated (a loop in corrupt data, or recursion).
pub const MAX_FRAMES: usize = 2048;
/// How far above a VM helper's or a trace's stack pointer the VM's C frame is looked for
/// when the sample does not say where it is (bytes).
const CFRAME_SEARCH: u64 = 2048;

/// Per-thread state reused across samples: framehop's rule cache, what is known of each
/// code address and a frame buffer.
pub struct UnwindCache {
    rules: CacheX86_64,
    known: KnownAddresses,
    frames: Vec<CodeAddress>,
}

impl UnwindCache {
    pub fn new() -> UnwindCache {
        UnwindCache {
            rules: CacheX86_64::new(),
            known: KnownAddresses {
                slots: vec![None; KNOWN_SLOTS],
            },
            frames: Vec::with_capacity(256),
        }
    }
}

/// Slots of [`KnownAddresses`] (direct-mapped).
const KNOWN_SLOTS: usize = 4096;

/// What the address space says of code addresses: two binary searches each, which the same
/// addresses, sample after sample, would otherwise repeat.
struct KnownAddresses {
    slots: Vec<Option<Known>>,
}

#[derive(Debug, Clone, Copy)]
struct Known {
    /// The address space asked ([`AddressSpace`]'s address).
    space: usize,
    lookup: u64,
    first_frame: bool,
    /// The executable region holding `lookup`.
    executable: Option<usize>,
    covered: bool,
    special: Option<Special>,
}

impl KnownAddresses {
    fn get(&mut self, space: &AddressSpace, lookup: u64, first_frame: bool) -> Known {
        let id = space as *const AddressSpace as usize;
        let slot = &mut self.slots[((lookup ^ (lookup >> 12)) as usize) % KNOWN_SLOTS];
        match *slot {
            Some(k) if k.space == id && k.lookup == lookup && k.first_frame == first_frame => k,
            _ => *slot.insert(Known::of(space, id, lookup, first_frame)),
        }
    }
}

impl Known {
    fn of(space: &AddressSpace, id: usize, lookup: u64, first_frame: bool) -> Known {
        let executable = space
            .region_index(lookup)
            .filter(|&i| space.region_at(i).executable);
        let r = executable.map(|i| space.region_at(i));
        // A thread stopped in the kernel's rt_sigreturn has its ip just past the
        // trampoline's `syscall`, its last instruction.
        let special = r.and_then(|r| {
            r.cfi_special(lookup, first_frame).or_else(|| {
                r.cfi_special(lookup.checked_sub(1)?, false)
                    .filter(|_| first_frame)
            })
        });
        Known {
            space: id,
            lookup,
            first_frame,
            executable,
            covered: r.is_some_and(|r| r.cfi_covers(lookup)),
            special,
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
    /// The stack pointer while this frame runs (the CFA of the frame it called).
    pub sp: u64,
    /// Work of a Lua VM below its innermost C frame: a VM helper or JIT-compiled code,
    /// which the VM's Lua frames stand for.
    pub vm_work: bool,
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

pub(crate) use crate::profile::StackEnd;

/// The user part of a stack, leaf first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserStack<'a> {
    pub frames: &'a [CodeAddress],
    pub end: StackEnd,
    /// Start addresses of mappings without unwind info that unwinding had to pass through
    /// (framehop then falls back to frame pointers).
    pub without_unwind_info: Vec<u64>,
}

/// What unwinding needs to know about a Lua VM the sample ran in: where its interpreter
/// is and where its native C frames are. The VM's unwind info is valid only at its C
/// frames: in its helpers (entered with a call) and in JIT-compiled traces (no unwind info
/// at all) the unwinder continues at the innermost C frame above instead.
#[derive(Debug, Clone, Copy)]
pub struct VmHint<'a> {
    /// Interpreter code ranges (AVMA).
    pub code: &'a [(u64, u64)],
    /// Stack addresses of the VM's C frames, ascending.
    pub cframes: &'a [u64],
    /// The innermost of them.
    pub innermost: u64,
}

impl VmHint<'_> {
    pub fn in_vm(&self, avma: u64) -> bool {
        self.code.iter().any(|&(s, e)| avma >= s && avma < e)
    }

    /// An address in the interpreter: any unwinds by its C frame's rule.
    fn any_vm_address(&self) -> u64 {
        let (start, end) = self.code[0];
        start + (end - start) / 2
    }

    /// The innermost C frame at or above `sp` that is not `sp` itself.
    fn cframe_above(&self, sp: u64) -> Option<u64> {
        self.cframes.iter().copied().find(|&c| c > sp)
    }
}

/// The search for a LuaJIT VM's C frame in a sample's stack bytes.
struct Search<'a> {
    space: &'a AddressSpace,
    stack: &'a [u8],
    /// The stack pointer `stack` begins at.
    stack_sp: u64,
}

impl Search<'_> {
    /// The first 8-byte aligned place at or above `from` (within [`CFRAME_SEARCH`]) from
    /// which the VM's unwind rule leads, frame by frame by CFI, to a frame that says it
    /// has no caller (`_start`, `clone3`): random stack words do not.
    fn cframe(
        &self,
        from: u64,
        vm: &VmHint,
        known: &mut KnownAddresses,
        rules: &mut CacheX86_64,
    ) -> Option<u64> {
        (0..CFRAME_SEARCH / 8)
            .map(|i| (from & !7) + 8 * i)
            .filter(|&c| c >= from)
            .find(|&c| self.completes(c, vm, known, rules))
    }

    /// Whether unwinding from the VM's code with the stack pointer at `c` completes: the VM's
    /// frame has a caller (a zero word there is no frame), and a frame outside the VM ends
    /// the stack.
    fn completes(
        &self,
        c: u64,
        vm: &VmHint,
        known: &mut KnownAddresses,
        rules: &mut CacheX86_64,
    ) -> bool {
        let mut read_stack = |addr: u64| -> Result<u64, ()> {
            let off =
                usize::try_from(addr.checked_sub(self.stack_sp).ok_or(())?).map_err(|_| ())?;
            let bytes = self
                .stack
                .get(off..off.checked_add(8).ok_or(())?)
                .ok_or(())?;
            Ok(u64::from_le_bytes(bytes.try_into().unwrap()))
        };
        let mut uregs = UnwindRegsX86_64::new(vm.any_vm_address(), c, 0);
        let mut address = FrameAddress::InstructionPointer(vm.any_vm_address());
        for depth in 0..MAX_FRAMES {
            let (avma, is_return) = match address {
                FrameAddress::InstructionPointer(a) => (a, false),
                FrameAddress::ReturnAddress(a) => (a.get(), true),
            };
            let lookup = if is_return { avma - 1 } else { avma };
            let k = known.get(self.space, lookup, !is_return);
            if k.executable.is_none() || !k.covered || k.special.is_some() {
                return false;
            }
            match self
                .space
                .unwinder
                .unwind_frame(address, &mut uregs, rules, &mut read_stack)
            {
                // The VM's own caller is C code that called into it.
                Ok(Some(ra)) => match FrameAddress::from_return_address(ra) {
                    Some(a) if depth > 0 || !vm.in_vm(a.address_for_lookup()) => address = a,
                    _ => return false,
                },
                Ok(None) => return depth > 0,
                Err(_) => return false,
            }
        }
        false
    }
}

/// Unwinds from `regs` over `stack` (the bytes at `regs.sp` upward).
///
/// Every frame is unwound by its CFI or not at all: a return address outside executable
/// memory, or a frame whose address no FDE covers, ends the stack there as truncated.
/// framehop would otherwise fall back to frame pointers, which over code built without
/// them skips callers silently, and a profiler must not show that. A stack is complete
/// only when the last frame's own CFI says it has no caller. The one exception is a Lua
/// VM's code ([`VmHint`]): its C frames are known exactly, so unwinding continues there.
pub fn unwind_user<'c>(
    space: &AddressSpace,
    regs: &Regs,
    stack: &[u8],
    cache: &'c mut UnwindCache,
    vm: Option<VmHint>,
) -> UserStack<'c> {
    let sp = regs.sp;
    let mut read_stack = |addr: u64| -> Result<u64, ()> {
        let off = usize::try_from(addr.checked_sub(sp).ok_or(())?).map_err(|_| ())?;
        let bytes = stack.get(off..off.checked_add(8).ok_or(())?).ok_or(())?;
        Ok(u64::from_le_bytes(bytes.try_into().unwrap()))
    };
    let frames = &mut cache.frames;
    let known = &mut cache.known;
    frames.clear();
    let mut without_unwind_info = Vec::new();
    let mut uregs = UnwindRegsX86_64::new(regs.ip, regs.sp, regs.bp);
    let mut address = FrameAddress::InstructionPointer(regs.ip);
    // The next frame stands for a VM C frame found by searching (its address is any of
    // the interpreter's): the VM's work, not a place in its code.
    let mut searched = false;
    let end = loop {
        if frames.len() >= MAX_FRAMES {
            break StackEnd::Truncated;
        }
        let (avma, is_return) = match address {
            FrameAddress::InstructionPointer(avma) => (avma, false),
            FrameAddress::ReturnAddress(avma) => (avma.get(), true),
        };
        let lookup = if is_return { avma - 1 } else { avma };
        let Known {
            executable,
            covered,
            special,
            ..
        } = known.get(space, lookup, !is_return);
        if is_return && executable.is_none() {
            break StackEnd::Truncated;
        }
        let frame_sp = uregs.sp();
        frames.push(CodeAddress {
            avma,
            is_return,
            region: executable,
            sp: frame_sp,
            vm_work: std::mem::take(&mut searched),
        });
        if let Some(vm) = vm {
            let in_vm = vm.in_vm(lookup);
            // JIT-compiled code: anonymous memory, or memory mapped after maps were read
            // (LuaJIT maps new machine-code areas as it compiles).
            let jit_code =
                !covered && executable.is_none_or(|i| space.region_at(i).image.is_none());
            // Below the innermost C frame: a helper the VM called, or one of a trace.
            let off_cframe = in_vm && frame_sp < vm.innermost;
            // Compiled code is always Lua frames' work, also above the innermost C frame
            // (a trace that called C code which called back into Lua).
            if let Some(f) = frames.last_mut() {
                f.vm_work |= jit_code || (in_vm && frame_sp < vm.innermost);
            }
            if jit_code || off_cframe {
                if let Some(cf) = vm.cframe_above(frame_sp) {
                    // Any interpreter address unwinds by the C frame's rule.
                    uregs.set_sp(cf);
                    address = FrameAddress::InstructionPointer(vm.any_vm_address());
                    continue;
                }
            }
            // The sample has no Lua stack (the VM's layout is not known): its C frames are
            // found as the first place at or above here from which the VM's rule unwinds
            // the whole stack (a helper runs 8 bytes below one; a trace some more).
            if vm.cframes.is_empty() && (jit_code || in_vm) {
                let search = Search {
                    space,
                    stack,
                    stack_sp: sp,
                };
                if let Some(cf) = search.cframe(frame_sp, &vm, known, &mut cache.rules) {
                    if let Some(f) = frames.last_mut() {
                        f.vm_work |= cf != frame_sp || jit_code;
                    }
                    if cf != frame_sp || jit_code {
                        uregs.set_sp(cf);
                        address = FrameAddress::InstructionPointer(vm.any_vm_address());
                        searched = true;
                        continue;
                    }
                }
            }
        }
        // The next frame would be unwound by this one's rule. Without CFI here framehop
        // would guess with frame pointers and could skip callers: stop instead.
        if !covered && special.is_none() {
            if let Some(r) = executable.map(|i| space.region_at(i)) {
                if !r.has_unwind_info && !without_unwind_info.contains(&r.start) {
                    without_unwind_info.push(r.start);
                }
            }
            break StackEnd::Truncated;
        }
        match special {
            // The handler returned here; the caller is whatever the signal interrupted, at
            // any instruction: it is unwound as a leaf is.
            Some(Special::SignalTrampoline) => {
                // The handler "returns" to the trampoline's first byte, not after a call:
                // named by that byte (glibc starts its FDE one byte early for unwinders
                // that look up the byte before a return address).
                if let Some(f) = frames.last_mut() {
                    f.is_return = false;
                }
                let at = |off: u64| read_stack(frame_sp.checked_add(off).ok_or(())?);
                match (at(SIGNAL_RIP), at(SIGNAL_RSP), at(SIGNAL_RBP)) {
                    (Ok(ip), Ok(rsp), Ok(bp)) if rsp > frame_sp && ip != 0 => {
                        uregs = UnwindRegsX86_64::new(ip, rsp, bp);
                        address = FrameAddress::InstructionPointer(ip);
                        continue;
                    }
                    _ => break StackEnd::Truncated,
                }
            }
            // Outside the frame its CFI claims: rbp is still (or again) the caller's.
            Some(Special::ReturnAt { words }) => {
                let slot = frame_sp + 8 * words;
                match read_stack(slot)
                    .ok()
                    .and_then(FrameAddress::from_return_address)
                {
                    Some(a) => {
                        uregs.set_sp(slot + 8);
                        address = a;
                        continue;
                    }
                    None => break StackEnd::Truncated,
                }
            }
            None => {}
        }
        match space
            .unwinder
            .unwind_frame(address, &mut uregs, &mut cache.rules, &mut read_stack)
        {
            Ok(Some(ra)) => match FrameAddress::from_return_address(ra) {
                Some(a) => address = a,
                None => break StackEnd::Truncated,
            },
            // Only reached from a frame with CFI: its unwind info said there is no caller
            // (`_start`, `clone3`).
            Ok(None) => break StackEnd::Complete,
            Err(_) => break StackEnd::Truncated,
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
