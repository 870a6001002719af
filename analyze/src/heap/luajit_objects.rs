//! Where a LuaJIT build's objects keep their fields (lj_obj.h, lj_jit.h, lj_ctype.h), as
//! the capture names them (`lrec_inspect::lua::luajit::Offsets`, learned by lrec from the
//! binary); a capture from an lrec that named only some takes the others from
//! lrec-inspect's upstream layout of the same reference size.

use lrec_inspect::lua::luajit::releases::{UPSTREAM_GC32, UPSTREAM_GC64};
use lrec_inspect::lua::luajit::Offsets;
use lrec_inspect::lua::named::ABSENT;

/// Where the fields of each object lie: fixed by GC64 (8-byte references) or GC32.
#[derive(Debug, Clone, Copy)]
pub struct Objects {
    pub refsize: u64,
    pub gct: u64,
    pub tab_size: u64,
    pub tab_colo: u64,
    pub tab_array: u64,
    pub tab_meta: u64,
    pub tab_node: u64,
    pub tab_asize: u64,
    pub tab_hmask: u64,
    pub fn_env: u64,
    pub lfn_uv: u64,
    pub cfn_uv: u64,
    pub uv_size: u64,
    pub uv_closed: u64,
    pub uv_tv: u64,
    pub ud_size: u64,
    pub ud_env: u64,
    pub ud_len: u64,
    pub ud_meta: u64,
    pub cd_size: u64,
    pub cd_ctypeid: u64,
    pub ctype_size: u64,
    pub tr_size: u64,
    pub tr_nsnap: u64,
    pub tr_nins: u64,
    pub tr_nk: u64,
    pub tr_nsnapmap: u64,
    /// sizeof(Node).
    pub node_size: u64,
    /// lua_State.env.
    pub l_env: u64,
}

impl Objects {
    /// The objects' layout the capture names (`named`), GC64 or not.
    pub fn new(named: &[(String, u32)], gc64: bool) -> Objects {
        let reference = if gc64 { UPSTREAM_GC64 } else { UPSTREAM_GC32 };
        let o = Offsets::from_named(named);
        let v = |own: u32, fallback: u32| u64::from(if own == ABSENT { fallback } else { own });
        let r = &reference;
        Objects {
            refsize: if gc64 { 8 } else { 4 },
            gct: if gc64 { 9 } else { 5 },
            tab_size: v(o.tab_size, r.tab_size),
            tab_colo: v(o.tab_colo, r.tab_colo),
            tab_array: v(o.tab_array, r.tab_array),
            tab_meta: v(o.tab_meta, r.tab_meta),
            tab_node: v(o.tab_node, r.tab_node),
            tab_asize: v(o.tab_asize, r.tab_asize),
            tab_hmask: v(o.tab_hmask, r.tab_hmask),
            fn_env: v(o.fn_env, r.fn_env),
            lfn_uv: v(o.lfn_uv, r.lfn_uv),
            cfn_uv: v(o.cfn_uv, r.cfn_uv),
            uv_size: v(o.uv_size, r.uv_size),
            uv_closed: v(o.uv_closed, r.uv_closed),
            uv_tv: v(o.uv_tv, r.uv_tv),
            ud_size: v(o.ud_size, r.ud_size),
            ud_env: v(o.ud_env, r.ud_env),
            ud_len: v(o.ud_len, r.ud_len),
            ud_meta: v(o.ud_meta, r.ud_meta),
            cd_size: v(o.cd_size, r.cd_size),
            cd_ctypeid: v(o.cd_ctypeid, r.cd_ctypeid),
            ctype_size: v(o.ctype_size, r.ctype_size),
            tr_size: v(o.tr_size, r.tr_size),
            tr_nsnap: v(o.tr_nsnap, r.tr_nsnap),
            tr_nins: v(o.tr_nins, r.tr_nins),
            tr_nk: v(o.tr_nk, r.tr_nk),
            tr_nsnapmap: v(o.tr_nsnapmap, r.tr_nsnapmap),
            node_size: v(o.node_size, r.node_size),
            l_env: v(o.l_env, r.l_env),
        }
    }
}
