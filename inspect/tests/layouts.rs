//! Layouts learned from machine code against the truth: DWARF of the same sources (the
//! forks built with -g and without), the releases' layouts for stock builds, and Debian's
//! debug files. The fixtures come from `make fixtures`, which `make test` runs first; a
//! missing one is said loudly and skipped.

use std::path::PathBuf;

use lrec_inspect::elf::unwind_record;
use lrec_inspect::lua::detect::luajit_vm;
use lrec_inspect::lua::luajit::{self, releases};
use lrec_inspect::lua::named::ABSENT;
use lrec_inspect::lua::puc;

fn read(path: PathBuf) -> Option<Vec<u8>> {
    let data = std::fs::read(&path).ok();
    if data.is_none() {
        eprintln!(
            "{} is missing (`make fixtures` builds it): NOT CHECKED",
            path.display()
        );
    }
    data
}

fn fixture(name: &str) -> Option<Vec<u8>> {
    read(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../fixtures/bin")
            .join(name),
    )
}

fn luajit_layout(data: &[u8]) -> luajit::learn::Learned {
    let vm = luajit_vm(&unwind_record("", data)).expect("a LuaJIT interpreter");
    luajit::learn::learn(data, &vm, None).expect("a layout")
}

/// The fields two layouts both state, by name, that differ.
fn differing(a: &[(String, u32)], b: &[(String, u32)]) -> Vec<String> {
    a.iter()
        .filter_map(|(k, v)| {
            let other = b.iter().find(|(k2, _)| k2 == k)?.1;
            (other != *v && other != ABSENT).then(|| format!("{k}: {v} vs {other}"))
        })
        .collect()
}

/// A stripped LuaJIT fork (no DWARF: the VM's code and the C API's) learns what the same
/// sources' DWARF says, field for field.
#[test]
fn luajit_code_agrees_with_dwarf_of_the_same_fork() {
    for (stripped, dwarf) in [
        ("luajit-fork-gc64-stripped", "luajit-fork-gc64"),
        ("luajit-fork-gc32-stripped", "luajit-fork-gc32"),
    ] {
        let (Some(s), Some(d)) = (fixture(stripped), fixture(dwarf)) else {
            continue;
        };
        let (code, truth) = (luajit_layout(&s), luajit_layout(&d));
        assert!(
            code.missing.is_empty(),
            "{stripped}: missing {:?}",
            code.missing
        );
        assert!(
            truth.sources.iter().any(|(_, s)| s == "DWARF"),
            "{dwarf} has DWARF"
        );
        let diff = differing(&code.layout.offsets.named(), &truth.layout.offsets.named());
        assert!(diff.is_empty(), "{stripped} vs {dwarf}: {diff:?}");
        assert!(
            code.conflicts.is_empty(),
            "{stripped}: {:?}",
            code.conflicts
        );
    }
}

/// Stock builds learn their release's layout, every field the release states.
#[test]
fn stock_luajit_learns_its_release() {
    for (name, release) in [
        ("luajit-gc64", releases::UPSTREAM_GC64),
        ("luajit-gc32", releases::UPSTREAM_GC32),
        ("lua-host", releases::UPSTREAM_GC64),
    ] {
        let Some(data) = fixture(name) else {
            continue;
        };
        let l = luajit_layout(&data);
        let mut named = l.layout.offsets.named();
        // Measured at run time (the main thread's distance to G), not learned.
        named.retain(|(k, _)| k != "L.size");
        let diff = differing(&named, &release.named());
        assert!(diff.is_empty(), "{name}: {diff:?}");
        assert!(l.missing.is_empty(), "{name}: {:?}", l.missing);
    }
}

fn puc_layout(data: &[u8], minor: u32, patch: u32) -> puc::learn::Learned {
    puc::learn::learn(data, minor, patch, None).expect("a layout")
}

/// Stripped PUC Lua forks (the C API's code only) learn every field the walker reads as
/// the same sources' DWARF gives it.
#[test]
fn puc_code_agrees_with_dwarf_of_the_same_fork() {
    for (stripped, dwarf, minor, patch) in [
        ("lua5.4-fork-stripped", "lua5.4-fork", 4, 9),
        ("lua5.5-fork-stripped", "lua5.5-fork", 5, 1),
    ] {
        let (Some(s), Some(d)) = (fixture(stripped), fixture(dwarf)) else {
            continue;
        };
        let (code, truth) = (puc_layout(&s, minor, patch), puc_layout(&d, minor, patch));
        assert!(
            code.missing.is_empty(),
            "{stripped}: missing {:?}",
            code.missing
        );
        let diff = differing(&code.layout.offsets.named(), &truth.layout.offsets.named());
        assert!(diff.is_empty(), "{stripped} vs {dwarf}: {diff:?}");
        // The fork moved what skynet's did: the text of a string 8 bytes later.
        assert_eq!(code.layout.offsets.s_data, 32, "{stripped}");
    }
}

