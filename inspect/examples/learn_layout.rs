//! Prints the layout lrec learns for the Lua VM of each ELF file given, each field with
//! its source, and how it differs from the known build it resembles:
//! `cargo run --release -p lrec-inspect --example learn_layout -- FILE…`.

use lrec_inspect::elf::unwind_record;
use lrec_inspect::lua::detect::luajit_vm;
use lrec_inspect::lua::luajit::{learn::learn, releases::KNOWN};

fn main() {
    for path in std::env::args().skip(1) {
        let data = std::fs::read(&path).expect("read the file");
        let binary = unwind_record(&path, &data);
        let Some(vm) = luajit_vm(&binary) else {
            println!("{path}: no LuaJIT interpreter");
            continue;
        };
        let started = std::time::Instant::now();
        match learn(&data, &vm, None) {
            Ok(l) => {
                println!("{path}: {} in {:?}", l.summary(), started.elapsed());
                for (k, s) in &l.sources {
                    let v = l
                        .layout
                        .offsets
                        .named()
                        .into_iter()
                        .find(|(n, _)| n == k)
                        .map(|(_, v)| v);
                    println!("  {k:16} {v:>6?}  {s}");
                }
                println!("  missing: {:?}", l.missing);
                for c in &l.conflicts {
                    println!("  conflict: {c}");
                }
                for (name, o, _) in KNOWN {
                    let d = l.layout.offsets.differences(o);
                    if d.len() < 12 {
                        println!("  vs {name}: {d:?}");
                    }
                }
            }
            Err(e) => println!("{path}: {e}"),
        }
    }
}
