//! Lua frames in native stacks: the one merge step, shared by the Lua VMs.
//!
//! A Lua VM runs Lua code inside native frames of its own (LuaJIT: the `lj_vm_*` frames
//! entered by lua_call/lua_pcall/lua_resume, each with a C frame, its "cframe"). lrec
//! records, with every Lua frame, the stack address of the native VM frame that runs it.
//! Native unwinding yields each frame's stack pointer, so each Lua frame goes exactly in
//! place of its VM frame: nginx → ngx_http_lua_* → lua_resume → handler → callee →
//! string.gsub → (C) → callback. VM-specific labels live in [`luajit`]; PUC Lua, whose
//! VM frames are told apart otherwise, is merged by [`puc`].

pub mod luajit;
pub mod puc;

use std::ops::Range;

use lrec_format::{lua_flags, lua_frame_kind, LuaRuntime, LuaStack};

use crate::unwind::{CodeAddress, VmHint};

/// One frame of a merged stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Merged {
    /// The native frame at this index of the unwound stack.
    Native(usize),
    /// The Lua frame at this index of the Lua stack.
    Lua(usize),
    /// The VM's state when it is not running Lua code (garbage collector, JIT compiler).
    State(&'static str),
}

/// Whether a runtime is PUC Lua's (whose frames [`puc::merge`] places), not LuaJIT's.
pub fn is_puc(rt: &LuaRuntime) -> bool {
    rt.vm.starts_with("Lua 5.")
}

/// The C frames of a Lua stack, ascending, for [`VmHint::cframes`].
pub fn cframes(stack: &LuaStack, out: &mut Vec<u64>) {
    out.clear();
    out.extend(stack.frames.iter().map(|f| f.cframe).filter(|&c| c != 0));
    if stack.cframe != 0 {
        out.push(stack.cframe);
    }
    out.sort_unstable();
    out.dedup();
}

