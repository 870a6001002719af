//! What `fxprof-processed-profile` 0.8 leaves out, added to the serialized profile: the file
//! and line of each Lua function (the function table's `fileName` and `lineNumber`), the
//! library of each native function (a `resourceTable` entry per library, the `libs` list
//! with paths and build ids), and `meta.stackwalk` (the stacks were walked). The app's file
//! and library columns, and its source view for Lua files, then work.

use std::collections::HashMap;

use serde_json::{json, Value};

use crate::image::basename;
use crate::{FrameKind, Profile};

/// The format's resource type of a library.
const RESOURCE_LIBRARY: u64 = 1;

/// Where a function comes from.
#[derive(Debug, Clone, PartialEq)]
enum Source {
    /// A Lua function: its chunk and the line it is defined at.
    Lua { file: String, line: u32 },
    /// A native function: its library, an index into `libs`.
    Lib(usize),
}

pub(super) fn add_sources(v: &mut Value, profile: &Profile) {
    let libs: Vec<Value> = profile.binaries.iter().map(lib).collect();
    let lib_of: HashMap<&str, usize> = profile
        .binaries
        .iter()
        .enumerate()
        .map(|(i, b)| (basename(&b.path), i))
        .collect();
    // The app's names are labels: sources are found by name. A name two frames share
    // with different sources keeps none.
    let mut by_name: HashMap<String, Option<Source>> = HashMap::new();
    for (f, name) in profile.frames.iter().zip(profile.app_names()) {
        let source = match (f.kind, &f.module, f.lines) {
            (FrameKind::Lua, Some(file), Some(lines)) if lines.first > 0 => Some(Source::Lua {
                file: file.clone(),
                line: lines.first,
            }),
            (FrameKind::User | FrameKind::Inlined, Some(module), _) => {
                lib_of.get(module.as_str()).map(|&i| Source::Lib(i))
            }
            _ => None,
        };
        by_name
            .entry(name)
            .and_modify(|s| {
                if *s != source {
                    *s = None;
                }
            })
            .or_insert(source);
    }
    v["meta"]["stackwalk"] = json!(1);
    v["libs"] = Value::Array(libs);
    if let Some(threads) = v["threads"].as_array_mut() {
        for t in threads {
            add_to_thread(t, &by_name, &profile.binaries);
        }
    }
}

fn add_to_thread(
    t: &mut Value,
    by_name: &HashMap<String, Option<Source>>,
    binaries: &[crate::BinaryInfo],
) {
    let Some(len) = t["funcTable"]["length"].as_u64() else {
        return;
    };
    let mut strings: Vec<Value> = t["stringArray"].as_array().cloned().unwrap_or_default();
    let mut string_ids: HashMap<String, usize> = strings
        .iter()
        .enumerate()
        .filter_map(|(i, s)| Some((s.as_str()?.to_string(), i)))
        .collect();
    let mut intern = |s: &str, strings: &mut Vec<Value>| {
        *string_ids.entry(s.to_string()).or_insert_with(|| {
            strings.push(json!(s));
            strings.len() - 1
        })
    };
    let mut resource_of_lib: HashMap<usize, usize> = HashMap::new();
    let mut resources = (Vec::new(), Vec::new()); // (lib, name)
    let funcs = &t["funcTable"];
    let mut file_names = vec![Value::Null; len as usize];
    let mut lines = vec![Value::Null; len as usize];
    let mut func_resources: Vec<Value> = funcs["resource"].as_array().cloned().unwrap_or_default();
    for i in 0..len as usize {
        let name = funcs["name"][i]
            .as_u64()
            .and_then(|n| strings.get(n as usize))
            .and_then(Value::as_str)
            .map(str::to_string);
        match name.and_then(|n| by_name.get(&n).cloned().flatten()) {
            Some(Source::Lua { file, line }) => {
                file_names[i] = json!(intern(&file, &mut strings));
                lines[i] = json!(line);
            }
            Some(Source::Lib(lib)) if i < func_resources.len() => {
                let resource = *resource_of_lib.entry(lib).or_insert_with(|| {
                    resources.0.push(lib);
                    resources
                        .1
                        .push(intern(basename(&binaries[lib].path), &mut strings));
                    resources.0.len() - 1
                });
                func_resources[i] = json!(resource);
            }
            _ => {}
        }
    }
    let n = resources.0.len();
    t["resourceTable"] = json!({
        "length": n,
        "lib": resources.0,
        "name": resources.1,
        "host": vec![Value::Null; n],
        "type": vec![RESOURCE_LIBRARY; n],
    });
    t["funcTable"]["fileName"] = Value::Array(file_names);
    t["funcTable"]["lineNumber"] = Value::Array(lines);
    t["funcTable"]["resource"] = Value::Array(func_resources);
    t["stringArray"] = Value::Array(strings);
}

/// A binary as the format's `libs` entry.
fn lib(b: &crate::BinaryInfo) -> Value {
    let name = basename(&b.path);
    json!({
        "name": name,
        "path": b.path,
        "debugName": name,
        "debugPath": b.path,
        "breakpadId": b.build_id.as_deref().map_or_else(String::new, breakpad_id),
        "codeId": b.build_id.as_deref().map(hex),
        "arch": "x86_64",
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Breakpad's id of an ELF file: the build id's first 16 bytes as a GUID (its first three
/// fields byte-swapped), upper case, then the age, 0.
fn breakpad_id(build_id: &[u8]) -> String {
    let mut g = [0u8; 16];
    let n = build_id.len().min(16);
    g[..n].copy_from_slice(&build_id[..n]);
    g[0..4].reverse();
    g[4..6].reverse();
    g[6..8].reverse();
    format!("{}0", hex(&g).to_uppercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breakpad_ids_are_byte_swapped_guids() {
        // samply's and Breakpad's id of a build id 0x00..0x13.
        let id: Vec<u8> = (0..20).collect();
        assert_eq!(breakpad_id(&id), "030201000504070608090A0B0C0D0E0F0");
        assert_eq!(breakpad_id(&[0xab]), format!("000000AB{}0", "0".repeat(24)));
    }
}
