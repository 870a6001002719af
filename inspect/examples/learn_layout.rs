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
            puc(&path, &data);
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

/// A PUC Lua build's layout, by its version string.
fn puc(path: &str, data: &[u8]) {
    let ranges = lrec_inspect::lua::detect::string_ranges(data);
    let release = ranges.iter().find_map(|&(s, e)| {
        let text = data.get(s as usize..(s + e) as usize)?;
        let at = memchr_find(text, b"$LuaVersion: Lua 5.")
            .or_else(|| memchr_find(text, b"$Lua: Lua 5."))?;
        lrec_inspect::lua::detect::lua_release(&text[at..(at + 64).min(text.len())])
    });
    let Some((minor, patch)) = release else {
        println!("{path}: no Lua interpreter");
        return;
    };
    let debug = std::env::var("DEBUG_FILE")
        .ok()
        .map(|p| std::fs::read(p).expect("the debug file"));
    let sup = std::env::var("SUP_FILE")
        .ok()
        .map(|p| std::fs::read(p).expect("the dwz file"));
    let files = debug.as_deref().map(|d| (d, sup.as_deref()));
    match lrec_inspect::lua::puc::learn::learn(data, minor, patch, files) {
        Ok(l) => {
            println!("{path}: {}", l.summary());
            for (k, s) in &l.sources {
                let v = l
                    .layout
                    .offsets
                    .named()
                    .into_iter()
                    .find(|(n, _)| n == k)
                    .map(|(_, v)| v);
                println!("  {k:20} {v:>6?}  {s}");
            }
            println!("  missing: {:?}", l.missing);
            for c in &l.conflicts {
                println!("  conflict: {c}");
            }
            if let Some(r) = lrec_inspect::lua::puc::releases::release(minor, patch) {
                let o = &l.layout.offsets;
                for name in o.differences(&r.offsets) {
                    let get = |x: &lrec_inspect::lua::puc::Offsets| {
                        x.named()
                            .into_iter()
                            .find(|(n, _)| n == name)
                            .map(|(_, v)| v)
                    };
                    println!(
                        "  vs {}: {name} {:?} vs {:?}",
                        r.name(),
                        get(o),
                        get(&r.offsets)
                    );
                }
            }
        }
        Err(e) => println!("{path}: {e}"),
    }
}

fn memchr_find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
