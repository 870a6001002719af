//! What lrec and lanalyze both know about the programs they meet, in one place:
//!
//! - [`elf`]: the `Binary` record of an ELF file (what lrec embeds in a capture, and what
//!   lanalyze reads from a local file), symbols and unwind entries;
//! - [`debug_files`]: separate debug files, found by build-id or `.gnu_debuglink`;
//! - [`lua`]: the Lua VMs in a binary (LuaJIT's interpreter, PUC Lua's `luaV_execute`),
//!   and each VM's layout: the offsets lrec's BPF walker, its heap snapshots and lanalyze's
//!   heap walker read, each stated once by name, learned from the binary (DWARF, the VM's
//!   and the C API's machine code) with the releases' layouts as cross-checks;
//! - [`files`]: output files created safely (no links followed, nothing foreign replaced).
//!
//! The capture format itself (`lrec-format`) stays a leaf that knows none of this (of the
//! OS it only opens, maps and writes files).

pub mod budget;
pub mod debug_files;
pub mod dwarf;
pub mod elf;
pub mod eval;
pub mod files;
pub mod lua;
pub mod symbolic;
pub mod x86;

/// Both tools' `--version`: the crate's, or what `make dist` gives (`LREC_VERSION`: the
/// version, the commit and how it was built).
pub const VERSION: &str = match option_env!("LREC_VERSION") {
    Some(v) => v,
    None => env!("CARGO_PKG_VERSION"),
};