/// Merges the native frames (leaf first, as unwound) with the Lua frames of the same
/// sample into `out` (leaf first).
///
/// - A native VM frame whose stack pointer is a cframe is replaced by the Lua frames it
///   ran (a VM frame running none, as lua_cpcall's, stays native).
/// - VM code below the innermost cframe (helpers such as `lj_vm_floor`) and JIT-compiled
///   code, marked by the unwinder as [`CodeAddress::vm_work`], are the Lua frames' own
///   work: dropped.
/// - A C function the VM called directly is shown once, by its Lua frame (which names
///   built-ins `string.gsub`, not by the symbol of their C implementation).
/// - Lua frames whose VM frame the native unwinding did not reach (a stack cut short)
///   are kept, outermost last.
/// - A suspended coroutine's frames ([`lua_flags::SUSPENDED`]: a Lua wait, taken as its
///   resumer entered lua_resume) replace that lua_resume frame, at the native leaf.
///
/// Returns whether every Lua frame replaced a VM frame: when not, and the native stack is
/// complete, the Lua frames have no place in it (the caller must not show them there).
pub fn merge(
    native: &[CodeAddress],
    stack: &LuaStack,
    vm: &VmHint,
    state: Option<&'static str>,
    out: &mut Vec<Merged>,
) -> bool {
    out.clear();
    if stack.flags & lua_flags::SUSPENDED != 0 {
        // The native leaf is lua_resume itself (the probe is at its entry), replaced by
        // the frames it resumes, as a running coroutine's are.
        out.extend((0..stack.frames.len()).map(Merged::Lua));
        out.extend((1..native.len()).map(Merged::Native));
        return true;
    }
    // Segments of Lua frames run by one VM frame, innermost first, as index ranges.
    let mut segments: Vec<Range<usize>> = Vec::new();
    for (i, f) in stack.frames.iter().enumerate() {
        match segments.last_mut() {
            Some(s) if stack.frames[s.start].cframe == f.cframe => s.end = i + 1,
            _ => segments.push(i..i + 1),
        }
    }
    let mut placed = vec![false; segments.len()];
    let mut state = state;
    for (i, f) in native.iter().enumerate() {
        if f.vm_work {
            continue;
        }
        if vm.in_vm(f.lookup_avma()) {
            let seg = segments
                .iter()
                .position(|s| stack.frames[s.start].cframe == f.sp);
            if let Some(k) = seg.filter(|&k| !placed[k]) {
                placed[k] = true;
                let seg = segments[k].clone();
                if stack.frames[seg.start].kind != lua_frame_kind::LUA
                    && i > 0
                    && out.last() == Some(&Merged::Native(i - 1))
                {
                    out.pop();
                }
                if let Some(s) = state.take() {
                    out.push(Merged::State(s));
                }
                out.extend(seg.map(Merged::Lua));
                continue;
            }
        }
        out.push(Merged::Native(i));
    }
    for (k, seg) in segments.iter().enumerate() {
        if !placed[k] {
            if let Some(s) = state.take() {
                out.push(Merged::State(s));
            }
            out.extend(seg.clone().map(Merged::Lua));
        }
    }
    placed.iter().all(|&p| p)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use lrec_format::LuaFrame;

    /// A native frame at `avma` (a return address) whose stack pointer is `sp`.
    pub(crate) fn native(avma: u64, sp: u64) -> CodeAddress {
        CodeAddress {
            avma,
            is_return: true,
            region: None,
            sp,
            vm_work: false,
        }
    }

    fn lua(kind: u8, function: u32, cframe: u64) -> LuaFrame {
        LuaFrame {
            kind,
            function,
            cframe,
            pos: u32::MAX,
            ..LuaFrame::default()
        }
    }

    #[test]
    fn lua_frames_replace_their_vm_frames_and_c_functions_show_once() {
        // main → lua_pcall → VM@0x1000 [chunk, caller, table.sort] → sort (C) → lua_call →
        // VM@0x800 [comparator] → helper in the VM (leaf, below the cframe).
        let vm_code = [(0x10_0000, 0x20_0000)];
        let stack = LuaStack {
            cframe: 0x800,
            frames: vec![
                lua(lua_frame_kind::LUA, 3, 0x800),
                lua(lua_frame_kind::BUILTIN, 0, 0x1000),
                lua(lua_frame_kind::LUA, 2, 0x1000),
                lua(lua_frame_kind::LUA, 1, 0x1000),
            ],
            ..LuaStack::default()
        };
        let frames = [
            CodeAddress {
                vm_work: true,
                ..native(0x10_0100, 0x7f8) // helper, leaf
            },
            native(0x10_0200, 0x800), // VM frame of the comparator
            native(0x5000, 0x900),    // lua_call
            native(0x6000, 0x980),    // sort's C implementation
            native(0x10_0300, 0x1000),
            native(0x7000, 0x1100), // lua_pcall
        ];
        let mut cf = Vec::new();
        cframes(&stack, &mut cf);
        assert_eq!(cf, [0x800, 0x1000]);
        let hint = VmHint {
            code: &vm_code,
            cframes: &cf,
            innermost: 0x800,
        };
        let mut out = Vec::new();
        merge(&frames, &stack, &hint, None, &mut out);
        let lua_ids: Vec<String> = out
            .iter()
            .map(|m| match m {
                Merged::Native(i) => format!("n{i}"),
                Merged::Lua(i) => {
                    let f = &stack.frames[*i];
                    format!("l{}k{}", f.function, f.kind)
                }
                Merged::State(s) => s.to_string(),
            })
            .collect();
        assert_eq!(lua_ids, ["l3k0", "n2", "l0k2", "l2k0", "l1k0", "n5"]);
    }

    #[test]
    fn a_suspended_coroutine_replaces_the_lua_resume_it_was_taken_at() {
        // ngx_http_lua_run_thread → lua_resume (the probe, at its entry) resuming a
        // coroutine suspended in ngx.sleep (C) ← nap ← run; no C frame of its own.
        let stack = LuaStack {
            flags: lua_flags::SUSPENDED,
            frames: vec![
                lua(lua_frame_kind::C, 0, 0),
                lua(lua_frame_kind::LUA, 2, 0),
                lua(lua_frame_kind::LUA, 1, 0),
            ],
            ..LuaStack::default()
        };
        let frames = [
            native(0x10_0000, 0x7f0),
            native(0x5000, 0x800),
            native(0x6000, 0x900),
        ];
        let hint = VmHint {
            code: &[(0x10_0000, 0x20_0000)],
            cframes: &[],
            innermost: 0,
        };
        let mut out = Vec::new();
        merge(&frames, &stack, &hint, Some("GC"), &mut out);
        assert_eq!(
            out,
            [
                Merged::Lua(0),
                Merged::Lua(1),
                Merged::Lua(2),
                Merged::Native(1),
                Merged::Native(2)
            ]
        );
    }
}
