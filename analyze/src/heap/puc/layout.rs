//! What the heap walker ([`super`]) reads of a PUC Lua build, from the offsets the capture
//! carries by name (`lrec_inspect::lua::puc::Offsets`, learned by lrec from the binary);
//! a capture from an lrec that wrote none takes its release's layout from lrec-inspect.

use anyhow::{bail, Result};
use lrec_inspect::lua::named::ABSENT;
use lrec_inspect::lua::puc::{releases, Offsets};

/// The offsets the walker reads, as u64 (absent ones as None).
pub struct Release {
    pub minor: u32,
    // global_State
    pub g_strt: u64,
    pub g_registry: u64,
    pub g_mainthread: u64,
    /// The object lists (5.1: rootgc; then allgc, finobj, tobefnz, fixedgc).
    pub g_lists: Vec<u64>,
    /// 5.1: tmudata, a ring.
    pub g_ring: Option<u64>,
    pub g_totalbytes: u64,
    /// 5.2+: GCdebt, added to totalbytes.
    pub g_debt: Option<u64>,
    /// The concatenation buffer's size (Mbuffer.buffsize), 5.1–5.2.
    pub g_buffsize: Option<u64>,
    pub g_size: u64,
    // lua_State
    pub extra: u64,
    pub l_size: u64,
    pub l_g: u64,
    pub l_top: u64,
    pub l_stack: u64,
    /// 5.1–5.3: stacksize (int); 5.4: stack_last.
    pub l_stacksize: u64,
    pub l_openupval: u64,
    /// 5.1: size_ci (int) and the CallInfo array; 5.2: base_ci (its `next` chain);
    /// 5.3–5.4: nci (u16).
    pub l_ci_count: u64,
    pub ci_size: u64,
    /// 5.1: l_gt, the globals.
    pub l_gt: Option<u64>,
    // Table
    pub t_size: u64,
    pub t_sizearray: u64,
    pub t_array: u64,
    pub t_node: u64,
    pub t_lastfree: u64,
    pub t_meta: u64,
    pub node_size: u64,
    pub node_key: u64,
    pub node_key_tt: u64,
    // Closures: size = base + step * nupvalues; the upvalues' offset.
    pub lcl_base: u64,
    pub lcl_p: u64,
    pub lcl_uv: u64,
    pub ccl_base: u64,
    pub ccl_uv: u64,
    /// 5.1: a closure's env.
    pub cl_env: Option<u64>,
    // UpVal: its size, `v`, and the value it holds once closed.
    pub uv_size: u64,
    pub uv_v: u64,
    pub uv_value: u64,
    /// 5.3: open upvalues chain through u.open.next (5.1, 5.2: `next`).
    pub uv_next: u64,
    // Udata
    pub ud_meta: u64,
    pub ud_len: u64,
    /// 5.4+: where the user values begin (offsetof(Udata, uv)).
    pub ud_uv: u64,
    // Proto
    pub pt_size: u64,
    pub pt_source: u64,
    pub pt_linedefined: u64,
    pub pt_k: u64,
    pub pt_p: u64,
    pub pt_locvars: u64,
    pub pt_upvalues: u64,
    pub pt_sizek: u64,
    pub pt_sizecode: u64,
    pub pt_sizep: u64,
    pub pt_sizelineinfo: u64,
    pub pt_sizeabslineinfo: Option<u64>,
    pub pt_sizelocvars: u64,
    pub pt_sizeupvalues: u64,
    pub lineinfo_size: u64,
    pub upvaldesc_size: u64,
    // TString: length (5.1–5.2 size_t; 5.3+ short: u8 shrlen, long: lnglen), data, chain.
    pub s_len: u64,
    pub s_shrlen: Option<u64>,
    pub s_data: u64,
    pub s_chain: u64,
    /// Closure.nupvalues, Udata.nuvalue (5.4+) and the user data's header size, Table's
    /// flags and lsizenode, Proto.flag (5.5).
    pub cl_nupvalues: u64,
    pub ud_nuvalue: Option<u64>,
    pub ud_size0: u64,
    pub t_flags: u64,
    pub t_lsizenode: u64,
    pub pt_flag: Option<u64>,
    /// 5.1: Closure.isC; 5.1–5.2 Udata.env, 5.3 its user value and that value's tag.
    pub cl_isc: Option<u64>,
    pub ud_env: Option<u64>,
    pub ud_uvtag: Option<u64>,
}

