//! Where a Lua VM frees a function prototype: the function lrec's uprobe counts the frees
//! of, so that a call site remembered by its BPF walkers is proved by no proto freed since
//! (ebpf/lua_frees.h). Every proto is freed there, by the GC's sweep and by lua_close
//! alike: LuaJIT's `lj_func_freeproto` (called through the GC's table of free functions,
//! so never inlined), PUC Lua's `luaF_freeproto`.

use crate::elf;
use crate::eval::{self, Expr};

/// The VM, as ebpf/lua_frees.h numbers them (`LUA_VM_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Vm {
    LuaJit = 0,
    Puc = 1,
}

impl Vm {
    /// The name of the VM's proto free function.
    pub fn free_function(self) -> &'static str {
        match self {
            Vm::LuaJit => "lj_func_freeproto",
            Vm::Puc => "luaF_freeproto",
        }
    }
}

/// A VM's proto free function in its binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProtoFree {
    pub svma: u64,
    /// Where its code lies in the file: what a uprobe attaches at.
    pub file_offset: u64,
    /// How it was found: "its symbol", "its code".
    pub found_by: &'static str,
}

/// The proto free function of the `vm` VM in the binary `data`, by its symbol there or in
/// its separate debug file (`debug`); one definition only (an inlined copy elsewhere would
/// free protos uncounted, and two definitions leave which one runs unknown).
pub fn proto_free(data: &[u8], debug: Option<&[u8]>, vm: Vm) -> Result<ProtoFree, String> {
    let name = vm.free_function();
    let mut found = elf::function_symbols(data, name)?;
    if found.is_empty() {
        if let Some(debug) = debug {
            found = elf::function_symbols(debug, name).unwrap_or_default();
        }
    }
    let svma = match found[..] {
        [(svma, _)] => svma,
        [] => return Err(format!("no symbol names {name}")),
        _ => return Err(format!("{} functions are named {name}", found.len())),
    };
    at(data, svma, "its symbol")
}

fn at(data: &[u8], svma: u64, found_by: &'static str) -> Result<ProtoFree, String> {
    Ok(ProtoFree {
        svma,
        file_offset: elf::code_file_offset(data, svma)?,
        found_by,
    })
}

/// The start of the one function of `code` that `is` holds for, or why there is not one
/// (none or several found to do `what`, or the search stopped by its budget).
fn the_one(code: &elf::Code, is: impl Fn(&(u64, u64)) -> bool, what: &str) -> Result<u64, String> {
    let mut found: Vec<u64> = Vec::new();
    for f in code.functions() {
        if !crate::budget::charge(1) {
            break;
        }
        if is(f) {
            found.push(f.0);
            // Two are as many as any number more than one: no need to look further.
            if found.len() == 2 {
                break;
            }
        }
    }
    if let Some(why) = crate::budget::spent() {
        return Err(format!(
            "the search for a function to {what} stopped: {why}"
        ));
    }
    match found[..] {
        [svma] => Ok(svma),
        [] => Err(format!("no function found to {what}")),
        _ => Err(format!("more than one function found to {what}")),
    }
}

/// Longest function looked at for LuaJIT's `lj_func_freeproto` (~20-40 bytes).
const LUAJIT_FREE_MAX: u64 = 96;

/// LuaJIT's `lj_func_freeproto` in `data`: by its symbol ([`proto_free`]), else, in a
/// stripped build, by its machine code. It is `lj_mem_free(g, pt, pt->sizept)`: one call
/// (mostly a tail call) through the allocator pointer in its first argument (`g->allocf`,
/// `g->allocd` first) that frees its second argument (`pt`, as is) to size 0 from a size
/// read, as is, from that argument. The other objects' free functions compute their size
/// (strings, functions, userdata), free a fixed size (upvalues) or free more than once
/// (tables, states).
pub fn luajit_proto_free(data: &[u8], debug: Option<&[u8]>) -> Result<ProtoFree, String> {
    let by_symbol = match proto_free(data, debug, Vm::LuaJit) {
        Ok(f) => return Ok(f),
        Err(e) => e,
    };
    let svma = luajit_free_by_code(data).map_err(|e| format!("{by_symbol}, and {e}"))?;
    at(data, svma, "its code")
}

