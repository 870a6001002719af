//! Learning a PUC Lua build's layout from its binary: DWARF where the build kept it (its
//! own, or its `-dbg` package's), else the C API's machine code ([`super::capi`]); the
//! rest is placed from its release's layout ([`crate::lua::evidence::Assembly`]). A fork
//! that changed a structure (skynet's strings) shows it in the code that reads it. The
//! result still has to be proved on the live process before it is used.

use super::releases::{release, rules_of, RELEASES};
use super::{Layout, Offsets};
use crate::dwarf::Structs;
use crate::elf::Code;
use crate::lua::evidence::{Assembly, Embedded, Facts};

/// A layout learned from a binary, and how.
#[derive(Debug, Clone)]
pub struct Learned {
    pub layout: Layout,
    /// Each field's source: the evidence that gave it, the fields it lies between, or the
    /// release it was taken from.
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
        let from = match kinds.is_empty() {
            true => "its release's layout: nothing in the binary reads its structures".into(),
            false => kinds.join(", "),
        };
        format!("{} (from {from})", self.layout.name)
    }
}

/// What DWARF gives: (capture name, member path; a bare name is a struct's size).
const DWARF_FIELDS: &[(&str, &str)] = &[
    ("L.status", "lua_State.status"),
    ("L.top", "lua_State.top"),
    ("L.G", "lua_State.l_G"),
    ("L.ci", "lua_State.ci"),
    ("L.stack", "lua_State.stack"),
    ("L.openupval", "lua_State.openupval"),
    ("L.errorJmp", "lua_State.errorJmp"),
    ("L.base_ci", "lua_State.base_ci"),
    ("L.savedpc", "lua_State.savedpc"),
    ("L.gt", "lua_State.l_gt"),
    ("L.size", "lua_State"),
    ("L.extra", "LX.l"),
    ("g.frealloc", "global_State.frealloc"),
    ("g.strt", "global_State.strt"),
    ("g.registry", "global_State.l_registry"),
    ("g.finobj", "global_State.finobj"),
    ("g.tobefnz", "global_State.tobefnz"),
    ("g.fixedgc", "global_State.fixedgc"),
    ("g.tmudata", "global_State.tmudata"),
    ("g.totalbytes", "global_State.totalbytes"),
    ("g.GCdebt", "global_State.GCdebt"),
    ("g.size", "global_State"),
    ("ci.func", "CallInfo.func"),
    ("ci.previous", "CallInfo.previous"),
    ("ci.callstatus", "CallInfo.callstatus"),
    ("ci.tailcalls", "CallInfo.tailcalls"),
    ("ci.size", "CallInfo"),
    ("cl.isC", "CClosure.isC"),
    ("cl.nupvalues", "CClosure.nupvalues"),
    ("cl.env", "CClosure.env"),
    ("lcl.p", "LClosure.p"),
    ("lcl.upvals", "LClosure.upvals"),
    ("lcl.size0", "LClosure.upvals"),
    ("ccl.f", "CClosure.f"),
    ("ccl.upvalue", "CClosure.upvalue"),
    ("ccl.size0", "CClosure.upvalue"),
    ("t.flags", "Table.flags"),
    ("t.lsizenode", "Table.lsizenode"),
    ("t.array", "Table.array"),
    ("t.node", "Table.node"),
    ("t.lastfree", "Table.lastfree"),
    ("t.metatable", "Table.metatable"),
    ("t.size", "Table"),
    ("node.size", "Node"),
    ("uv.size", "UpVal"),
    ("ud.len", "Udata.len"),
    ("ud.metatable", "Udata.metatable"),
    ("p.k", "Proto.k"),
    ("p.sizek", "Proto.sizek"),
    ("p.code", "Proto.code"),
    ("p.sizecode", "Proto.sizecode"),
    ("p.p", "Proto.p"),
    ("p.sizep", "Proto.sizep"),
    ("p.upvalues", "Proto.upvalues"),
    ("p.sizeupvalues", "Proto.sizeupvalues"),
    ("p.lineinfo", "Proto.lineinfo"),
    ("p.sizelineinfo", "Proto.sizelineinfo"),
    ("p.abslineinfo", "Proto.abslineinfo"),
    ("p.sizeabslineinfo", "Proto.sizeabslineinfo"),
    ("p.locvars", "Proto.locvars"),
    ("p.sizelocvars", "Proto.sizelocvars"),
    ("p.source", "Proto.source"),
    ("p.linedefined", "Proto.linedefined"),
    ("p.lastlinedefined", "Proto.lastlinedefined"),
    ("p.size", "Proto"),
    ("s.shrlen", "TString.shrlen"),
    ("s.hnext", "TString.u.hnext"),
];

