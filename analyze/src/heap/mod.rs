//! Lua heap snapshots (`lrec --lua-heap`): every object of each VM by type with its own
//! size as the VM counts it, checked against the collector's own count, and the memory
//! retained by reference path from the roots (`package.loaded["app"].cache[*]`,
//! `_G.handler<upvalue pool of app.lua:12>`), walked offline from the raw memory the
//! capture holds.
//!
//! Each VM's object model is its own module ([`luajit`], [`puc`]); this one walks any of them:
//! objects are reached breadth-first from the roots in order (package.loaded, _G, the
//! registry, the main thread), so each object is attributed to its shortest path, and the
//! first root that reaches it. The paths form a tree whose widths are retained bytes.

pub mod luajit;
mod luajit_objects;
mod memory;
pub mod puc;

pub mod report;
mod stripped;

use std::collections::{BTreeMap, VecDeque};

use anyhow::{bail, Result};
use lrec_format::{Capture, LuaHeap, LuaHeapCopy, LuaHeapMemory, Record};
use rayon::prelude::*;
use rustc_hash::FxHashMap;

pub use memory::Memory;

/// What a Lua object is.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum Kind {
    Table,
    String,
    Function,
    Upvalue,
    Userdata,
    Cdata,
    Thread,
    Proto,
    /// LuaJIT's compiled traces (their IR and snapshots; not the machine code).
    Trace,
    /// Memory the collector counts that belongs to no object: the VM's own state, the
    /// string table.
    Vm,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Table => "table",
            Kind::String => "string",
            Kind::Function => "function",
            Kind::Upvalue => "upvalue",
            Kind::Userdata => "userdata",
            Kind::Cdata => "cdata",
            Kind::Thread => "thread",
            Kind::Proto => "proto",
            Kind::Trace => "trace",
            Kind::Vm => "vm",
        }
    }
}

/// What an object's CSV row says of it besides its size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Detail {
    /// A Lua function's or proto's definition: `app.lua:12`.
    Defined(String),
    /// A table's array slots and hash nodes.
    Table { array: u64, hash: u64 },
    /// A thread's stack slots.
    Stack { slots: u64 },
}

impl std::fmt::Display for Detail {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            Detail::Defined(at) => write!(f, "{at}"),
            Detail::Table { array, hash } => write!(f, "array {array} hash {hash}"),
            Detail::Stack { slots } => write!(f, "stack {slots} slots"),
        }
    }
}

/// One object of the heap, its size as the VM's allocator was asked for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Object {
    pub addr: u64,
    pub kind: Kind,
    pub size: u64,
}

/// How an object is referenced by another: one step of a path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Via {
    /// A table's field under a string key: `.name` (or `["odd key"]`).
    Field(String),
    /// An entry of package.loaded: `["app.cache"]`.
    Module(String),
    /// A field under a number or other non-string key, or the array part: `[*]`.
    Index,
    /// A table's key (not a string): `<key>`; string keys are `<keys>`.
    Key,
    StringKey,
    Metatable,
    Env,
    /// A closure's upvalue, by name and the closure's definition (`pool of app.lua:12`).
    Upvalue(String),
    /// What an upvalue or other holder refers to: the same path as the holder.
    Value,
    Proto,
    /// A proto's constants and names.
    Const,
    /// A slot of a coroutine's stack.
    Stack,
}

impl Via {
    /// The path component: appended to the holder's path.
    fn component(&self) -> String {
        match self {
            Via::Field(k) if is_identifier(k) => format!(".{k}"),
            Via::Field(k) | Via::Module(k) => format!("[{}]", quoted(k)),
            Via::Index => "[*]".into(),
            Via::Key => "<key>".into(),
            Via::StringKey => "<keys>".into(),
            Via::Metatable => "<metatable>".into(),
            Via::Env => "<env>".into(),
            Via::Upvalue(name) => format!("<upvalue {name}>"),
            Via::Value => String::new(),
            Via::Proto => "<proto>".into(),
            Via::Const => "<constants>".into(),
            Via::Stack => "<stack>".into(),
        }
    }
}

/// Whether `s` can be written `t.s` in Lua.
fn is_identifier(s: &str) -> bool {
    const KEYWORDS: &[&str] = &[
        "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "goto", "if",
        "in", "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while",
    ];
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !KEYWORDS.contains(&s)
}

/// ` of app.lua:12` for a function's definition, to name its upvalues by.
fn defined_at(detail: Option<Detail>) -> String {
    match detail {
        Some(Detail::Defined(at)) => format!(" of {at}"),
        _ => String::new(),
    }
}