/// [`luajit_proto_free`]'s search of the machine code.
pub fn luajit_free_by_code(data: &[u8]) -> Result<u64, String> {
    let code = elf::Code::new(data)?;
    let of_g = |e: &Expr| match e {
        Expr::Load(a, 8) => {
            matches!(&**a, Expr::Arg(0))
                || matches!(&**a, Expr::Offset(b, _) if **b == Expr::Arg(0))
        }
        _ => false,
    };
    let size_of_pt = |e: &Expr| match e {
        Expr::Load(a, 4 | 8) => matches!(&**a, Expr::Offset(b, _) if **b == Expr::Arg(1)),
        _ => false,
    };
    let frees_pt = |&(start, end): &(u64, u64)| {
        if end - start > LUAJIT_FREE_MAX {
            return false;
        }
        let opts = eval::Options {
            inline_depth: 0,
            budget: 200,
        };
        let mut calls = eval::evaluate(&code, start, &[], opts)
            .into_iter()
            .filter_map(|e| match e {
                eval::Event::Call { target, args, .. } => Some((target.is_none(), args)),
                eval::Event::Jump { target, args, .. } => Some((of_g(&target), args)),
                _ => None,
            });
        match (calls.next(), calls.next()) {
            (Some((true, args)), None) => {
                args.len() >= 4
                    && of_g(&args[0])
                    && args[1] == Expr::Arg(1)
                    && size_of_pt(&args[2])
                    && args[3] == Expr::Const(0)
            }
            _ => false,
        }
    };
    the_one(
        &code,
        frees_pt,
        "free an object as LuaJIT's proto free does",
    )
}

/// Longest function looked at for PUC Lua's `luaF_freeproto` (~100-250 bytes as built by
/// gcc and clang, 5.1 to 5.5).
const PUC_FREE_MAX: u64 = 1024;

/// PUC Lua's `luaF_freeproto` in `data`: by its symbol ([`proto_free`]), else, in a
/// stripped build, by its machine code: the one function that hands its second argument's
/// code and line table (`Proto.code`, `Proto.lineinfo`, at this build's offsets `p_code`
/// and `p_lineinfo`) to one function as the block to free (`luaM_free_`, or 5.1's
/// `luaM_realloc_`), its first argument (the lua_State) passed on with them, and calls
/// nothing else. The parser shrinks those vectors too, but through its own state
/// (`fs->f`), not an argument.
pub fn puc_proto_free(
    data: &[u8],
    debug: Option<&[u8]>,
    p_code: u32,
    p_lineinfo: u32,
) -> Result<ProtoFree, String> {
    let by_symbol = match proto_free(data, debug, Vm::Puc) {
        Ok(f) => return Ok(f),
        Err(e) => e,
    };
    let svma =
        puc_free_by_code(data, p_code, p_lineinfo).map_err(|e| format!("{by_symbol}, and {e}"))?;
    at(data, svma, "its code")
}