impl Release {
    /// The layout of minor release 5.`minor` as a capture names it (`named`), or, when it
    /// names none (an older lrec), its release's.
    pub fn new(minor: u32, named: &[(String, u32)]) -> Result<Release> {
        let o = match named.is_empty() {
            false => Offsets::from_named(named),
            true => match releases::RELEASES.iter().rev().find(|r| r.minor == minor) {
                Some(r) => r.offsets,
                None => {
                    bail!("the heap of Lua 5.{minor} cannot be read by this lanalyze (5.1–5.5 can)")
                }
            },
        };
        let opt = |v: u32| (v != ABSENT).then_some(u64::from(v));
        let mut missing = Vec::new();
        let mut need = |name: &'static str, v: u32| -> u64 {
            if v == ABSENT {
                missing.push(name);
            }
            u64::from(v)
        };
        let r = Release {
            minor,
            g_strt: need("g.strt", o.g_strt),
            g_registry: need("g.registry", o.g_registry),
            g_mainthread: need("g.mainthread", o.g_mainthread),
            g_lists: [o.g_allgc, o.g_finobj, o.g_tobefnz, o.g_fixedgc]
                .into_iter()
                .filter(|&v| v != ABSENT)
                .map(u64::from)
                .collect(),
            g_ring: opt(o.g_tmudata),
            g_totalbytes: need("g.totalbytes", o.g_totalbytes),
            g_debt: opt(o.g_debt),
            g_buffsize: opt(o.g_buffsize),
            g_size: need("g.size", o.g_size),
            extra: need("L.extra", o.l_extra),
            l_size: need("L.size", o.l_size),
            l_g: need("L.G", o.l_g),
            l_top: need("L.top", o.l_top),
            l_stack: need("L.stack", o.l_stack),
            l_stacksize: need("L.stacksize", o.l_stacksize),
            l_openupval: need("L.openupval", o.l_openupval),
            // 5.2 counts its CallInfos along base_ci's `next` chain.
            l_ci_count: match minor {
                2 => need("L.base_ci", o.l_base_ci),
                _ => need("L.nci", o.l_nci),
            },
            ci_size: need("ci.size", o.ci_size),
            l_gt: opt(o.l_gt),
            t_size: need("t.size", o.t_size),
            t_sizearray: need("t.sizearray", o.t_sizearray),
            t_array: need("t.array", o.t_array),
            t_node: need("t.node", o.t_node),
            t_lastfree: opt(o.t_lastfree).unwrap_or(0),
            t_meta: need("t.metatable", o.t_meta),
            node_size: need("node.size", o.node_size),
            node_key: need("node.key", o.node_key),
            node_key_tt: need("node.key_tt", o.node_key_tt),
            lcl_base: need("lcl.size0", o.lcl_size0),
            lcl_p: need("lcl.p", o.lcl_p),
            lcl_uv: need("lcl.upvals", o.lcl_upvals),
            ccl_base: need("ccl.size0", o.ccl_size0),
            ccl_uv: need("ccl.upvalue", o.ccl_upvalue),
            cl_env: opt(o.cl_env),
            uv_size: need("uv.size", o.uv_size),
            uv_v: need("uv.v", o.uv_v),
            uv_value: need("uv.value", o.uv_value),
            uv_next: need("uv.next", o.uv_next),
            ud_meta: need("ud.metatable", o.ud_meta),
            ud_len: need("ud.len", o.ud_len),
            ud_uv: opt(o.ud_uv).unwrap_or(0),
            pt_size: need("p.size", o.p_size),
            pt_source: need("p.source", o.p_source),
            pt_linedefined: need("p.linedefined", o.p_linedefined),
            pt_k: need("p.k", o.p_k),
            pt_p: need("p.p", o.p_p),
            pt_locvars: need("p.locvars", o.p_locvars),
            pt_upvalues: need("p.upvalues", o.p_upvalues),
            pt_sizek: need("p.sizek", o.p_sizek),
            pt_sizecode: need("p.sizecode", o.p_sizecode),
            pt_sizep: need("p.sizep", o.p_sizep),
            pt_sizelineinfo: need("p.sizelineinfo", o.p_sizelineinfo),
            pt_sizeabslineinfo: opt(o.p_sizeabslineinfo),
            pt_sizelocvars: need("p.sizelocvars", o.p_sizelocvars),
            pt_sizeupvalues: need("p.sizeupvalues", o.p_sizeupvalues),
            lineinfo_size: need("p.lineinfo_size", o.p_lineinfo_size),
            upvaldesc_size: need("p.upvaldesc_size", o.p_upvaldesc_size),
            s_len: need("s.len", o.s_len),
            s_shrlen: opt(o.s_shrlen),
            s_data: need("s.data", o.s_data),
            s_chain: need("s.hnext", o.s_hnext),
            cl_nupvalues: need("cl.nupvalues", o.cl_nupvalues),
            ud_nuvalue: opt(o.ud_nuvalue),
            ud_size0: need("ud.size0", o.ud_size0),
            t_flags: need("t.flags", o.t_flags),
            t_lsizenode: need("t.lsizenode", o.t_lsizenode),
            pt_flag: opt(o.p_flag),
            cl_isc: opt(o.cl_isc),
            ud_env: opt(o.ud_env),
            ud_uvtag: opt(o.ud_uvtag),
        };
        if !missing.is_empty() {
            bail!(
                "the capture does not say where this Lua 5.{minor} build keeps {} (lrec could \
                 not prove them from the binary): its heap cannot be read",
                missing.join(", ")
            );
        }
        Ok(r)
    }
}
