//! The DWARF reader against what gcc compiled, Debian's debug files and tarantool.

use super::*;
use gimli::constants as dw;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Structs with every shape the reader must handle. `Frame` has a typedef, anonymous
/// union and struct members, a named nested struct (`u.l.savedpc`, as in Lua's
/// CallInfo), arrays, bitfields and a qualified member; `Anon` is a typedef of an
/// untagged struct; `Cell` a typedef'd union.
const TYPES_H: &str = r#"
typedef struct Frame Frame;
struct Frame {
  Frame *previous;
  union { long l; double d; };
  struct { struct { int a; void *savedpc; } l; struct { int k; short nyield; } c; } u;
  int slots[5];
  char c0, c1;
  unsigned flags : 3, more : 7;
  short callstatus;
  struct { int x; char y[3]; };
  const volatile struct { char inner[7]; } qualified;
  long long matrix[2][3];
  char big[256];
  int none[0];
};
typedef union Cell { long n; char bytes[12]; } Cell;
typedef struct { int a; char b; Cell cells[2]; char tail[]; } Anon;
struct early_s { int x; Cell cell; double y; };
"#;

/// Defined only in the last unit, so that the typedef `Later` of the unit before
/// (which sees only a declaration) must be resolved by tag in a later unit.
const LATER_H: &str = r#"
struct later_s { char tag; Frame frames[2]; struct later_s *next; long long total; };
"#;

/// The first unit: defines `struct early_s`, whose typedef `Early` comes in a later
/// unit that sees only a declaration.
const EARLY_C: &str = "#include \"types.h\"\nstruct early_s early_var;\n";

/// The typedefs of the two incomplete structs.
const DECL_C: &str = r#"
typedef struct later_s Later;
typedef struct early_s Early;
Later *later_ptr;
Early *early_ptr;
"#;

/// Prints the truth as `offset PATH N` and `size PATH N` lines, PATH as
/// `Structs::offset` takes it. A bitfield's offset is the byte its lowest bit lands in.
const MAIN_C: &str = r#"
#include <stdio.h>
#include <stddef.h>
#include <string.h>
#include "types.h"
#include "later.h"
Frame frame; Cell cell; Anon anon; struct later_s later;
#define OFF(path, T, m) printf("offset %s %zu\n", path, offsetof(T, m))
#define SIZE(path, T, m) printf("size %s %zu\n", path, sizeof(((T *)0)->m))
#define SIZEOF(path, T) printf("size %s %zu\n", path, sizeof(T))
#define BIT(path, T, m) do { T v; memset(&v, 0, sizeof v); v.m = 1; \
size_t i = 0; while (!((unsigned char *)&v)[i]) i++; \
printf("offset %s %zu\n", path, i); } while (0)
int main(void) {
  SIZEOF("Frame", Frame);
  OFF("Frame.previous", Frame, previous);
  OFF("Frame.l", Frame, l); SIZE("Frame.l", Frame, l);
  OFF("Frame.d", Frame, d);
  OFF("Frame.u", Frame, u); SIZE("Frame.u", Frame, u);
  OFF("Frame.u.l", Frame, u.l); SIZE("Frame.u.l", Frame, u.l);
  OFF("Frame.u.l.a", Frame, u.l.a);
  OFF("Frame.u.l.savedpc", Frame, u.l.savedpc); SIZE("Frame.u.l.savedpc", Frame, u.l.savedpc);
  OFF("Frame.u.c.nyield", Frame, u.c.nyield); SIZE("Frame.u.c.nyield", Frame, u.c.nyield);
  OFF("Frame.slots", Frame, slots); SIZE("Frame.slots", Frame, slots);
  OFF("Frame.c1", Frame, c1);
  BIT("Frame.flags", Frame, flags);
  BIT("Frame.more", Frame, more);
  OFF("Frame.callstatus", Frame, callstatus);
  OFF("Frame.x", Frame, x);
  OFF("Frame.y", Frame, y); SIZE("Frame.y", Frame, y);
  OFF("Frame.qualified.inner", Frame, qualified.inner);
  SIZE("Frame.qualified", Frame, qualified);
  OFF("Frame.matrix", Frame, matrix); SIZE("Frame.matrix", Frame, matrix);
  OFF("Frame.big", Frame, big); SIZE("Frame.big", Frame, big);
  OFF("Frame.none", Frame, none); SIZE("Frame.none", Frame, none);
  SIZEOF("Cell", Cell); OFF("Cell.bytes", Cell, bytes); SIZE("Cell.bytes", Cell, bytes);
  SIZEOF("Anon", Anon); OFF("Anon.b", Anon, b); OFF("Anon.cells", Anon, cells);
  SIZE("Anon.cells", Anon, cells); OFF("Anon.cells.bytes", Anon, cells[0].bytes);
  OFF("Anon.tail", Anon, tail);
  SIZEOF("Later", struct later_s);
  OFF("Later.frames", struct later_s, frames); SIZE("Later.frames", struct later_s, frames);
  OFF("Later.frames.u.l.savedpc", struct later_s, frames[0].u.l.savedpc);
  OFF("Later.total", struct later_s, total);
  SIZEOF("Early", struct early_s); OFF("Early.cell.bytes", struct early_s, cell.bytes);
  OFF("Early.y", struct early_s, y);
  return 0;
}
"#;