/// [`puc_proto_free`]'s search of the machine code.
pub fn puc_free_by_code(data: &[u8], p_code: u32, p_lineinfo: u32) -> Result<u64, String> {
    let code = elf::Code::new(data)?;
    let freed = |offset: u32| Expr::load(Expr::Arg(1).offset(i64::from(offset)), 8);
    let (code_of, lines_of) = (freed(p_code), freed(p_lineinfo));
    let frees_both = |&(start, end): &(u64, u64)| {
        if end - start > PUC_FREE_MAX {
            return false;
        }
        // Two calls at least (a cheap look at the bytes before the evaluation).
        let calls = code
            .bytes(start, end)
            .map_or(0, |b| b.iter().filter(|&&b| b == 0xe8).count());
        if calls < 2 {
            return false;
        }
        let opts = eval::Options {
            inline_depth: 0,
            budget: 2_000,
        };
        let mut targets: [Vec<u64>; 2] = Default::default();
        let mut callees = Vec::new();
        for e in eval::evaluate(&code, start, &[], opts) {
            let eval::Event::Call { target, args, .. } = e else {
                continue;
            };
            callees.push(target);
            if args.first() != Some(&Expr::Arg(0)) {
                continue;
            }
            for (i, want) in [&code_of, &lines_of].into_iter().enumerate() {
                if args.get(1) == Some(want) {
                    targets[i].extend(target);
                }
            }
        }
        // It calls the free function only: a function it was inlined into (the GC's
        // `freeobj`, under LTO) calls others too, and runs for every object freed.
        callees.sort_unstable();
        callees.dedup();
        targets[0].iter().any(|t| targets[1].contains(t)) && callees.len() == 1
    };
    the_one(&code, frees_both, "free a proto's code and line table")
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::process::Command;

    /// A program defining `name` (and calling it, so that it stays), built with gcc, and a
    /// stripped copy.
    fn built(name: &str) -> (Vec<u8>, Vec<u8>) {
        let dir = std::env::temp_dir().join(format!("lrec-frees-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("p.c");
        std::fs::write(
            &src,
            format!(
                "#include <stdlib.h>\n__attribute__((noinline)) void {name}(void *g, void *p) \
                 {{ free(p); (void)g; }}\nint main(void) {{ {name}(0, malloc(8)); return 0; }}\n"
            ),
        )
        .unwrap();
        let exe = dir.join("p");
        let ok = Command::new("gcc")
            .arg("-O2")
            .arg("-o")
            .arg(&exe)
            .arg(&src)
            .status();
        assert!(ok.unwrap().success(), "gcc failed");
        let stripped = dir.join("p.stripped");
        let ok = Command::new("strip")
            .arg("-o")
            .arg(&stripped)
            .arg(&exe)
            .status();
        assert!(ok.unwrap().success(), "strip failed");
        let both = (
            std::fs::read(&exe).unwrap(),
            std::fs::read(&stripped).unwrap(),
        );
        std::fs::remove_dir_all(&dir).unwrap();
        both
    }

    #[test]
    fn the_free_function_is_found_by_its_symbol_only() {
        let (data, stripped) = built("luaF_freeproto");
        let f = proto_free(&data, None, Vm::Puc).unwrap();
        let (svma, _) = elf::function_symbols(&data, "luaF_freeproto").unwrap()[0];
        assert_eq!((f.svma, f.found_by), (svma, "its symbol"));
        assert_eq!(f.file_offset, elf::code_file_offset(&data, svma).unwrap());
        // The other VM's function is not there; a stripped binary names neither, unless
        // its debug file does.
        let e = proto_free(&data, None, Vm::LuaJit).unwrap_err();
        assert_eq!(e, "no symbol names lj_func_freeproto");
        assert!(proto_free(&stripped, None, Vm::Puc).is_err());
        let f = proto_free(&stripped, Some(&data), Vm::Puc).unwrap();
        assert_eq!(f.svma, svma);
    }

    /// Debian's PUC Lua libraries are stripped: luaF_freeproto is found by its code, where
    /// their debug files name it (5.2 has none).
    #[test]
    fn stripped_vms_free_their_protos_where_their_debug_files_say() {
        use crate::lua::detect::lua_release;
        use crate::lua::system_files::{debug_file, read, LIB};
        for lib in [
            "liblua5.1.so.0",
            "liblua5.2.so.0",
            "liblua5.3.so.0",
            "liblua5.4.so.0",
        ] {
            let Some(data) = read(&format!("{LIB}/{lib}")) else {
                continue;
            };
            let (minor, patch) = lua_release(&data).unwrap();
            let o = crate::lua::puc::learn::learn(&data, minor, patch, None)
                .unwrap()
                .layout
                .offsets;
            assert!(
                proto_free(&data, None, Vm::Puc).is_err(),
                "{lib} is stripped"
            );
            let found = puc_proto_free(&data, None, o.p_code, o.p_lineinfo)
                .unwrap_or_else(|e| panic!("{lib}: {e}"));
            assert_eq!(found.found_by, "its code");
            if let Some(debug) = debug_file(&data) {
                let named = elf::function_symbols(&debug, "luaF_freeproto").unwrap();
                assert_eq!(named[..], [(found.svma, named[0].1)], "{lib}");
            }
            eprintln!("{lib}: luaF_freeproto at {:#x}", found.svma);
        }
        // Debian's LuaJIT is stripped too, and has no debug file: found by its code, as
        // in every fixture build (inspect/tests/layouts.rs checks those against symbols).
        if let Some(data) = read(&format!("{LIB}/libluajit-5.1.so.2")) {
            assert!(proto_free(&data, None, Vm::LuaJit).is_err());
            let found = luajit_proto_free(&data, None).unwrap();
            assert_eq!(found.found_by, "its code");
            eprintln!("libluajit-5.1.so.2: lj_func_freeproto at {:#x}", found.svma);
        }
    }
}
