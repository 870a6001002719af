//! LuaJIT's labels: chunk names as Lua's own short_src, built-in functions by library name,
//! and the VM states of `G->vmstate` (as `luajit -jp=v` tells them apart).

use lrec_inspect::lua::luajit::{FRAME_CONT, FRAME_LUA};

/// `G->vmstate` holds a trace number (≥ 0) while JIT-compiled code runs, else
/// `~LJ_VMST_*` (lj_obj.h).
pub fn state_name(vmstate: i32) -> &'static str {
    match vmstate {
        s if s >= 0 => "JIT-compiled",
        -1 => "interpreted",
        -2 => "C",
        -3 => "GC",
        -4 => "trace exit",
        -7..=-5 => "JIT compiler",
        _ => "unknown",
    }
}

/// The frame shown on top of the Lua frames while the garbage collector runs.
pub const GC_FRAME: &str = "[GC]";
/// The frame shown on top of the Lua frames while the JIT compiler runs.
pub const JIT_COMPILER_FRAME: &str = "[JIT compiler]";

/// The frame shown on top of the Lua frames in states that run no Lua code.
pub fn state_frame(vmstate: i32) -> Option<&'static str> {
    match vmstate {
        -3 => Some(GC_FRAME),
        -7..=-5 => Some(JIT_COMPILER_FRAME),
        _ => None,
    }
}

/// Whether a frame whose link has FRAME_* type `link` (the low 3 bits) was called by a Lua
/// function's instruction: a Lua frame (its link is the return PC, so only the low 2 bits
/// are the type) or a continuation frame (a metamethod the VM called).
pub fn called_by_lua(link: u8) -> bool {
    let link = u64::from(link);
    link & 3 == FRAME_LUA || link & 7 == FRAME_CONT
}

/// The longest chunk label derived from source text, as LUA_IDSIZE bounds short_src.
const IDSIZE: usize = 60;

/// A chunk name as Lua prints it (lj_debug_shortname): `@file` → `file` (never cut),
/// `=name` → `name`, source text → `[string "first line..."]`.
pub fn chunk_label(chunkname: &str) -> String {
    if let Some(file) = chunkname.strip_prefix('@') {
        return file.to_string();
    }
    if let Some(name) = chunkname.strip_prefix('=') {
        return name.to_string();
    }
    let line = chunkname.lines().next().unwrap_or("");
    let room = IDSIZE - "[string \"...\"]".len();
    let cut = line.len() > room || line.len() < chunkname.trim_end_matches('\n').len();
    let mut text: String = line.chars().take(room).collect();
    if cut {
        text.push_str("...");
    }
    format!("[string \"{text}\"]")
}

/// A built-in function's name (`string.gsub`), `builtin#N` when the build's table lacks it.
pub fn builtin_name(builtins: &[String], ffid: u8) -> String {
    match builtins.get(usize::from(ffid)) {
        Some(n) if !n.is_empty() => n.clone(),
        _ => format!("builtin#{ffid}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_names_read_like_short_src() {
        assert_eq!(chunk_label("@app/handler.lua"), "app/handler.lua");
        assert_eq!(chunk_label("=stdin"), "stdin");
        assert_eq!(chunk_label("return 1"), "[string \"return 1\"]");
        assert_eq!(
            chunk_label("local x = 1\nreturn x"),
            "[string \"local x = 1...\"]"
        );
        let long = "x".repeat(100);
        assert_eq!(chunk_label(&long).len(), IDSIZE);
    }

    #[test]
    fn states_and_builtins() {
        assert_eq!(state_name(12), "JIT-compiled");
        assert_eq!(state_frame(-3), Some("[GC]"));
        assert_eq!(state_frame(-1), None);
        let b = vec![String::new(), String::new(), "assert".to_string()];
        assert_eq!(builtin_name(&b, 2), "assert");
        assert_eq!(builtin_name(&b, 9), "builtin#9");
    }

    #[test]
    fn callers_by_link_type() {
        // Lua frames (a return PC, low 2 bits clear), continuations (2), with the JIT bit.
        for link in [0u8, 4, 0x80, 0x84, 2, 0x82] {
            assert!(called_by_lua(link), "{link:#x}");
        }
        // C, vararg, C protected and pcall frames.
        for link in [1u8, 3, 5, 6, 7, 0x81, 0x83] {
            assert!(!called_by_lua(link), "{link:#x}");
        }
    }
}