/// A chunk name as Lua programmers write it: `@app.lua` → `app.lua`, `=stdin` → `stdin`,
/// source text as `[string "…"]` cut short.
fn chunk_name(source: &str) -> String {
    match source.chars().next() {
        Some('@' | '=') => source[1..].to_string(),
        _ => {
            let line = source.lines().next().unwrap_or_default();
            format!("[string \"{}\"]", line.chars().take(30).collect::<String>())
        }
    }
}

/// `s` as a Lua string literal, cut to 40 characters.
fn quoted(s: &str) -> String {
    let mut out = String::from("\"");
    for (i, c) in s.chars().enumerate() {
        if i == 40 {
            out.push('…');
            break;
        }
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c)
            }
            c if c.is_control() => out.push_str(&format!("\\{}", c as u32)),
            // `;` separates a folded stack's frames.
            ';' => out.push_str("\\59"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A Lua VM's heap as its object model reads it.
pub trait VmHeap {
    /// Every object the collector knows (its lists), and the VM's own memory.
    fn census(&self) -> Vec<Object>;
    /// The object at `addr`, reached by a reference though in no list.
    fn object_at(&self, addr: u64) -> Option<Object>;
    /// The roots in the order they claim objects: (path, object).
    fn roots(&self) -> Vec<(String, u64)>;
    /// The objects `obj` references, and how.
    fn refs(&self, obj: &Object, out: &mut Vec<(Via, u64)>);
    /// The collector's own count of the bytes it allocated.
    fn gc_total(&self) -> u64;
    /// What could not be read, said once each.
    fn warnings(&self) -> Vec<String>;
    /// What the CSV says of an object besides its size: where a Lua function or proto
    /// was defined, a table's parts, a thread's stack.
    fn detail(&self, obj: &Object) -> Option<Detail>;
}

/// A node of the path tree: one path, the objects attributed to it.
#[derive(Debug, Default, Clone)]
pub struct PathNode {
    pub parent: Option<u32>,
    pub component: String,
    pub bytes: u64,
    pub count: u64,
    /// Its bytes and all its descendants'.
    pub retained: u64,
    pub children: Vec<u32>,
}

/// The paths objects are reached by, as a tree: node 0 is the empty path above the roots.
#[derive(Debug, Default, Clone)]
pub struct PathTree {
    pub nodes: Vec<PathNode>,
    index: FxHashMap<(u32, String), u32>,
}

impl PathTree {
    fn new() -> PathTree {
        PathTree {
            nodes: vec![PathNode::default()],
            index: FxHashMap::default(),
        }
    }

    /// The child of `parent` with `component` (the parent itself for an empty one).
    fn child(&mut self, parent: u32, component: String) -> u32 {
        if component.is_empty() {
            return parent;
        }
        if let Some(&n) = self.index.get(&(parent, component.clone())) {
            return n;
        }
        let n = self.nodes.len() as u32;
        self.nodes.push(PathNode {
            parent: Some(parent),
            component: component.clone(),
            ..PathNode::default()
        });
        self.nodes[parent as usize].children.push(n);
        self.index.insert((parent, component), n);
        n
    }

    /// The components from the root down to `node`.
    pub fn components(&self, mut node: u32) -> Vec<&str> {
        let mut out = Vec::new();
        while let Some(parent) = self.nodes[node as usize].parent {
            out.push(self.nodes[node as usize].component.as_str());
            node = parent;
        }
        out.reverse();
        out
    }

    /// The path of `node` as a Lua programmer writes it.
    pub fn path(&self, node: u32) -> String {
        self.components(node).concat()
    }

    /// Sums each node's descendants into `retained` (children always follow parents).
    fn sum_retained(&mut self) {
        for n in &mut self.nodes {
            n.retained = n.bytes;
        }
        for i in (1..self.nodes.len()).rev() {
            let (r, parent) = (self.nodes[i].retained, self.nodes[i].parent);
            if let Some(p) = parent {
                self.nodes[p as usize].retained += r;
            }
        }
    }
}

/// Per kind: objects and bytes.
pub type Census = BTreeMap<Kind, (u64, u64)>;

/// One VM's heap, analyzed.
pub struct HeapReport {
    pub vm: LuaHeap,
    pub copy: LuaHeapCopy,
    pub gc_total: u64,
    pub census: Census,
    /// Every object with the path node it is attributed to.
    pub objects: Vec<(Object, u32)>,
    /// The details of `objects` (by index): functions, protos, tables, threads.
    pub details: FxHashMap<usize, Detail>,
    pub paths: PathTree,
    /// The node of objects no root reaches (garbage not collected yet).
    pub unreachable: u32,
    pub warnings: Vec<String>,
    /// From a stripped capture: census and paths only, no objects.
    pub stripped: bool,
}

impl HeapReport {
    /// Bytes of all objects.
    pub fn census_bytes(&self) -> u64 {
        self.census.values().map(|(_, b)| b).sum()
    }
}

/// Analyzes one VM of a snapshot.
pub fn analyze_vm(heap: &dyn VmHeap, vm: LuaHeap, copy: LuaHeapCopy) -> HeapReport {
    let mut objects = heap.census();
    // A live copy may list an object twice (moved between lists while copied).
    let mut at: FxHashMap<u64, usize> = FxHashMap::default();
    objects.retain(|o| at.insert(o.addr, 0).is_none());
    for (i, o) in objects.iter().enumerate() {
        at.insert(o.addr, i);
    }
    let mut node_of: Vec<Option<u32>> = vec![None; objects.len()];
    let mut paths = PathTree::new();
    let mut queue = VecDeque::new();
    let mut refs = Vec::new();
    let mut lookup = |addr: u64, objects: &mut Vec<Object>, node_of: &mut Vec<Option<u32>>| {
        if let Some(&i) = at.get(&addr) {
            return Some(i);
        }
        let o = heap.object_at(addr)?;
        objects.push(o);
        node_of.push(None);
        at.insert(addr, objects.len() - 1);
        Some(objects.len() - 1)
    };
    let mut modules = None;
    for (name, addr) in heap.roots() {
        let Some(i) = lookup(addr, &mut objects, &mut node_of) else {
            continue;
        };
        if node_of[i].is_none() {
            if name == "package.loaded" {
                modules = Some(i);
            }
            node_of[i] = Some(paths.child(0, name));
            queue.push_back(i);
        }
    }
    while let Some(i) = queue.pop_front() {
        let node = node_of[i].expect("queued objects have a path");
        refs.clear();
        let obj = objects[i];
        heap.refs(&obj, &mut refs);
        for (via, addr) in refs.drain(..) {
            // package.loaded's entries are modules: `package.loaded["app.cache"]`.
            let via = match via {
                Via::Field(name) if modules == Some(i) => Via::Module(name),
                via => via,
            };
            let Some(j) = lookup(addr, &mut objects, &mut node_of) else {
                continue;
            };
            if node_of[j].is_none() && objects[j].kind != Kind::Vm {
                node_of[j] = Some(paths.child(node, via.component()));
                queue.push_back(j);
            }
        }
    }
    let unreachable = paths.child(0, "<unreachable>".into());
    let mut census = Census::new();
    let mut attributed = Vec::with_capacity(objects.len());
    let mut details = FxHashMap::default();
    for (o, node) in objects.into_iter().zip(node_of) {
        if let Some(d) = heap.detail(&o) {
            details.insert(attributed.len(), d);
        }
        let node = node.unwrap_or(match o.kind {
            Kind::Vm => paths.child(0, "<vm>".into()),
            _ => unreachable,
        });
        let n = &mut paths.nodes[node as usize];
        n.bytes += o.size;
        n.count += 1;
        let c = census.entry(o.kind).or_default();
        c.0 += 1;
        c.1 += o.size;
        attributed.push((o, node));
    }
    paths.sum_retained();
    HeapReport {
        vm,
        copy,
        gc_total: heap.gc_total(),
        census,
        objects: attributed,
        details,
        paths,
        unreachable,
        warnings: heap.warnings(),
        stripped: false,
    }
}

/// The heap snapshots of a capture, each VM analyzed (in the capture's order); none when
/// it holds no snapshot.
pub fn read_heaps(capture: &Capture) -> Result<Vec<HeapReport>> {
    let mut vms: Vec<LuaHeap> = Vec::new();
    let mut copies: Vec<LuaHeapCopy> = Vec::new();
    let mut pieces: BTreeMap<(u32, u32), Vec<LuaHeapMemory>> = BTreeMap::new();
    let mut resolved = Vec::new();
    // Chunks inflate in parallel: a 200 MB heap is ~50 of them.
    let chunks: Vec<Vec<Record>> = capture
        .chunks()
        .par_iter()
        .map(|chunk| capture.decode_chunk(chunk).0)
        .collect();
    for records in chunks {
        for r in records {
            match r {
                Record::LuaHeap(h) => vms.push(h),
                Record::LuaHeapCopy(c) => copies.push(c),
                Record::LuaHeapMemory(m) => pieces.entry((m.pid, m.snapshot)).or_default().push(m),
                Record::ResolvedHeap(r) => resolved.push(HeapReport::from_resolved(r)),
                _ => {}
            }
        }
    }
    if !resolved.is_empty() {
        return Ok(resolved);
    }
    for c in copies.iter().filter(|c| !c.errors.is_empty()) {
        for e in &c.errors {
            eprintln!(
                "lanalyze: warning: snapshot {} of {}: {e}",
                c.snapshot, c.pid
            );
        }
    }
    let mut reports = Vec::new();
    let mut memories: BTreeMap<(u32, u32), Memory> = BTreeMap::new();
    for vm in vms {
        let key = (vm.pid, vm.snapshot);
        memories
            .entry(key)
            .or_insert_with(|| Memory::from_pieces(pieces.remove(&key).unwrap_or_default()));
        let copy = copies
            .iter()
            .find(|c| (c.pid, c.snapshot) == key)
            .cloned()
            .unwrap_or_default();
        let memory = &memories[&key];
        let report = match vm.vm.as_str() {
            v if v.starts_with("LuaJIT") => {
                let heap = luajit::Heap::new(memory, &vm)?;
                analyze_vm(&heap, vm, copy)
            }
            v if v.starts_with("Lua 5.") => {
                let heap = puc::Heap::new(memory, &vm)?;
                analyze_vm(&heap, vm, copy)
            }
            other => bail!("the heap of {other} cannot be read by this lanalyze"),
        };
        reports.push(report);
    }
    Ok(reports)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::heap::report::path_rows;

    /// A heap given as objects and their references.
    struct Fake {
        objects: Vec<Object>,
        refs: Vec<(u64, Via, u64)>,
        roots: Vec<(String, u64)>,
    }

    impl VmHeap for Fake {
        fn census(&self) -> Vec<Object> {
            self.objects.clone()
        }
        fn object_at(&self, _: u64) -> Option<Object> {
            None
        }
        fn roots(&self) -> Vec<(String, u64)> {
            self.roots.clone()
        }
        fn refs(&self, obj: &Object, out: &mut Vec<(Via, u64)>) {
            out.extend(
                self.refs
                    .iter()
                    .filter(|(from, _, _)| *from == obj.addr)
                    .map(|(_, via, to)| (via.clone(), *to)),
            );
        }
        fn gc_total(&self) -> u64 {
            1000
        }
        fn warnings(&self) -> Vec<String> {
            Vec::new()
        }
        fn detail(&self, _: &Object) -> Option<Detail> {
            None
        }
    }

    fn obj(addr: u64, kind: Kind, size: u64) -> Object {
        Object { addr, kind, size }
    }

    #[test]
    fn objects_take_their_first_shortest_path() {
        let heap = Fake {
            objects: vec![
                obj(1, Kind::Table, 10),  // package.loaded
                obj(2, Kind::Table, 50),  // _G
                obj(3, Kind::Table, 64),  // the app module, also _G.app
                obj(4, Kind::Table, 40),  // its cache
                obj(5, Kind::String, 30), // two entries
                obj(6, Kind::String, 30),
                obj(7, Kind::String, 20), // garbage
            ],
            refs: vec![
                (1, Via::Field("app.cache".into()), 3),
                (1, Via::Field("_G".into()), 2),
                (2, Via::Field("app".into()), 3),
                (3, Via::Field("items".into()), 4),
                (4, Via::Index, 5),
                (4, Via::Index, 6),
            ],
            roots: vec![("package.loaded".into(), 1), ("_G".into(), 2)],
        };
        let r = analyze_vm(&heap, LuaHeap::default(), LuaHeapCopy::default());
        let path_of = |addr: u64| {
            let (_, node) = r.objects.iter().find(|(o, _)| o.addr == addr).unwrap();
            r.paths.path(*node)
        };
        assert_eq!(path_of(3), r#"package.loaded["app.cache"]"#);
        assert_eq!(path_of(2), "_G", "a root is not claimed through another");
        assert_eq!(path_of(5), r#"package.loaded["app.cache"].items[*]"#);
        assert_eq!(path_of(7), "<unreachable>");
        assert_eq!(r.census_bytes(), 244);
        assert_eq!(r.census[&Kind::String], (3, 80));
        let rows = path_rows(&r.paths);
        assert_eq!(rows[0].path, r#"package.loaded["app.cache"].items"#);
        assert_eq!(
            (rows[0].held, rows[0].objects, rows[0].retained),
            (100, 3, 100)
        );
        let module = rows
            .iter()
            .find(|r| r.path == r#"package.loaded["app.cache"]"#);
        assert_eq!(module.map(|m| (m.held, m.retained)), Some((64, 164)));
    }

    #[test]
    fn keys_are_written_as_in_lua() {
        assert_eq!(Via::Field("cache".into()).component(), ".cache");
        assert_eq!(Via::Field("end".into()).component(), r#"["end"]"#);
        assert_eq!(Via::Field("a b;\"".into()).component(), r#"["a b\59\""]"#);
        assert_eq!(
            Via::Module("resty.core".into()).component(),
            r#"["resty.core"]"#
        );
        assert_eq!(Via::Upvalue("pool".into()).component(), "<upvalue pool>");
        assert_eq!(Via::Value.component(), "");
    }
}