const NAMES: &[&str] = &["Frame", "Cell", "Anon", "Later", "Early", "Missing"];

/// Whether gcc is installed; if not, says so loudly.
fn have_gcc() -> bool {
    let ok = Command::new("gcc").arg("--version").output().is_ok();
    if !ok {
        eprintln!("\n*** NOTE: gcc not found: the DWARF layout test did not run ***\n");
    }
    ok
}

/// Compiles the test program with `flags` in `dir`; returns the executable.
fn compile(dir: &Path, flags: &[&str]) -> PathBuf {
    let sources = [
        ("types.h", TYPES_H),
        ("later.h", LATER_H),
        ("early.c", EARLY_C),
        ("decl.c", DECL_C),
        ("main.c", MAIN_C),
    ];
    for (name, text) in sources {
        std::fs::write(dir.join(name), text).unwrap();
    }
    let exe = dir.join("layouts");
    let status = Command::new("gcc")
        .current_dir(dir)
        .args(flags)
        .args(["early.c", "decl.c", "main.c", "-o"])
        .arg(&exe)
        .status()
        .unwrap();
    assert!(status.success(), "gcc {flags:?} failed");
    exe
}

/// Every offset and size the compiled program prints matches what the DWARF says, for
/// DWARF 5, DWARF 4 with compressed sections, DWARF 2 (member offsets as
/// `DW_OP_plus_uconst`, bitfields as `DW_AT_bit_offset`), optimized code, and structs
/// in type units (`DW_FORM_ref_sig8`).
#[test]
fn layouts_match_what_gcc_compiled() {
    if !have_gcc() {
        return;
    }
    let variants: &[&[&str]] = &[
        &["-g"],
        &["-gdwarf-4", "-gz"],
        &["-gdwarf-2", "-gstrict-dwarf"],
        &["-g", "-O2"],
        &["-gdwarf-4", "-fdebug-types-section"],
    ];
    for flags in variants {
        let dir = tempfile::tempdir().unwrap();
        let exe = compile(dir.path(), flags);
        let output = Command::new(&exe).output().unwrap();
        let truth = String::from_utf8(output.stdout).unwrap();
        let structs = Structs::read(&std::fs::read(&exe).unwrap(), NAMES).unwrap();
        let mut checked = 0;
        for line in truth.lines() {
            let [what, path, value] = line.split(' ').collect::<Vec<_>>()[..] else {
                panic!("bad line {line:?}");
            };
            let expected = Some(value.parse::<u64>().unwrap());
            let got = match what {
                "offset" => structs.offset(path),
                _ => structs.size(path),
            };
            assert_eq!(got, expected, "{what} of {path} with gcc {flags:?}");
            checked += 1;
        }
        assert!(checked > 40, "the program printed only {checked} lines");
        assert_eq!(
            structs.size("Frame.flags"),
            None,
            "a bitfield has no byte size"
        );
        let tail = structs.size("Anon.tail");
        assert_eq!(tail, None, "a flexible array has no size");
        assert_eq!(structs.offset("Frame.nope"), None);
        assert_eq!(structs.offset("Frame.u.nope"), None);
        assert_eq!(structs.offset("Frame"), Some(0));
        assert!(!structs.contains("Missing"), "Missing is defined nowhere");
    }
}

/// A file without DWARF gives an empty set; bytes that are not ELF give an error.
#[test]
fn no_debug_info_is_empty_and_garbage_is_an_error() {
    if !have_gcc() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), &["-g0"]);
    let structs = Structs::read(&std::fs::read(&exe).unwrap(), NAMES).unwrap();
    assert!(structs.is_empty());
    assert!(Structs::read(b"not an ELF file at all", NAMES).is_err());
}

