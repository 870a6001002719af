//! `lanalyze --speedscope` and `--firefox` over the committed captures
//! (`fixtures/captures/*.lrec`, analysed `--offline` so that the output depends on the
//! capture alone): the speedscope file validates against speedscope's published schema
//! (`tests/data/speedscope-file-format-schema.json`, see `tests/data/README.md`), and both
//! hold every thread with all its samples.

use std::path::PathBuf;
use std::process::Command;

use lanalyze::render::TRUNCATED_FRAME;
use lanalyze::{analyze, FrameKind, Options, Profile};
use lrec_format::Capture;
use serde_json::Value;

const CAPTURES: [&str; 2] = ["luajit-small", "native-small"];

fn capture_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../fixtures/captures/{name}.lrec"))
}

/// The profile the CLI renders, read through the library for the expected counts.
fn profile(name: &str) -> Profile {
    let capture = Capture::open(&capture_path(name)).unwrap();
    let opts = Options {
        offline: true,
        ..Options::default()
    };
    analyze(&capture, &opts).unwrap()
}

/// Runs `lanalyze CAPTURE --offline FLAG` and parses its standard output as JSON.
fn export(name: &str, flag: &str) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_lanalyze"))
        .arg(capture_path(name))
        .args(["--offline", flag])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "lanalyze {name} {flag}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{name} {flag}: {} bytes", out.stdout.len());
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{name} {flag}: not JSON: {e}"))
}

fn speedscope_schema() -> jsonschema::Validator {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/speedscope-file-format-schema.json");
    let schema: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    jsonschema::validator_for(&schema).unwrap()
}

fn schema_errors(validator: &jsonschema::Validator, doc: &Value) -> Vec<String> {
    validator
        .iter_errors(doc)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

#[test]
fn speedscope_is_valid_and_holds_every_sample_in_time_order() {
    let validator = speedscope_schema();
    for name in CAPTURES {
        let doc = export(name, "--speedscope");
        let errors = schema_errors(&validator, &doc);
        assert!(errors.is_empty(), "{name}: {errors:#?}");

        let profile = profile(name);
        let profiles = doc["profiles"].as_array().unwrap();
        assert_eq!(
            profiles.len(),
            profile.threads.len(),
            "{name}: one profile per thread"
        );
        let frames = doc["shared"]["frames"].as_array().unwrap().len();
        // The busiest thread first (speedscope opens the first).
        let counts: Vec<usize> = profiles
            .iter()
            .map(|p| p["samples"].as_array().unwrap().len())
            .collect();
        assert!(
            counts.windows(2).all(|w| w[0] >= w[1]),
            "{name}: {counts:?}"
        );
        assert_eq!(doc["activeProfileIndex"], 0);
        for thread in &profile.threads {
            let title = format!("{} [{}]", thread.name, thread.tid);
            let p = profiles.iter().find(|p| p["name"] == title).unwrap();
            assert_eq!(p["type"], "sampled");
            let samples = p["samples"].as_array().unwrap();
            let weights = p["weights"].as_array().unwrap();
            assert_eq!(
                samples.len() as u64,
                thread.samples,
                "{name}: {}",
                p["name"]
            );
            assert_eq!(weights.len(), samples.len());
            let total: u64 = weights.iter().map(|w| w.as_u64().unwrap()).sum();
            assert_eq!(
                p["endValue"].as_u64().unwrap() - p["startValue"].as_u64().unwrap(),
                total
            );
            assert!(samples
                .iter()
                .flat_map(|s| s.as_array().unwrap())
                .all(|f| (f.as_u64().unwrap() as usize) < frames));
        }
        // speedscope draws samples in the file's order and keeps no times: each
        // thread's stacks must come as its samples do, sorted by time.
        for p in profiles {
            let i = profile
                .threads
                .iter()
                .position(|t| p["name"] == format!("{} [{}]", t.name, t.tid))
                .unwrap();
            assert_eq!(
                speedscope_stacks(&doc, p),
                stacks_in_time_order(&profile, i),
                "{name}: {}",
                p["name"]
            );
        }
    }
}

/// A sampled profile's stacks, as frame names.
fn speedscope_stacks(doc: &Value, p: &Value) -> Vec<Vec<String>> {
    let frames = doc["shared"]["frames"].as_array().unwrap();
    p["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            s.as_array()
                .unwrap()
                .iter()
                .map(|f| {
                    frames[f.as_u64().unwrap() as usize]["name"]
                        .as_str()
                        .unwrap()
                        .to_owned()
                })
                .collect()
        })
        .collect()
}