/// Debian's stripped Lua builds, read by their code alone, agree with their `-dbg`
/// packages' DWARF.
#[test]
fn debian_lua_code_agrees_with_its_debug_file() {
    for (lib, minor) in [
        ("liblua5.1.so.0", 1),
        ("liblua5.3.so.0", 3),
        ("liblua5.4.so.0", 4),
    ] {
        let Some(data) = read(PathBuf::from("/usr/lib/x86_64-linux-gnu").join(lib)) else {
            continue;
        };
        let id = lrec_inspect::elf::build_id(&data).expect("a build-id");
        let hex = lrec_inspect::debug_files::build_id_hex(&id);
        let debug = PathBuf::from(format!(
            "/usr/lib/debug/.build-id/{}/{}.debug",
            &hex[..2],
            &hex[2..]
        ));
        let Some(debug) = read(debug) else {
            continue;
        };
        let sup = lrec_inspect::dwarf::alt_link(&debug).and_then(|(p, _)| std::fs::read(p).ok());
        let patch = match minor {
            1 => 5,
            3 => 6,
            _ => 4,
        };
        let code = puc_layout(&data, minor, patch);
        let truth = puc::learn::learn(&data, minor, patch, Some((&debug, sup.as_deref())))
            .expect("a layout");
        assert!(truth.sources.iter().any(|(_, s)| s == "DWARF"), "{lib}");
        let diff = differing(&code.layout.offsets.named(), &truth.layout.offsets.named());
        assert!(diff.is_empty(), "{lib}: {diff:?}");
    }
}

/// Where each VM frees its protos, found by its machine code as in a stripped build, is
/// where the fixtures' symbols say (lrec_inspect::lua::frees): the LuaJIT builds and
/// forks, and the PUC builds with symbols; the stripped twins give the same. The stripped
/// builds without a twin (no JIT, 2.1.0-beta3, a host) hold exactly one such function.
/// (texluajit's older free first tells the JIT, two calls: not found, its sites are
/// proved by reads.)
#[test]
fn proto_free_functions_found_by_their_code_are_the_named_ones() {
    use lrec_inspect::elf::function_symbols;
    use lrec_inspect::lua::frees::{luajit_free_by_code, puc_free_by_code};
    for name in ["luajit-nojit", "luajit-beta3", "lua-host"] {
        if let Some(data) = fixture(name) {
            luajit_free_by_code(&data).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
    for (name, stripped) in [
        ("luajit-gc64", None),
        ("luajit-gc32", None),
        ("luajit-gc64-static", None),
        ("luajit-fork-gc64", Some("luajit-fork-gc64-stripped")),
        ("luajit-fork-gc32", Some("luajit-fork-gc32-stripped")),
        ("churn-luajit", None),
    ] {
        let Some(data) = fixture(name) else { continue };
        let named = function_symbols(&data, "lj_func_freeproto").unwrap();
        let found = luajit_free_by_code(&data).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(named.first().map(|s| s.0), Some(found), "{name}");
        if let Some(data) = stripped.and_then(fixture) {
            assert_eq!(luajit_free_by_code(&data), Ok(found), "{name} stripped");
        }
    }
    for (name, stripped) in [
        ("lua5.5", None),
        ("churn-lua5.4", None),
        ("lua5.4-fork", Some("lua5.4-fork-stripped")),
        ("lua5.5-fork", Some("lua5.5-fork-stripped")),
    ] {
        let Some(data) = fixture(name) else { continue };
        let release = lrec_inspect::lua::detect::lua_release(&data).unwrap();
        let o = puc::learn::learn(&data, release.0, release.1, None)
            .unwrap()
            .layout
            .offsets;
        let named = function_symbols(&data, "luaF_freeproto").unwrap();
        let found = puc_free_by_code(&data, o.p_code, o.p_lineinfo)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(named.first().map(|s| s.0), Some(found), "{name}");
        if let Some(data) = stripped.and_then(fixture) {
            assert_eq!(
                puc_free_by_code(&data, o.p_code, o.p_lineinfo),
                Ok(found),
                "{name} stripped"
            );
        }
    }
}
