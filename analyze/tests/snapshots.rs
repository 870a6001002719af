//! Snapshots of `lanalyze --folded --offline` and `--info --offline` (through the library,
//! which the CLI only wraps) over every capture in `fixtures/captures/*.lrec`.
//!
//! Offline, the output depends on the capture alone, so it is stable across machines.
//! After an intended change of output, re-bless with
//!     cargo insta test -p lanalyze --test snapshots --accept
//! or  INSTA_UPDATE=always cargo test -p lanalyze --test snapshots
//! and review the diff of analyze/tests/snapshots/.
//! With no captures in the directory, the test checks nothing and says so.

use std::path::PathBuf;

use lanalyze::render::{write_folded, write_info, StackOptions};
use lanalyze::{analyze, Options};
use lrec_format::Capture;

fn captures() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/captures");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "lrec"))
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    if found.is_empty() {
        eprintln!(
            "note: no captures in {}; nothing snapshotted",
            dir.display()
        );
    }
    found
}

#[test]
fn folded_and_info_offline() {
    for path in captures() {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let capture = Capture::open(&path).unwrap();
        let opts = Options {
            offline: true,
            ..Options::default()
        };
        let profile = analyze(&capture, &opts).unwrap();
        let mut folded = Vec::new();
        write_folded(&profile, StackOptions::default(), &mut folded).unwrap();
        insta::assert_snapshot!(format!("{name}.folded"), String::from_utf8(folded).unwrap());
        let mut info = Vec::new();
        write_info(&profile, &mut info).unwrap();
        let info = String::from_utf8(info).unwrap();
        insta::assert_snapshot!(format!("{name}.info"), info);
        // A stripped copy says the same, names and their coverage included.
        let mut stripped = Vec::new();
        lanalyze::strip::write_stripped(&profile, &[], &mut stripped).unwrap();
        let stripped = analyze(&Capture::from_bytes(stripped).unwrap(), &opts).unwrap();
        let mut again = Vec::new();
        write_info(&stripped, &mut again).unwrap();
        assert_eq!(
            String::from_utf8(again).unwrap(),
            info,
            "{name}: stripped --info"
        );
    }
}