/// Reads what DWARF says, from the binary or its debug file (with its dwz supplement).
fn dwarf_facts(files: &[(&[u8], Option<&[u8]>)], minor: u32, f: &mut Facts) {
    let names = [
        "lua_State",
        "LX",
        "global_State",
        "CallInfo",
        "LClosure",
        "CClosure",
        "Table",
        "Node",
        "UpVal",
        "Udata",
        "Proto",
        "TString",
    ];
    let found = files
        .iter()
        .filter_map(|(d, sup)| Structs::read_with_sup(d, *sup, &names).ok())
        .find(|s| s.offset("lua_State.ci").is_some());
    let Some(s) = found else {
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
    let pick = |paths: &[&str]| paths.iter().find_map(|p| s.offset(p));
    if let Some(v) = pick(&["CallInfo.u.l.savedpc", "CallInfo.savedpc"]) {
        f.set("ci.savedpc", v as i64, SRC);
    }
    // 5.1–5.3 count the stack's slots; 5.4 on point to its end.
    let stacksize = match minor {
        4.. => "lua_State.stack_last",
        _ => "lua_State.stacksize",
    };
    if let Some(v) = s.offset(stacksize) {
        f.set("L.stacksize", v as i64, SRC);
    }
    if let Some(v) = pick(&["lua_State.nci", "lua_State.size_ci"]) {
        f.set("L.nci", v as i64, SRC);
    }
    if let Some(v) = pick(&["global_State.allgc", "global_State.rootgc"]) {
        f.set("g.allgc", v as i64, SRC);
    }
    if let Some(v) = pick(&["Table.alimit", "Table.asize", "Table.sizearray"]) {
        f.set("t.sizearray", v as i64, SRC);
    }
    // The text: after the header (5.1–5.4), or `contents` (5.5, and forks).
    match s.offset("TString.contents") {
        Some(v) => f.set("s.data", v as i64, SRC),
        None if minor <= 4 => {
            if let Some(v) = s.size("TString") {
                f.set("s.data", v as i64, SRC);
            }
        }
        None => {}
    }
    match minor {
        5.. => {
            if let (Some(m), Some(l)) = (s.offset("global_State.mainth"), s.offset("LX.l")) {
                f.set("g.mainthread", (m + l) as i64, SRC);
            }
        }
        _ => {
            if let Some(m) = s.offset("global_State.mainthread") {
                f.set("g.mainthread", m as i64, SRC);
            }
        }
    }
    if let Some(len) = pick(&["TString.u.lnglen", "TString.len", "TString.tsv.len"]) {
        f.set("s.len", len as i64, SRC);
    }
}

/// The fields of one struct, by name prefix, and the field that is its size (its end).
const STRUCTS: &[(&str, Option<&str>)] = &[
    ("L.", Some("L.size")),
    ("g.", Some("g.size")),
    ("ci.", Some("ci.size")),
    ("t.", Some("t.size")),
    ("uv.", Some("uv.size")),
    ("p.", Some("p.size")),
    ("s.", Some("s.data")),
];

/// The state's first CallInfo, held in it since 5.2 (5.1 points to an array).
const EMBEDDED: &[Embedded] = &[Embedded {
    field: "L.base_ci",
    size: "ci.size",
    end: "the end of L.base_ci",
}];

/// Widths and rules no build changes.
const FIXED: &[&str] = &["ci.callstatus_size", "p.lineinfo_size", "p.upvaldesc_size"];

/// Learns the layout of PUC Lua 5.`minor`.`patch` in ELF `data`; `debug` is its separate
/// debug file with its dwz supplement, when there is one.
pub fn learn(
    data: &[u8],
    minor: u32,
    patch: u32,
    debug: Option<(&[u8], Option<&[u8]>)>,
) -> Result<Learned, String> {
    let code = Code::new(data)?;
    let rules =
        rules_of(minor, patch).ok_or_else(|| format!("Lua 5.{minor} is not one lrec reads"))?;
    let mut f = Facts::default();
    let mut files: Vec<(&[u8], Option<&[u8]>)> = vec![(data, None)];
    files.extend(debug);
    dwarf_facts(&files, minor, &mut f);
    super::capi::facts(&code, minor, &mut f);
    // The reference: the release itself, else the newest of its minor.
    let reference = release(minor, patch)
        .or_else(|| RELEASES.iter().rev().find(|r| r.minor == minor))
        .expect("rules_of found the minor");
    let table = reference.offsets.named();
    let reference_name = reference.name();
    let assembly = Assembly {
        reference: &table,
        reference_name: &reference_name,
        structs: STRUCTS,
        fixed: FIXED,
        embedded: match minor {
            1 => &[],
            _ => EMBEDDED,
        },
    };
    let done = assembly.run(&f, Offsets::NAMES);
    let offsets = Offsets::from_named(&done.named);
    let name = match offsets == reference.offsets {
        true => reference_name.clone(),
        false => format!("learned 5.{minor}.{patch}"),
    };
    Ok(Learned {
        missing: offsets.missing_for_walk(rules.version),
        layout: Layout {
            name,
            rules,
            offsets,
        },
        sources: done.sources,
        conflicts: f.conflicts,
    })
}
