//! A heap report as a stripped capture keeps it ([`ResolvedHeap`]): census and paths,
//! without the memory or the objects.

use lrec_format::{HeapKind, HeapPath, LuaHeap, ResolvedHeap};

use super::{Census, HeapReport, Kind, PathNode, PathTree};

const KINDS: [Kind; 10] = [
    Kind::Table,
    Kind::String,
    Kind::Function,
    Kind::Upvalue,
    Kind::Userdata,
    Kind::Cdata,
    Kind::Thread,
    Kind::Proto,
    Kind::Trace,
    Kind::Vm,
];

impl HeapReport {
    /// What `--strip` keeps of this report.
    pub fn to_resolved(&self) -> ResolvedHeap {
        ResolvedHeap {
            vm: LuaHeap {
                offsets: Vec::new(),
                ..self.vm.clone()
            },
            copy: self.copy.clone(),
            gc_total: self.gc_total,
            census: (self.census.iter())
                .map(|(kind, &(objects, bytes))| HeapKind {
                    kind: kind.name().into(),
                    objects,
                    bytes,
                })
                .collect(),
            paths: (self.paths.nodes.iter())
                .map(|n| HeapPath {
                    parent: n.parent.unwrap_or(0),
                    component: n.component.clone(),
                    bytes: n.bytes,
                    objects: n.count,
                })
                .collect(),
            unreachable: self.unreachable,
            warnings: self.warnings.clone(),
        }
    }

    /// The report a stripped capture keeps: no objects.
    pub fn from_resolved(r: ResolvedHeap) -> HeapReport {
        let mut census = Census::new();
        for k in r.census {
            if let Some(kind) = KINDS.iter().find(|c| c.name() == k.kind) {
                census.insert(*kind, (k.objects, k.bytes));
            }
        }
        let mut paths = PathTree::new();
        let last = r.paths.len().saturating_sub(1) as u32;
        for (i, p) in r.paths.into_iter().enumerate().skip(1) {
            // A parent always precedes its children; a damaged record's do not count.
            let parent = p.parent.min(i as u32 - 1);
            paths.nodes.push(PathNode {
                parent: Some(parent),
                component: p.component,
                bytes: p.bytes,
                count: p.objects,
                ..PathNode::default()
            });
            paths.nodes[parent as usize].children.push(i as u32);
        }
        paths.sum_retained();
        HeapReport {
            vm: r.vm,
            copy: r.copy,
            gc_total: r.gc_total,
            census,
            objects: Vec::new(),
            details: Default::default(),
            paths,
            unreachable: r.unreachable.min(last),
            warnings: r.warnings,
            stripped: true,
        }
    }
}
