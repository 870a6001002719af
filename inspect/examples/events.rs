//! Prints what the symbolic evaluator sees in one function of an ELF file:
//! `cargo run --release -p lrec-inspect --example events -- FILE SYMBOL|0xADDR [DEPTH]`.

use lrec_inspect::elf::Code;
use lrec_inspect::eval::{evaluate, Options};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let data = std::fs::read(&args[1]).expect("read the file");
    let code = Code::new(&data).expect("an x86_64 ELF file");
    let start = match args[2].strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).expect("an address"),
        None => code.symbol(&args[2]).expect("a function symbol").0,
    };
    let depth = args.get(3).map_or(0, |d| d.parse().expect("a depth"));
    let opts = Options {
        inline_depth: depth,
        ..Options::default()
    };
    for e in evaluate(&code, start, &[], opts) {
        println!("{e:?}");
    }
}
