//! The layouts of the LuaJIT builds lrec was tested on, x86_64: measured by compiling
//! each build's headers (offsetof, sizeof) and checked on the running VMs. They are not
//! how a binary's layout is found (that is learned from the binary, [`super::learn`]):
//! they tell which known build a learned layout is, give the fields no code reads their
//! place between fields that are proved, and serve tests.

use super::{Builtins, Layout, Offsets};
use crate::lua::named::ABSENT;

/// Upstream LuaJIT 2.1 (luajit-src 210.7.4, 2024–2025), GC64.
pub const UPSTREAM_GC64: Offsets = Offsets {
    gc64: 1,
    g2disp: 4000,
    g_vmstate: 184,
    g_mainthref: 192,
    g_cur_l: 376,
    g_jit_base: 384,
    g_ctype_state: 392,
    j_trace: 1128,
    l_glref: 16,
    l_status: 11,
    l_base: 32,
    l_top: 40,
    l_maxstack: 48,
    l_stack: 56,
    l_env: 72,
    l_cframe: 80,
    l_size: 96,
    cf_size: 80,
    cf_l: 16,
    cf_pc: 24,
    cf_prev: 32,
    cf_nres: 8,
    fn_ffid: 10,
    fn_pc: 32,
    fn_f: 40,
    fn_env: 16,
    lfn_uv: 40,
    cfn_uv: 48,
    pt_size: 104,
    pt_numparams: 10,
    pt_framesize: 11,
    pt_sizebc: 12,
    pt_k: 32,
    pt_sizept: 56,
    pt_flags: 61,
    pt_chunkname: 64,
    pt_firstline: 72,
    pt_numline: 76,
    pt_lineinfo: 80,
    pt_uvinfo: 88,
    pt_varinfo: 96,
    str_hash: 12,
    str_len: 20,
    str_data: 24,
    tr_size: 120,
    tr_nsnap: 10,
    tr_nins: 12,
    tr_ir: 32,
    tr_nk: 40,
    tr_snap: 48,
    tr_snapmap: 56,
    tr_nsnapmap: 44,
    tr_szmcode: 84,
    tr_mcode: 88,
    tr_traceno: 104,
    cts_cb_stack: 168,
    tab_size: 64,
    tab_colo: 11,
    tab_array: 16,
    tab_meta: 32,
    tab_node: 40,
    tab_asize: 48,
    tab_hmask: 52,
    node_size: 24,
    uv_size: 48,
    uv_closed: 10,
    uv_tv: 16,
    ud_size: 48,
    ud_env: 16,
    ud_len: 24,
    ud_meta: 32,
    cd_size: 16,
    cd_ctypeid: 10,
    ctype_size: 24,
};

/// Upstream LuaJIT 2.1 built with LUAJIT_DISABLE_GC64 (32-bit references).
pub const UPSTREAM_GC32: Offsets = Offsets {
    gc64: 0,
    g2disp: 3208,
    g_vmstate: 136,
    g_mainthref: 140,
    g_cur_l: 296,
    g_jit_base: 300,
    g_ctype_state: 304,
    j_trace: 864,
    l_glref: 8,
    l_status: 7,
    l_base: 16,
    l_top: 24,
    l_maxstack: 32,
    l_stack: 36,
    l_env: 44,
    l_cframe: 48,
    l_size: 64,
    cf_size: 80,
    cf_l: 24,
    cf_pc: 28,
    cf_prev: 32,
    cf_nres: 16,
    fn_ffid: 6,
    fn_pc: 16,
    fn_f: 24,
    fn_env: 8,
    lfn_uv: 20,
    cfn_uv: 32,
    pt_size: 64,
    pt_numparams: 6,
    pt_framesize: 7,
    pt_sizebc: 8,
    pt_k: 16,
    pt_sizept: 32,
    pt_flags: 37,
    pt_chunkname: 40,
    pt_firstline: 44,
    pt_numline: 48,
    pt_lineinfo: 52,
    pt_uvinfo: 56,
    pt_varinfo: 60,
    str_hash: 8,
    str_len: 16,
    str_data: 20,
    tr_size: 96,
    tr_nsnap: 6,
    tr_nins: 8,
    tr_ir: 16,
    tr_nk: 24,
    tr_snap: 32,
    tr_snapmap: 40,
    tr_nsnapmap: 28,
    tr_szmcode: 60,
    tr_mcode: 64,
    tr_traceno: 80,
    cts_cb_stack: 168,
    tab_size: 32,
    tab_colo: 7,
    tab_array: 8,
    tab_meta: 16,
    tab_node: 20,
    tab_asize: 24,
    tab_hmask: 28,
    node_size: 24,
    uv_size: 24,
    uv_closed: 6,
    uv_tv: 8,
    ud_size: 24,
    ud_env: 8,
    ud_len: 12,
    ud_meta: 16,
    cd_size: 8,
    cd_ctypeid: 6,
    ctype_size: 16,
};

/// A build that differs from `base` in where G, the current state and the JIT base lie
/// (and the FFI callback state of OpenResty's fork); what it does not say is unknown.
const fn variant(base: Offsets, g2disp: u32, cur_l: u32, jit_base: u32, cb_stack: u32) -> Offsets {
    let mut o = base;
    o.g2disp = g2disp;
    o.g_cur_l = cur_l;
    o.g_jit_base = jit_base;
    o.g_ctype_state = jit_base + if base.gc64 != 0 { 8 } else { 4 };
    o.j_trace = ABSENT;
    o.l_size = ABSENT;
    o.cts_cb_stack = cb_stack;
    o
}

/// Before 2023, strings had no id: their hash came first and their text earlier (not
/// measured here: unknown).
const fn before_string_ids(base: Offsets) -> Offsets {
    let mut o = base;
    o.str_hash = ABSENT;
    o.str_len = ABSENT;
    o.str_data = ABSENT;
    o
}

/// The builds known: name, offsets, built-in functions.
pub const KNOWN: &[(&str, Offsets, Builtins)] = &[
    ("upstream-gc64", UPSTREAM_GC64, Builtins::Upstream),
    ("upstream-gc32", UPSTREAM_GC32, Builtins::Upstream),
    // OpenResty's luajit2 (Debian's 2.1-20230119): no vmthref, saved_jit_base and exdata.
    (
        "openresty-gc64",
        variant(UPSTREAM_GC64, 4008, 368, 376, 216),
        Builtins::OpenResty,
    ),
    (
        "openresty-gc32",
        variant(UPSTREAM_GC32, 3216, 288, 292, 216),
        Builtins::OpenResty,
    ),
    // Upstream as of 2022 (Debian's luajit 2.1.0~beta3+git20220320).
    (
        "upstream-2022-gc64",
        before_string_ids(variant(UPSTREAM_GC64, 3968, 368, 376, 176)),
        Builtins::Upstream,
    ),
    (
        "upstream-2022-gc32",
        before_string_ids(variant(UPSTREAM_GC32, 3176, 288, 292, 176)),
        Builtins::Upstream,
    ),
];

/// The known build `name`, as a layout.
pub fn known(name: &str) -> Option<Layout> {
    KNOWN
        .iter()
        .find(|(n, ..)| *n == name)
        .map(|(n, o, b)| Layout {
            name: n.to_string(),
            offsets: *o,
            builtins: *b,
        })
}
