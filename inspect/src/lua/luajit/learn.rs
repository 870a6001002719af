//! Learning a LuaJIT build's layout from its binary: DWARF where the build kept it, else
//! the interpreter's machine code ([`super::vm_code`]) and the C API's
//! ([`super::capi`]). A field no evidence gives is placed by the known builds' layout
//! only where proved fields on both sides of it keep the known distance between them
//! (nothing was inserted there); the rest is unknown, and said. The result still has to
//! be proved on the live process before it is used (lrec does, on its samples).

use iced_x86::Instruction;

use super::releases::{KNOWN, UPSTREAM_GC32, UPSTREAM_GC64};
use super::{Builtins, Layout, Offsets};
use crate::dwarf::Structs;
use crate::elf::Code;
use crate::lua::detect::LuaJitVm;
use crate::lua::evidence::Assembly;
pub use crate::lua::evidence::Facts;

/// A layout learned from a binary, and how.
#[derive(Debug, Clone)]
pub struct Learned {
    pub layout: Layout,
    /// Each field's source: the evidence that gave it, or the fields it lies between.
    pub sources: Vec<(&'static str, String)>,
    /// Fields the BPF walker needs that nothing gave (the layout cannot be used).
    pub missing: Vec<&'static str>,
    /// Evidence that disagreed (the first source was kept).
    pub conflicts: Vec<String>,
}

impl Learned {
    /// One line for the user: what the layout is and what proves it.
    pub fn summary(&self) -> String {
        let mut kinds: Vec<&str> = self
            .sources
            .iter()
            .map(|(_, s)| s.split(" (").next().unwrap_or(s))
            .filter(|s| {
                !["between", "as in", "after"]
                    .iter()
                    .any(|p| s.starts_with(p))
            })
            .collect();
        kinds.sort_unstable();
        kinds.dedup();
        format!("{} (from {})", self.layout.name, kinds.join(", "))
    }
}

/// The structs DWARF is asked for, and the fields each gives: (capture name, member path).
const DWARF_FIELDS: &[(&str, &str)] = &[
    ("g.vmstate", "global_State.vmstate"),
    ("g.mainthref", "global_State.mainthref"),
    ("g.cur_L", "global_State.cur_L"),
    ("g.jit_base", "global_State.jit_base"),
    ("g.ctype_state", "global_State.ctype_state"),
    ("L.glref", "lua_State.glref"),
    ("L.status", "lua_State.status"),
    ("L.base", "lua_State.base"),
    ("L.top", "lua_State.top"),
    ("L.maxstack", "lua_State.maxstack"),
    ("L.stack", "lua_State.stack"),
    ("L.cframe", "lua_State.cframe"),
    ("L.size", "lua_State"),
    ("fn.ffid", "GCfuncC.ffid"),
    ("fn.pc", "GCfuncL.pc"),
    ("fn.f", "GCfuncC.f"),
    ("fn.env", "GCfuncC.env"),
    ("lfn.uv", "GCfuncL.uvptr"),
    ("cfn.uv", "GCfuncC.upvalue"),
    ("pt.size", "GCproto"),
    ("pt.numparams", "GCproto.numparams"),
    ("pt.framesize", "GCproto.framesize"),
    ("pt.sizebc", "GCproto.sizebc"),
    ("pt.k", "GCproto.k"),
    ("pt.sizept", "GCproto.sizept"),
    ("pt.flags", "GCproto.flags"),
    ("pt.chunkname", "GCproto.chunkname"),
    ("pt.firstline", "GCproto.firstline"),
    ("pt.numline", "GCproto.numline"),
    ("pt.lineinfo", "GCproto.lineinfo"),
    ("pt.uvinfo", "GCproto.uvinfo"),
    ("pt.varinfo", "GCproto.varinfo"),
    ("str.len", "GCstr.len"),
    ("str.data", "GCstr"),
    ("tr.size", "GCtrace"),
    ("tr.nsnap", "GCtrace.nsnap"),
    ("tr.nins", "GCtrace.nins"),
    ("tr.ir", "GCtrace.ir"),
    ("tr.nk", "GCtrace.nk"),
    ("tr.snap", "GCtrace.snap"),
    ("tr.snapmap", "GCtrace.snapmap"),
    ("tr.nsnapmap", "GCtrace.nsnapmap"),
    ("tr.szmcode", "GCtrace.szmcode"),
    ("tr.mcode", "GCtrace.mcode"),
    ("tr.traceno", "GCtrace.traceno"),
    ("tab.size", "GCtab"),
    ("tab.colo", "GCtab.colo"),
    ("tab.array", "GCtab.array"),
    ("tab.meta", "GCtab.metatable"),
    ("tab.node", "GCtab.node"),
    ("tab.asize", "GCtab.asize"),
    ("tab.hmask", "GCtab.hmask"),
    ("node.size", "Node"),
    ("uv.size", "GCupval"),
    ("uv.closed", "GCupval.closed"),
    ("uv.tv", "GCupval.tv"),
    ("ud.size", "GCudata"),
    ("ud.env", "GCudata.env"),
    ("ud.len", "GCudata.len"),
    ("ud.meta", "GCudata.metatable"),
    ("cd.size", "GCcdata"),
    ("cd.ctypeid", "GCcdata.ctypeid"),
    ("ctype.size", "CType"),
];

/// Reads what a binary's DWARF (its own, else its separate debug file's) says.
fn dwarf_facts(data: &[u8], debug: Option<&[u8]>, f: &mut Facts) {
    let names = [
        "global_State",
        "lua_State",
        "GG_State",
        "jit_State",
        "GCfuncC",
        "GCfuncL",
        "GCproto",
        "GCstr",
        "GCtrace",
        "GCtab",
        "Node",
        "GCupval",
        "GCudata",
        "GCcdata",
        "CType",
        "CTState",
        "CCallback",
    ];
    let structs = [Some(data), debug]
        .into_iter()
        .flatten()
        .filter_map(|d| Structs::read(d, &names).ok())
        .find(|s| s.offset("global_State.vmstate").is_some());
    let Some(s) = structs else {
        return;
    };
    const SRC: &str = "DWARF";
    for &(name, path) in DWARF_FIELDS {
        let v = match path.contains('.') {
            true => s.offset(path),
            false => s.size(path),
        };
        if let Some(v) = v {
            f.set(name, v as i64, SRC);
        }
    }
    if let (Some(g), Some(disp)) = (s.offset("GG_State.g"), s.offset("GG_State.dispatch")) {
        f.set("g2disp", disp as i64 - g as i64, SRC);
    }
    if let (Some(g), Some(j), Some(t)) = (
        s.offset("GG_State.g"),
        s.offset("GG_State.J"),
        s.offset("jit_State.trace"),
    ) {
        f.set("J.trace", (j + t) as i64 - g as i64, SRC);
    }
    if let (Some(cb), Some(stack)) = (s.offset("CTState.cb"), s.offset("CCallback.stack")) {
        f.set("cts.cb_stack", (cb + stack) as i64, SRC);
    }
    if let Some(hash) = s.offset("GCstr.sid").or_else(|| s.offset("GCstr.hash")) {
        f.set("str.hash", hash as i64, SRC);
    }
    if let Some(ptr) = s.size("GCfuncL.pc") {
        f.set("gc64", i64::from(ptr == 8), SRC);
    }
}

/// Learns the layout of the LuaJIT build in ELF `data`, whose interpreter is `vm`;
/// `debug` is its separate debug file, when there is one.
pub fn learn(data: &[u8], vm: &LuaJitVm, debug: Option<&[u8]>) -> Result<Learned, String> {
    let code = Code::new(data)?;
    let mut f = Facts::default();
    dwarf_facts(data, debug, &mut f);
    let ins: Vec<Instruction> = crate::x86::decode(&code, vm.start, vm.end);
    f.set(
        "cf.size",
        i64::from(vm.cframe_size),
        "the VM's unwind entry",
    );
    super::vm_code::facts(&ins, &mut f);
    if let (Some(fn_pc), Some(glref)) = (f.get("fn.pc"), f.get("L.glref")) {
        super::capi::facts(&code, fn_pc, glref, &mut f);
    }
    let gc64 =
        match f.get("gc64") {
            Some(g) => g != 0,
            None => return Err(
                "its interpreter's code shows no entry from C (no `mov r14, [rbp+…]; add r14, …`)"
                    .into(),
            ),
        };
    Ok(assemble(&f, gc64, builtins(data)))
}

/// Which fork's built-in functions the binary has: OpenResty's adds `thread.exdata`.
fn builtins(data: &[u8]) -> Builtins {
    match memchr::memmem::find(data, b"exdata2").is_some() {
        true => Builtins::OpenResty,
        false => Builtins::Upstream,
    }
}

/// The fields of one struct, by name prefix, and the field that is its size (the end).
const STRUCTS: &[(&str, Option<&str>)] = &[
    ("g.", None),
    ("L.", Some("L.size")),
    ("cf.", Some("cf.size")),
    ("fn.", None),
    ("pt.", Some("pt.size")),
    ("str.", Some("str.data")),
    ("tr.", Some("tr.size")),
    ("tab.", Some("tab.size")),
    ("uv.", Some("uv.size")),
    ("ud.", Some("ud.size")),
    ("cd.", Some("cd.size")),
];

/// Fields no build changes that nothing in a binary reads in a way lrec can find: taken
/// from the known layout of the same reference size.
const FIXED: &[&str] = &[
    "cf.L",
    "cf.pc",
    "cf.prev",
    "cf.nres",
    "lfn.uv",
    "cfn.uv",
    "fn.env",
    "tr.size",
    "tr.nsnap",
    "tr.nins",
    "tr.ir",
    "tr.nk",
    "tr.snap",
    "tr.snapmap",
    "tr.nsnapmap",
    "tr.szmcode",
    "tr.traceno",
    "tab.size",
    "tab.colo",
    "tab.array",
    "tab.meta",
    "tab.asize",
    "uv.size",
    "uv.closed",
    "uv.tv",
    "ud.size",
    "ud.env",
    "ud.len",
    "ud.meta",
    "cd.size",
    "cd.ctypeid",
    "ctype.size",
    "cts.cb_stack",
];

/// Builds the layout from the facts, the upstream layout of the same reference size as
/// the reference ([`Assembly`]).
fn assemble(f: &Facts, gc64: bool, builtins: Builtins) -> Learned {
    let reference = if gc64 { UPSTREAM_GC64 } else { UPSTREAM_GC32 };
    let table: Vec<(String, u32)> = reference.named();
    let assembly = Assembly {
        reference: &table,
        reference_name: if gc64 {
            "upstream GC64 builds"
        } else {
            "upstream GC32 builds"
        },
        structs: STRUCTS,
        fixed: FIXED,
        embedded: &[],
    };
    let done = assembly.run(f, Offsets::NAMES);
    let offsets = Offsets::from_named(&done.named);
    let known = KNOWN
        .iter()
        .find(|(_, o, b)| *b == builtins && agrees(&offsets, o));
    let name = match known {
        Some((n, ..)) => n.to_string(),
        None => format!("learned {}", if gc64 { "GC64" } else { "GC32" }),
    };
    Learned {
        missing: offsets.missing_for_walk(),
        layout: Layout {
            name,
            offsets,
            builtins,
        },
        sources: done.sources,
        conflicts: f.conflicts.clone(),
    }
}

/// Whether every field a known layout states is the same in `o` (a known build).
fn agrees(o: &Offsets, known: &Offsets) -> bool {
    let known = known.named();
    !known.is_empty()
        && known
            .iter()
            .all(|(k, v)| o.named().iter().any(|(k2, v2)| k2 == k && v2 == v))
}