/// Corrupting `.debug_info` byte by byte never panics: each read is Ok or Err.
#[test]
fn corrupt_debug_info_does_not_panic() {
    if !have_gcc() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), &["-g"]);
    let data = std::fs::read(&exe).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let info = file.section_by_name(".debug_info").unwrap();
    let (start, size) = info.file_range().unwrap();
    for i in (0..size as usize).step_by(3) {
        for byte in [0x00, 0xff, 0x7f] {
            let mut bad = data.clone();
            bad[start as usize + i] = byte;
            let _ = Structs::read(&bad, NAMES);
        }
    }
}

/// A struct made to contain itself twice over (by patching the DWARF of the test
/// program: the types of `Frame.previous` and `Frame.u` become `Frame`) is not
/// expanded inside itself, so the read ends at once instead of taking 2^MAX_DEPTH
/// steps; the members themselves are still there.
#[test]
fn self_containing_structs_are_bounded() {
    if !have_gcc() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut data = std::fs::read(compile(dir.path(), &["-g"])).unwrap();
    let (frame, patches) = frame_type_refs(&data, &["previous", "u"]);
    assert_eq!(
        patches.len(),
        2,
        "gcc wrote the member types as DW_FORM_ref4"
    );
    for at in patches {
        data[at..at + 4].copy_from_slice(&frame.to_le_bytes());
    }
    let structs = Structs::read(&data, &["Frame"]).unwrap();
    assert_eq!(structs.offset("Frame.previous"), Some(0));
    assert_eq!(structs.size("Frame.u"), structs.size("Frame"));
    assert!(
        structs.offset("Frame.u.x").is_none(),
        "Frame not expanded in Frame"
    );
}

/// The unit offset of the complete `struct Frame` entry, and the file offsets of the
/// `DW_FORM_ref4` type references of its members named in `members`.
fn frame_type_refs(data: &[u8], members: &[&str]) -> (u32, Vec<usize>) {
    let file = object::File::parse(data).unwrap();
    let info = file.section_by_name(".debug_info").unwrap();
    let info_start = info.file_range().unwrap().0 as usize;
    // All sections, as gimli reads a whole unit (its line program too).
    let all = |id: SectionId| -> Result<std::borrow::Cow<[u8]>, String> {
        Ok(file
            .section_by_name(id.name())
            .map_or(std::borrow::Cow::Borrowed(&[][..]), |s| {
                s.uncompressed_data().unwrap()
            }))
    };
    let sections = gimli::DwarfSections::load(all).unwrap();
    let dwarf = sections.borrow(|data| EndianSlice::new(data, RunTimeEndian::Little));
    let mut units = dwarf.units();
    while let Some(header) = units.next().unwrap() {
        let unit = dwarf.unit(header).unwrap();
        let mut raw = unit.entries_raw(None).unwrap();
        // `inside`: whether the entries read are Frame's children.
        let (mut frame, mut inside, mut patches) = (0, false, Vec::new());
        while !raw.is_empty() {
            let (depth, offset) = (raw.next_depth(), raw.next_offset());
            let Some(abbrev) = raw.read_abbreviation().unwrap() else {
                continue;
            };
            let (mut name, mut type_at) = (None, None);
            for spec in abbrev.attributes() {
                let at = raw.next_offset().0;
                let attr = raw.read_attribute(*spec).unwrap();
                match attr.name() {
                    dw::DW_AT_name => name = dwarf.attr_string(&unit, attr.value()).ok(),
                    dw::DW_AT_type if spec.form() == dw::DW_FORM_ref4 => type_at = Some(at),
                    _ => {}
                }
            }
            let name = name.map(|n| n.slice());
            if depth == 1 {
                let is_frame =
                    abbrev.tag() == dw::DW_TAG_structure_type && name == Some(b"Frame".as_slice());
                inside = is_frame && abbrev.has_children();
                if inside {
                    frame = offset.0 as u32;
                }
            } else if inside
                && depth == 2
                && abbrev.tag() == dw::DW_TAG_member
                && members.iter().any(|m| Some(m.as_bytes()) == name)
            {
                let start = info_start + unit.header.offset().0;
                patches.extend(type_at.map(|at| start + at));
            }
        }
        if patches.len() == members.len() {
            return (frame, patches);
        }
    }
    panic!("no struct Frame with members {members:?}");
}

