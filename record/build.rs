//! Compiles the BPF programs in ../ebpf with clang-19 into OUT_DIR.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let src = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("../ebpf");
    println!("cargo:rerun-if-changed={}", src.display());
    let clang = std::env::var("LREC_CLANG").unwrap_or_else(|_| "clang-19".into());
    let mut progs: Vec<PathBuf> = std::fs::read_dir(&src)
        .expect("ebpf/ exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".bpf.c"))
        .collect();
    progs.sort();
    for c in progs {
        let prog = c
            .file_name()
            .unwrap()
            .to_string_lossy()
            .replace(".bpf.c", "");
        let status = Command::new(&clang)
            .args(["-target", "bpf", "-O2", "-g", "-Wall", "-Werror"])
            .arg("-D__TARGET_ARCH_x86")
            .arg("-I/usr/include/x86_64-linux-gnu")
            .arg("-c")
            .arg(&c)
            .arg("-o")
            .arg(out.join(format!("{prog}.bpf.o")))
            .status()
            .unwrap_or_else(|e| {
                panic!("cannot run {clang} to build the BPF programs ({e}): run `make setup`")
            });
        assert!(status.success(), "{clang} failed on {}", c.display());
    }
}
