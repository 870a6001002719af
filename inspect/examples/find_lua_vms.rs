//! Prints the Lua interpreters lrec would find in ELF files, by the same evidence:
//! `cargo run --release -p lrec-inspect --example find_lua_vms -- FILE…`
//! (directories are walked). Files without a VM print nothing unless `-v` is given.

use lrec_inspect::elf::{self, DebugInfo};

fn visit(path: &std::path::Path, verbose: bool, seen: &mut u64) {
    if path.is_dir() {
        let Ok(dir) = std::fs::read_dir(path) else {
            return;
        };
        for e in dir.flatten() {
            let p = e.path();
            if !p.is_symlink() {
                visit(&p, verbose, seen);
            }
        }
        return;
    }
    let Ok(file) = std::fs::File::open(path) else {
        return;
    };
    // SAFETY: read-only mapping of a file nobody is expected to truncate meanwhile.
    let Ok(data) = (unsafe { memmap2::Mmap::map(&file) }) else {
        return;
    };
    if data.len() < 64 || &data[..4] != b"\x7fELF" {
        return;
    }
    *seen += 1;
    let binary = elf::binary_record(&path.to_string_lossy(), &data, DebugInfo::None);
    if let Some(vm) = lrec_inspect::lua::detect::luajit_vm(&binary) {
        println!(
            "{}: LuaJIT VM {:#x}..{:#x} ({} bytes)",
            path.display(),
            vm.start,
            vm.end,
            vm.end - vm.start
        );
    } else if let Some((minor, patch)) = lrec_inspect::lua::detect::lua_release(&data) {
        match lrec_inspect::lua::detect::puc_execute(&data, &binary, minor) {
            Ok((s, e)) => println!(
                "{}: Lua 5.{minor}.{patch} luaV_execute {s:#x}..{e:#x} ({} bytes)",
                path.display(),
                e - s
            ),
            Err(why) => println!(
                "{}: Lua 5.{minor}.{patch} NOT LOCATED: {why}",
                path.display()
            ),
        }
    } else if verbose {
        println!("{}: none", path.display());
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let verbose = args.iter().any(|a| a == "-v");
    let mut seen = 0;
    for a in args.iter().filter(|a| *a != "-v") {
        visit(std::path::Path::new(a), verbose, &mut seen);
    }
    eprintln!("{seen} ELF files");
}
