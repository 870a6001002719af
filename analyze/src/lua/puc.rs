//! PUC Lua 5.1–5.5: where each run of Lua frames goes among the native frames.
//!
//! PUC Lua runs Lua code in native `luaV_execute` frames: a Lua function called from
//! C (lua_call, lua_pcall, lua_resume, pcall, table.sort) or by the VM for a metamethod or
//! a for-in iterator starts a new one, marked "fresh" in its CallInfo (lrec derives the
//! mark for releases without it); Lua calling Lua continues in the same one. Each run of
//! Lua frames, from a fresh one to the innermost frame before the next fresh one, thus
//! replaces one `luaV_execute` frame, innermost run for innermost frame.
//!
//! Coroutines run on the native stack of their resumer, above it: lrec records where
//! each coroutine began there (its outermost `lua_longjmp`, set up by lua_resume), so
//! each coroutine's runs are matched only with the `luaV_execute` frames above that
//! point. After a yield inside pcall the VM continues a coroutine's outer frames without
//! their native frames (5.2+ `unroll`): those runs, without a frame of their own, go
//! right below the coroutine's outermost one.

use std::ops::Range;

use lrec_format::{lua_frame_kind, puc_link, puc_link::FRESH, LuaFrame, LuaStack};

use super::Merged;
use crate::unwind::CodeAddress;

/// Whether Lua frame `f` was called by the instruction its caller `caller` (the next
/// frame out, a Lua frame) runs: a call, or a metamethod or iterator the VM called for it.
/// Not across coroutines, nor when a tail call dropped the real caller.
pub fn called_by_lua(f: &LuaFrame, caller: &LuaFrame) -> bool {
    f.cframe == caller.cframe && f.link & puc_link::TAIL == 0
}

/// One thing a coroutine's Lua stack holds, innermost first.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Item {
    /// Lua frames one `luaV_execute` frame runs (indices into the Lua stack).
    Run(Range<usize>),
    /// A C function (its native frame shows it, when there is one).
    C(usize),
}

