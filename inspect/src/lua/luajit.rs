//! LuaJIT 2.1's layout: where a build keeps every field lrec's BPF walker, its heap
//! snapshots and lanalyze's heap walker read, by name ([`Offsets`]). A build's layout is
//! learned from the binary ([`learn`]: the VM's own machine code, the C API's, DWARF);
//! the layouts of the builds lrec was tested on ([`releases`]) are cross-checks.

mod capi;
pub mod learn;
pub mod releases;
mod vm_code;

use crate::lua::named::{named_offsets, ABSENT};

named_offsets! {
    /// A LuaJIT build's offsets (bytes), x86_64, GC64 or not (`gc64`). `J.trace` is
    /// from G to `jit_State.trace`; `cf.*` are from a C frame (the VM's native frame) and
    /// `cf.size` is CFRAME_SIZE; `str.data` is where a string's text begins.
    pub struct Offsets {
        gc64 = "gc64",
        g2disp = "g2disp",
        g_vmstate = "g.vmstate",
        g_mainthref = "g.mainthref",
        g_cur_l = "g.cur_L",
        g_jit_base = "g.jit_base",
        g_ctype_state = "g.ctype_state",
        j_trace = "J.trace",
        l_glref = "L.glref",
        l_status = "L.status",
        l_base = "L.base",
        l_top = "L.top",
        l_maxstack = "L.maxstack",
        l_stack = "L.stack",
        l_env = "L.env",
        l_cframe = "L.cframe",
        l_size = "L.size",
        cf_size = "cf.size",
        cf_l = "cf.L",
        cf_pc = "cf.pc",
        cf_prev = "cf.prev",
        cf_nres = "cf.nres",
        fn_ffid = "fn.ffid",
        fn_pc = "fn.pc",
        fn_f = "fn.f",
        fn_env = "fn.env",
        lfn_uv = "lfn.uv",
        cfn_uv = "cfn.uv",
        pt_size = "pt.size",
        pt_numparams = "pt.numparams",
        pt_framesize = "pt.framesize",
        pt_sizebc = "pt.sizebc",
        pt_k = "pt.k",
        pt_sizept = "pt.sizept",
        pt_flags = "pt.flags",
        pt_chunkname = "pt.chunkname",
        pt_firstline = "pt.firstline",
        pt_numline = "pt.numline",
        pt_lineinfo = "pt.lineinfo",
        pt_uvinfo = "pt.uvinfo",
        pt_varinfo = "pt.varinfo",
        str_hash = "str.hash",
        str_len = "str.len",
        str_data = "str.data",
        tr_size = "tr.size",
        tr_nsnap = "tr.nsnap",
        tr_nins = "tr.nins",
        tr_ir = "tr.ir",
        tr_nk = "tr.nk",
        tr_snap = "tr.snap",
        tr_snapmap = "tr.snapmap",
        tr_nsnapmap = "tr.nsnapmap",
        tr_szmcode = "tr.szmcode",
        tr_mcode = "tr.mcode",
        tr_traceno = "tr.traceno",
        cts_cb_stack = "cts.cb_stack",
        tab_size = "tab.size",
        tab_colo = "tab.colo",
        tab_array = "tab.array",
        tab_meta = "tab.meta",
        tab_node = "tab.node",
        tab_asize = "tab.asize",
        tab_hmask = "tab.hmask",
        node_size = "node.size",
        uv_size = "uv.size",
        uv_closed = "uv.closed",
        uv_tv = "uv.tv",
        ud_size = "ud.size",
        ud_env = "ud.env",
        ud_len = "ud.len",
        ud_meta = "ud.meta",
        cd_size = "cd.size",
        cd_ctypeid = "cd.ctypeid",
        ctype_size = "ctype.size",
    }
}

/// Which fork's built-in (fast) functions a build has, in ffid order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Builtins {
    Upstream,
    /// OpenResty's luajit2, which adds a few (`thread.exdata`, `table.isempty`, …).
    OpenResty,
}

/// A LuaJIT build's layout: its offsets, its built-in functions, and where they came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// A known build's name, or how the layout was learned (`learned: VM code, C API`).
    pub name: String,
    pub offsets: Offsets,
    pub builtins: Builtins,
}

/// GCHeader.gct of a function, a prototype and a string (`~LJ_TFUNC`, …): the same in
/// every LuaJIT 2.1 build, as are the constants below (lj_obj.h, lj_frame.h).
pub const GCT_FUNC: u8 = 8;
pub const GCT_PROTO: u8 = 7;
pub const GCT_STR: u8 = 4;
/// The pointer in a GC64 build's tagged value or frame slot (LJ_GCVMASK).
pub const GCVMASK: u64 = (1 << 47) - 1;
/// A frame's type, the low 2 bits of its link: a frame a Lua function's call made has
/// FRAME_LUA, its link the call's return PC; with the low 3 bits, FRAME_CONT is a frame
/// (a metamethod) the VM called from a Lua function's instruction.
pub const FRAME_LUA: u64 = 0;
pub const FRAME_CONT: u64 = 2;

impl Offsets {
    pub fn is_gc64(&self) -> bool {
        self.gc64 != 0
    }

    /// Bytes of a GCRef or MRef: 64 bits in GC64 builds, 32 bits otherwise.
    pub fn ref_size(&self) -> u64 {
        if self.is_gc64() {
            8
        } else {
            4
        }
    }

    /// Where a GC object's type byte (GCHeader.gct) lies in it.
    pub fn gct(&self) -> u64 {
        if self.is_gc64() {
            9
        } else {
            5
        }
    }

    /// The fields the BPF walker reads that are not known (none: it can walk).
    pub fn missing_for_walk(&self) -> Vec<&'static str> {
        let needed = [
            ("g2disp", self.g2disp),
            ("g.vmstate", self.g_vmstate),
            ("g.cur_L", self.g_cur_l),
            ("L.glref", self.l_glref),
            ("L.base", self.l_base),
            ("L.stack", self.l_stack),
            ("L.cframe", self.l_cframe),
            ("L.maxstack", self.l_maxstack),
            ("cf.size", self.cf_size),
            ("cf.L", self.cf_l),
            ("cf.pc", self.cf_pc),
            ("cf.prev", self.cf_prev),
            ("cf.nres", self.cf_nres),
            ("fn.ffid", self.fn_ffid),
            ("fn.pc", self.fn_pc),
            ("fn.f", self.fn_f),
            ("pt.size", self.pt_size),
            ("pt.sizebc", self.pt_sizebc),
            ("pt.chunkname", self.pt_chunkname),
            ("pt.firstline", self.pt_firstline),
            ("pt.numline", self.pt_numline),
            ("pt.lineinfo", self.pt_lineinfo),
            ("str.hash", self.str_hash),
            ("str.len", self.str_len),
            ("str.data", self.str_data),
        ];
        needed
            .into_iter()
            .filter(|(_, v)| *v == ABSENT)
            .map(|(k, _)| k)
            .collect()
    }
}
