//! ARCHITECTURE.md stays true to the tree (issue 42): every file it names in backticks
//! exists, and every `Type::name` it names is a function or field of that type (the type
//! and the `fn` or field in one file). No BPF, no process: a reading of the text against the tree.

use std::path::{Path, PathBuf};

use lrec_e2e::root;
use regex::Regex;

/// The sources of the tree (Rust, C, the docs), build outputs left out.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            if !matches!(
                name.as_str(),
                "target" | "build" | "bin" | ".git" | "node_modules"
            ) {
                sources(&p, out);
            }
        } else if [".rs", ".c", ".h", ".md", ".lua", ".sh", ".py"]
            .iter()
            .any(|x| name.ends_with(x))
        {
            out.push(p);
        }
    }
}

/// The backticked spans of a Markdown text.
fn spans(text: &str) -> Vec<String> {
    Regex::new(r"`([^`\n]+)`")
        .unwrap()
        .captures_iter(text)
        .map(|c| c[1].to_string())
        .collect()
}

/// Whether `func` is a function or field of `ty` in one of the files: an `impl` of the type
/// and the `fn` in one file, a `struct` and the field, or a `macro_rules!` defining the
/// `fn` that a file invokes on `struct ty`.
fn is_member(texts: &[(PathBuf, String)], ty: &str, func: &str) -> bool {
    let re = |p: String| Regex::new(&p).unwrap();
    let imp = re(format!(
        r"impl(?:<[^>]*>)?\s+(?:[\w:<>, ]+\s+for\s+)?{ty}\b"
    ));
    let def = re(format!(r"\bfn\s+{func}\b"));
    let strukt = re(format!(r"(?:struct|enum)\s+{ty}\b"));
    let field = re(format!(r"(?m)^\s*(?:pub(?:\([a-z]+\))?\s+)?{func}\s*:"));
    let variant = re(format!(r"\b{ty}::{func}\b"));
    let direct = texts.iter().any(|(_, t)| {
        (imp.is_match(t) && def.is_match(t))
            || (strukt.is_match(t) && (field.is_match(t) || variant.is_match(t)))
    });
    if direct {
        return true;
    }
    let macro_def = re(r"macro_rules!\s+(\w+)".to_string());
    texts.iter().any(|(_, t)| {
        def.is_match(t)
            && macro_def.captures_iter(t).any(|m| {
                let call = re(format!(r"(?s)\b{}!\s*\{{[^}}]*?struct\s+{ty}\b", &m[1]));
                texts.iter().any(|(_, u)| call.is_match(u))
            })
    })
}

#[test]
fn architecture_names_only_what_exists() {
    let top = root();
    let text = std::fs::read_to_string(top.join("ARCHITECTURE.md")).unwrap();
    let mut files = Vec::new();
    sources(&top, &mut files);
    let texts: Vec<(PathBuf, String)> = files
        .iter()
        .filter(|p| !p.to_string_lossy().ends_with(".md"))
        .map(|p| (p.clone(), std::fs::read_to_string(p).unwrap_or_default()))
        .collect();
    let path_like = Regex::new(r"^[A-Za-z0-9_./-]+\.(rs|c|h|md)$").unwrap();
    let method =
        Regex::new(r"^(?:[a-z_]+::)*([A-Z][A-Za-z0-9]*)::([a-z_][a-z0-9_]*)(?:\(\))?$").unwrap();
    let mut missing = Vec::new();
    let mut checked = 0;
    for span in spans(&text) {
        if path_like.is_match(&span) {
            checked += 1;
            // A path from the top, from a crate's directory (`src/…`), or a file name
            // that some file of the tree has.
            let found = top.join(&span).exists()
                || files.iter().any(|f| {
                    let f = f.to_string_lossy();
                    f.ends_with(&format!("/{span}"))
                });
            if !found {
                missing.push(format!("file `{span}`"));
            }
        } else if let Some(c) = method.captures(&span) {
            checked += 1;
            let (ty, func) = (&c[1], &c[2]);
            let found = is_member(&texts, ty, func);
            if !found {
                missing.push(format!("function `{span}`"));
            }
        }
    }
    eprintln!("ARCHITECTURE.md: {checked} names checked against the tree");
    assert!(
        checked > 50,
        "only {checked} names found in ARCHITECTURE.md"
    );
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names what the tree does not hold:\n{}",
        missing.join("\n")
    );
}

/// No import circle among format's or record's modules, nor among ebpf/'s includes
/// (scripts/import_cycles.py says how it reads them).
#[test]
fn format_record_and_ebpf_have_no_import_circle() {
    let out = std::process::Command::new("python3")
        .arg(root().join("scripts/import_cycles.py"))
        .args(["format", "record"])
        .output()
        .expect("python3 runs scripts/import_cycles.py");
    let said = String::from_utf8_lossy(&out.stdout);
    eprintln!("{said}");
    assert!(out.status.success(), "import circles:\n{said}");
}

/// Each ebpf/ file reads alone: its includes at its top, before any of its own code, and
/// each header compiles as the first and only include of an empty file (with clang-19, as
/// record/build.rs compiles the programs).
#[test]
fn ebpf_files_read_alone() {
    let dir = root().join("ebpf");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "h" || e == "c"))
        .collect();
    files.sort();
    let mut wrong = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        // Code: a line outside comments that is not a preprocessor line.
        let (mut in_comment, mut code_seen) = (false, false);
        for (n, line) in text.lines().enumerate() {
            let t = line.trim();
            let was_comment = in_comment || t.starts_with("/*") || t.starts_with("//");
            if t.starts_with("/*") && !t.contains("*/") {
                in_comment = true;
            } else if in_comment && t.contains("*/") {
                in_comment = false;
            }
            if was_comment || t.is_empty() {
                continue;
            }
            if t.starts_with("#include") && code_seen {
                wrong.push(format!("{name}:{}: an include after code", n + 1));
            }
            code_seen |= !t.starts_with('#');
        }
        if name.ends_with(".h") {
            let unit = std::env::temp_dir().join(format!("lrec-alone-{name}.c"));
            std::fs::write(&unit, format!("#include \"{name}\"\n")).unwrap();
            let out = std::process::Command::new("clang-19")
                .args(["-target", "bpf", "-O2", "-Wall", "-Werror"])
                // A header's static functions need not be used by the header itself.
                .args(["-Wno-unused-function", "-D__TARGET_ARCH_x86"])
                .args(["-I/usr/include/x86_64-linux-gnu", "-fsyntax-only", "-I"])
                .arg(&dir)
                .arg(&unit)
                .output()
                .expect("clang-19 runs (make setup installs it)");
            let _ = std::fs::remove_file(&unit);
            if !out.status.success() {
                let err = String::from_utf8_lossy(&out.stderr);
                let first = err.lines().find(|l| l.contains("error")).unwrap_or("");
                wrong.push(format!("{name} does not compile alone: {first}"));
            }
        }
    }
    eprintln!("{} ebpf files read alone", files.len() - wrong.len());
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