/// Merges the native frames (leaf first) with the Lua frames of a PUC Lua sample into
/// `out` (leaf first). `execute` is `luaV_execute`'s code (AVMA).
///
/// Returns whether every coroutine that runs Lua functions had a `luaV_execute` frame for
/// them: when not, and the native stack is complete, the Lua frames have no place in it
/// (`execute` is not where the interpreter runs; the caller must not show them there).
pub fn merge(
    native: &[CodeAddress],
    stack: &LuaStack,
    execute: (u64, u64),
    out: &mut Vec<Merged>,
) -> bool {
    out.clear();
    let is_execute = |a: &CodeAddress| {
        let pc = a.lookup_avma();
        pc >= execute.0 && pc < execute.1
    };
    // Coroutines, innermost first: (where it began on the native stack, 0 for the
    // outermost thread, and its items).
    let mut threads: Vec<(u64, Vec<Item>)> = Vec::new();
    for (i, f) in stack.frames.iter().enumerate() {
        if threads.last().is_none_or(|t| t.0 != f.cframe) {
            threads.push((f.cframe, Vec::new()));
        }
        let items = &mut threads.last_mut().expect("pushed above").1;
        if f.kind != lua_frame_kind::LUA {
            items.push(Item::C(i));
            continue;
        }
        match items.last_mut() {
            // Same run: the frame above was not where a luaV_execute began.
            Some(Item::Run(r)) if stack.frames[r.end - 1].link & FRESH == 0 => r.end = i + 1,
            _ => items.push(Item::Run(i..i + 1)),
        }
    }
    // The thread each native frame runs in: below (at lower addresses than) where the
    // coroutine began.
    let thread_of = |a: &CodeAddress| {
        threads
            .iter()
            .position(|t| t.0 == 0 || a.sp < t.0)
            .unwrap_or(threads.len())
    };
    let owner: Vec<usize> = native.iter().map(thread_of).collect();
    let mut executes = vec![0usize; threads.len() + 1];
    for (f, &t) in native.iter().zip(&owner) {
        executes[t] += usize::from(is_execute(f));
    }
    // For each thread, its items from the innermost, matched to its luaV_execute frames
    // from the innermost; what is left when its outermost one is matched (or when the
    // thread's native frames end, if it has none) has no native frame and goes there.
    let mut next_item = vec![0usize; threads.len()];
    let push_rest = |out: &mut Vec<Merged>, t: usize, next_item: &mut [usize]| {
        if t >= threads.len() {
            return;
        }
        // C functions outside the thread's outermost run called it from native code
        // (pmain, a host's function, lua_resume's caller): their native frames show them.
        let items = &threads[t].1;
        let end = items
            .iter()
            .rposition(|it| matches!(it, Item::Run(_)))
            .map_or(0, |k| k + 1)
            .max(next_item[t]);
        for item in &items[next_item[t]..end] {
            match item {
                Item::Run(r) => out.extend(r.clone().map(Merged::Lua)),
                Item::C(i) => out.push(Merged::Lua(*i)),
            }
        }
        next_item[t] = threads[t].1.len();
    };
    for (i, f) in native.iter().enumerate() {
        let t = owner[i];
        if i > 0 && owner[i - 1] != t {
            // Leaving a thread for its resumer.
            push_rest(out, owner[i - 1], &mut next_item);
        }
        if t < threads.len() && is_execute(f) {
            executes[t] -= 1;
            let items = &threads[t].1;
            // The thread's next run; C functions before it show by their native frames.
            let run = items[next_item[t]..]
                .iter()
                .position(|it| matches!(it, Item::Run(_)));
            if let Some(k) = run {
                let at = next_item[t] + k;
                if let Item::Run(r) = &items[at] {
                    out.extend(r.clone().map(Merged::Lua));
                }
                next_item[t] = at + 1;
                if executes[t] == 0 {
                    push_rest(out, t, &mut next_item);
                }
                continue;
            }
        }
        out.push(Merged::Native(i));
    }
    // Threads whose native frames the unwinding did not reach.
    for t in 0..threads.len() {
        push_rest(out, t, &mut next_item);
    }
    // Each thread running Lua functions ran them in at least one luaV_execute frame.
    threads.iter().enumerate().all(|(t, (_, items))| {
        !items.iter().any(|it| matches!(it, Item::Run(_)))
            || native
                .iter()
                .zip(&owner)
                .any(|(f, &o)| o == t && is_execute(f))
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::native;
    use super::*;
    use lrec_format::LuaFrame;

    fn lua(function: u32, fresh: bool, thread: u64) -> LuaFrame {
        LuaFrame {
            kind: lua_frame_kind::LUA,
            function,
            link: if fresh { FRESH } else { 0 },
            cframe: thread,
            pos: u32::MAX,
            ..LuaFrame::default()
        }
    }

    fn c(thread: u64) -> LuaFrame {
        LuaFrame {
            kind: lua_frame_kind::C,
            cframe: thread,
            pos: u32::MAX,
            ..LuaFrame::default()
        }
    }

    const EXEC: (u64, u64) = (0x1000, 0x2000);

    #[test]
    fn runs_replace_their_execute_frames() {
        // main → lua_pcall → execute [chunk → f] → luaB_pcall (C) → execute [g → h] → leaf.
        let stack = LuaStack {
            frames: vec![
                lua(4, false, 0), // h
                lua(3, true, 0),  // g, called by pcall
                c(0),             // pcall
                lua(2, false, 0), // f
                lua(1, true, 0),  // chunk
            ],
            ..LuaStack::default()
        };
        let frames = [
            native(0x5000, 0x100), // 0 leaf C
            native(0x1100, 0x200), // 1 execute
            native(0x6000, 0x300), // 2 luaD_call
            native(0x7000, 0x400), // 3 luaB_pcall
            native(0x1200, 0x500), // 4 execute
            native(0x8000, 0x600), // 5 lua_pcall
            native(0x9000, 0x700), // 6 main
        ];
        let mut out = Vec::new();
        merge(&frames, &stack, EXEC, &mut out);
        use Merged::*;
        assert_eq!(
            out,
            vec![
                Native(0),
                Lua(0),
                Lua(1),
                Native(2),
                Native(3),
                Lua(3),
                Lua(4),
                Native(5),
                Native(6)
            ]
        );
    }

    #[test]
    fn a_coroutine_after_a_yield_in_pcall_keeps_its_outer_frames() {
        // The coroutine (began at 0x400) runs f in the execute frame unroll called; its
        // pcall and body have no native frames any more. main runs resume.
        let stack = LuaStack {
            frames: vec![
                lua(5, true, 0x400), // f, pcall'ed
                c(0x400),            // pcall
                lua(4, true, 0x400), // body
                c(0),                // coroutine.resume
                lua(2, false, 0),    // caller
                lua(1, true, 0),     // chunk
            ],
            ..LuaStack::default()
        };
        let frames = [
            native(0x1100, 0x100), // 0 execute (f)
            native(0x6000, 0x200), // 1 unroll
            native(0x6100, 0x300), // 2 resume
            native(0x7000, 0x500), // 3 lua_resume (above 0x400: main's)
            native(0x7100, 0x600), // 4 luaB_coresume
            native(0x1200, 0x700), // 5 execute (main)
            native(0x9000, 0x800), // 6 main
        ];
        let mut out = Vec::new();
        merge(&frames, &stack, EXEC, &mut out);
        use Merged::*;
        assert_eq!(
            out,
            vec![
                Lua(0),
                Lua(1),
                Lua(2),
                Native(1),
                Native(2),
                Native(3),
                Native(4),
                Lua(4),
                Lua(5),
                Native(6)
            ]
        );
    }
}