/// A Debian library's separate debug file (by build-id) and the dwz supplementary file
/// it links to, if its `-dbg` package is installed (`make setup` installs them); None
/// with a loud note otherwise.
fn debian_debug_file(library: &str) -> Option<(Vec<u8>, Option<Vec<u8>>)> {
    let path = Path::new("/usr/lib/x86_64-linux-gnu").join(library);
    let debug_path = std::fs::read(&path)
        .ok()
        .and_then(|data| crate::elf::build_id(&data))
        .and_then(|id| crate::debug_files::build_id_path(Path::new("/usr/lib/debug"), &id));
    let Some(debug) = debug_path.as_ref().and_then(|p| std::fs::read(p).ok()) else {
        let note = "or its debug file is missing (make setup): not checked";
        eprintln!("\n*** NOTE: {library} {note} ***\n");
        return None;
    };
    let sup = alt_link(&debug).map(|(path, id)| {
        let dir = debug_path.as_ref().and_then(|p| p.parent()).unwrap();
        let sup = std::fs::read(dir.join(&path)).unwrap();
        assert_eq!(
            crate::elf::build_id(&sup),
            Some(id),
            "{path:?} is another build"
        );
        sup
    });
    Some((debug, sup))
}

fn check(structs: &Structs, expected: &[(&str, u64)], what: &str) {
    for &(path, value) in expected {
        let got = match path.strip_prefix("sizeof ") {
            Some(path) => structs.size(path),
            None => structs.offset(path),
        };
        assert_eq!(got, Some(value), "{path} in {what}");
    }
}

const PUC_LUA: &[&str] = &["lua_State", "global_State", "CallInfo", "Proto", "TString"];

/// The offsets lrec reads from PUC Lua 5.1, 5.3 and 5.4 as Debian builds them, read
/// from their debug files (the values are those of the releases' known layouts).
#[test]
fn debian_lua_layouts() {
    let lua54: &[(&str, u64)] = &[
        ("lua_State.l_G", 24),
        ("lua_State.ci", 32),
        ("CallInfo.u.l.savedpc", 32),
        ("CallInfo.callstatus", 62),
        ("CallInfo.previous", 16),
        ("Proto.source", 112),
        ("Proto.linedefined", 44),
        ("Proto.code", 64),
        ("TString.contents", 24),
        ("sizeof CallInfo", 64),
    ];
    let lua53: &[(&str, u64)] = &[
        ("CallInfo.u.l.savedpc", 40),
        ("CallInfo.callstatus", 66),
        ("Proto.source", 104),
        ("Proto.code", 56),
    ];
    let lua51: &[(&str, u64)] = &[
        ("lua_State.l_G", 32),
        ("lua_State.ci", 40),
        ("lua_State.savedpc", 48),
        ("CallInfo.savedpc", 24),
        ("sizeof CallInfo", 40),
        ("Proto.source", 64),
        ("Proto.linedefined", 96),
        ("Proto.code", 24),
        ("Proto.lineinfo", 40),
    ];
    for (library, expected) in [
        ("liblua5.4.so.0", lua54),
        ("liblua5.3.so.0", lua53),
        ("liblua5.1.so.0", lua51),
    ] {
        let Some((debug, sup)) = debian_debug_file(library) else {
            continue;
        };
        Structs::read(&debug, PUC_LUA).expect("without its supplementary file");
        let structs = Structs::read_with_sup(&debug, sup.as_deref(), PUC_LUA).unwrap();
        for name in PUC_LUA {
            assert!(structs.contains(name), "{name} in {library}");
        }
        check(&structs, expected, library);
    }
}

/// LuaJIT's structs in tarantool (Debian package `tarantool`, DWARF in the binary
/// itself, 8 MB of it), if installed.
#[test]
fn tarantool_luajit_layouts() {
    let Ok(data) = std::fs::read("/usr/bin/tarantool") else {
        eprintln!("\n*** NOTE: /usr/bin/tarantool is not installed: not checked ***\n");
        return;
    };
    let names = [
        "lua_State",
        "global_State",
        "GG_State",
        "GCproto",
        "GCstr",
        "GCfunc",
        "GCtrace",
        "jit_State",
    ];
    let start = std::time::Instant::now();
    let structs = Structs::read(&data, &names).unwrap();
    eprintln!("tarantool: {:?}", start.elapsed());
    for name in names {
        assert!(structs.contains(name), "{name} in tarantool");
    }
    check(
        &structs,
        &[
            ("GCproto.chunkname", 40),
            ("GCproto.firstline", 44),
            ("sizeof GCproto", 64),
            ("global_State.vmstate", 120),
            ("global_State.cur_L", 280),
            ("lua_State.glref", 8),
            ("lua_State.cframe", 48),
            ("GCstr.len", 12),
            ("sizeof GCstr", 16),
        ],
        "tarantool",
    );
    let dispatch = structs.offset("GG_State.dispatch").unwrap();
    assert_eq!(dispatch - structs.offset("GG_State.g").unwrap(), 3144);
}
