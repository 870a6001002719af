//! Records of a Lua heap snapshot (`lrec --lua-heap`): the memory a process's Lua VMs
//! keep their objects in, copied raw, and where each VM's state lies in it and how it is
//! laid out. lanalyze walks the objects offline (`lanalyze --heap`).

use serde::{Deserialize, Serialize};

/// Bytes of process memory in one [`LuaHeapMemory`] record at most.
pub const HEAP_PIECE: usize = 4 << 20;

/// One Lua VM of a snapshot: its global state and the layout to read it with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct LuaHeap {
    pub pid: u32,
    /// Which snapshot of the capture (0, 1, … : one per `--lua-heap` or SIGUSR1).
    pub snapshot: u32,
    /// `LuaJIT 2.1`, `Lua 5.4`, …
    pub vm: String,
    /// The layout it was read with (`upstream-gc64`, …).
    pub layout: String,
    /// The address of the VM's `global_State`.
    pub g: u64,
    /// Offsets of the fields the heap walker reads, by name (`g.vmstate`, `L.stack`, …).
    pub offsets: Vec<(String, u32)>,
    /// Nanoseconds since the recording started (CLOCK_MONOTONIC, as sample times).
    pub time_ns: u64,
}

/// What taking one process's snapshot cost and how complete it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct LuaHeapCopy {
    pub pid: u32,
    pub snapshot: u32,
    /// Whether every thread was stopped while the memory was copied (`--freeze`), and
    /// for how long.
    pub frozen: bool,
    pub stopped_ns: u64,
    /// The copy's duration.
    pub copy_ns: u64,
    /// Bytes copied, and bytes of the regions that could not be read (zeros in the copy).
    pub bytes: u64,
    pub unreadable: u64,
    /// Regions left out because the copy reached its bound (`--lua-heap-max`).
    pub skipped: u64,
    /// Lua VMs the process holds whose state could not be found in the copy, and why.
    pub errors: Vec<String>,
}

/// A piece of a process's writable memory, copied raw (at most [`HEAP_PIECE`] bytes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct LuaHeapMemory {
    pub pid: u32,
    pub snapshot: u32,
    pub start: u64,
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

/// A Lua VM's heap as `lanalyze --strip` keeps it: the census and the paths, not the
/// memory (nor the objects, nor any string's bytes but the path's keys).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ResolvedHeap {
    /// The VM (its offsets dropped).
    pub vm: LuaHeap,
    pub copy: LuaHeapCopy,
    /// The collector's own count of its bytes.
    pub gc_total: u64,
    /// Objects and bytes per type (`table`, `string`, …).
    pub census: Vec<HeapKind>,
    /// The path tree: node 0 is the empty path above the roots; each node names its
    /// parent (an earlier node) and the component it adds.
    pub paths: Vec<HeapPath>,
    /// The node of the objects no root reaches.
    pub unreachable: u32,
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct HeapKind {
    pub kind: String,
    pub objects: u64,
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct HeapPath {
    pub parent: u32,
    pub component: String,
    /// Bytes and objects attributed to this path itself.
    pub bytes: u64,
    pub objects: u64,
}