/// A thread's stacks, as frame names, sorted by sample time (stable).
fn stacks_in_time_order(profile: &Profile, thread: usize) -> Vec<Vec<String>> {
    let names = profile.display_names();
    let mut samples: Vec<_> = profile
        .samples
        .iter()
        .filter(|s| s.thread == thread)
        .collect();
    samples.sort_by_key(|s| s.time_ns);
    assert!(samples.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
    samples
        .iter()
        .map(|s| {
            let truncated = s.truncated().then(|| TRUNCATED_FRAME.to_owned());
            truncated
                .into_iter()
                .chain(s.frames.iter().map(|&id| names[id as usize].clone()))
                .collect()
        })
        .collect()
}

#[test]
fn the_speedscope_schema_rejects_what_speedscope_cannot_read() {
    // The validation is not vacuous: a profile without weights, or a frame without a
    // name, fails.
    let validator = speedscope_schema();
    let doc = export("native-small", "--speedscope");
    let mut no_weights = doc.clone();
    no_weights["profiles"][0]
        .as_object_mut()
        .unwrap()
        .remove("weights");
    assert!(!schema_errors(&validator, &no_weights).is_empty());
    let mut nameless = doc.clone();
    nameless["shared"]["frames"][0]
        .as_object_mut()
        .unwrap()
        .remove("name");
    assert!(!schema_errors(&validator, &nameless).is_empty());
    let mut wrong_schema = doc;
    wrong_schema["$schema"] = "https://example.com/schema.json".into();
    assert!(!schema_errors(&validator, &wrong_schema).is_empty());
}

/// The Firefox Profiler reads what `fxprof-processed-profile` writes (it offers no
/// validator); this checks that the profile's threads and samples all arrive.
#[test]
fn firefox_has_a_track_per_thread_with_all_its_samples() {
    for name in CAPTURES {
        let doc = export(name, "--firefox");
        let text = serde_json::to_string(&doc).unwrap();
        let again: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(again, doc, "{name}: JSON round trip");

        let profile = profile(name);
        let meta = &doc["meta"];
        let categories: Vec<&str> = meta["categories"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        for wanted in ["Lua", "C / native", "Kernel"] {
            assert!(categories.contains(&wanted), "{name}: {categories:?}");
        }
        // Interpreted, compiled, GC and C are subcategories of the one Lua category.
        let lua = categories.iter().position(|&c| c == "Lua").unwrap();
        let subcategories = &meta["categories"][lua]["subcategories"];
        for wanted in ["interpreted", "JIT-compiled", "JIT compiler", "GC", "C"] {
            assert!(
                subcategories
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|s| s == wanted),
                "{name}: {subcategories}"
            );
        }
        let hz = f64::from(profile.header.frequency_hz);
        // Whole nanoseconds, in milliseconds.
        assert!((meta["interval"].as_f64().unwrap() - 1000.0 / hz).abs() < 1e-6);
        let start_ms = profile.header.wall_clock_start_ns as f64 / 1e6;
        assert!((meta["startTime"].as_f64().unwrap() - start_ms).abs() < 1.0);

        let threads = doc["threads"].as_array().unwrap();
        assert_eq!(threads.len(), profile.threads.len(), "{name}");
        let mut lua_frames = 0;
        for t in &profile.threads {
            // The format writes pids and tids as strings.
            let tid = t.tid.to_string();
            let track = threads
                .iter()
                .find(|x| x["tid"] == tid.as_str())
                .unwrap_or_else(|| panic!("{name}: no track for tid {}", t.tid));
            assert_eq!(track["pid"], t.pid.to_string());
            assert_eq!(track["isMainThread"], t.tid == t.pid);
            // The profiler names a main thread after its process, which is named after it.
            assert_eq!(track["name"], t.name);
            let samples = &track["samples"];
            assert_eq!(samples["length"].as_u64().unwrap(), t.samples, "{name}");
            let deltas = samples["timeDeltas"].as_array().unwrap();
            assert_eq!(deltas.len() as u64, t.samples);
            assert!(deltas.iter().all(|d| d.as_f64().unwrap() >= 0.0));
            let weights = samples["weight"].as_array().unwrap();
            assert!(weights.iter().all(|w| w == 1));
            let lua = categories.iter().position(|&c| c == "Lua").unwrap();
            lua_frames += track["frameTable"]["category"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|&c| c == lua)
                .count();
        }
        let has_lua = profile.frames.iter().any(|f| f.kind == FrameKind::Lua);
        assert_eq!(
            lua_frames > 0,
            has_lua,
            "{name}: Lua frames in the Lua category"
        );
        // Lua functions have a file and a line; native ones a library of `libs`.
        assert_eq!(meta["stackwalk"], 1);
        assert_eq!(
            doc["libs"].as_array().unwrap().len(),
            profile.binaries.len()
        );
        let (mut with_file, mut with_lib) = (0, 0);
        for track in threads {
            let funcs = &track["funcTable"];
            let column = |c: &str| funcs[c].as_array().unwrap().clone();
            for (file, line) in column("fileName").iter().zip(column("lineNumber")) {
                assert_eq!(file.is_null(), line.is_null(), "{name}");
                with_file += usize::from(!file.is_null());
            }
            with_lib += column("resource").iter().filter(|r| **r != -1).count();
        }
        assert_eq!(with_file > 0, has_lua, "{name}: Lua functions with files");
        assert!(with_lib > 0, "{name}: no function has a library");

        // The capture's counts ride on the recorded process's main thread.
        let target = profile.header.target_pid.to_string();
        let main = threads
            .iter()
            .find(|x| x["tid"] == target && x["pid"] == target)
            .unwrap();
        let markers = &main["markers"];
        let names: Vec<&str> = markers["name"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                main["stringArray"][n.as_u64().unwrap() as usize]
                    .as_str()
                    .unwrap()
            })
            .collect();
        assert!(names.contains(&"Capture"), "{name}: {names:?}");
        let capture = &markers["data"][names.iter().position(|&n| n == "Capture").unwrap()];
        assert_eq!(
            capture["samples"].as_f64().unwrap(),
            profile.samples.len() as f64
        );
        assert_eq!(capture["lost"].as_f64().unwrap(), profile.stats.lost as f64);
        assert_eq!(names.contains(&"Lost samples"), profile.stats.lost > 0);
    }
}
