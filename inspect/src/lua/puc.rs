//! PUC Lua 5.1–5.5's layout: where a build keeps every field lrec's BPF walker, its heap
//! snapshots and lanalyze's heap walker read, by name ([`Offsets`]), and the rules each
//! release follows ([`Rules`]: flags, type tags, how strings are stored). A build's
//! offsets are learned from the binary ([`learn`]: DWARF, the C API's and `luaV_execute`'s
//! machine code); the releases' own layouts ([`releases`]) are cross-checks.

mod capi;
pub mod learn;
pub mod releases;

use crate::lua::named::{named_offsets, ABSENT};

named_offsets! {
    /// A PUC Lua build's offsets (bytes), x86_64. `L.extra` is LUA_EXTRASPACE before a
    /// thread's lua_State; `g.mainthread` is, in 5.5, the main lua_State's place inside
    /// global_State, else the field pointing to it; `*.size0` is a closure's size without
    /// upvalues. `ci.callstatus_size` and `p.lineinfo_size` are field widths.
    pub struct Offsets {
        l_extra = "L.extra",
        l_size = "L.size",
        l_status = "L.status",
        l_top = "L.top",
        l_g = "L.G",
        l_ci = "L.ci",
        l_stack = "L.stack",
        l_stacksize = "L.stacksize",
        l_openupval = "L.openupval",
        l_errorjmp = "L.errorJmp",
        l_base_ci = "L.base_ci",
        l_savedpc = "L.savedpc",
        l_nci = "L.nci",
        l_gt = "L.gt",
        g_frealloc = "g.frealloc",
        g_strt = "g.strt",
        g_registry = "g.registry",
        g_mainthread = "g.mainthread",
        g_allgc = "g.allgc",
        g_finobj = "g.finobj",
        g_tobefnz = "g.tobefnz",
        g_fixedgc = "g.fixedgc",
        g_tmudata = "g.tmudata",
        g_totalbytes = "g.totalbytes",
        g_debt = "g.GCdebt",
        g_buffsize = "g.buffsize",
        g_size = "g.size",
        ci_func = "ci.func",
        ci_previous = "ci.previous",
        ci_savedpc = "ci.savedpc",
        ci_callstatus = "ci.callstatus",
        ci_callstatus_size = "ci.callstatus_size",
        ci_tailcalls = "ci.tailcalls",
        ci_size = "ci.size",
        cl_isc = "cl.isC",
        cl_nupvalues = "cl.nupvalues",
        cl_env = "cl.env",
        lcl_p = "lcl.p",
        lcl_size0 = "lcl.size0",
        lcl_upvals = "lcl.upvals",
        ccl_f = "ccl.f",
        ccl_size0 = "ccl.size0",
        ccl_upvalue = "ccl.upvalue",
        t_flags = "t.flags",
        t_lsizenode = "t.lsizenode",
        t_sizearray = "t.sizearray",
        t_array = "t.array",
        t_node = "t.node",
        t_lastfree = "t.lastfree",
        t_meta = "t.metatable",
        t_size = "t.size",
        node_key = "node.key",
        node_key_tt = "node.key_tt",
        node_size = "node.size",
        uv_v = "uv.v",
        uv_value = "uv.value",
        uv_next = "uv.next",
        uv_size = "uv.size",
        ud_nuvalue = "ud.nuvalue",
        ud_env = "ud.env",
        ud_uvtag = "ud.uvtag",
        ud_size0 = "ud.size0",
        ud_len = "ud.len",
        ud_meta = "ud.metatable",
        ud_uv = "ud.uv",
        p_numparams = "p.numparams",
        p_is_vararg = "p.is_vararg",
        p_flag = "p.flag",
        p_k = "p.k",
        p_sizek = "p.sizek",
        p_code = "p.code",
        p_sizecode = "p.sizecode",
        p_p = "p.p",
        p_sizep = "p.sizep",
        p_upvalues = "p.upvalues",
        p_sizeupvalues = "p.sizeupvalues",
        p_lineinfo = "p.lineinfo",
        p_sizelineinfo = "p.sizelineinfo",
        p_abslineinfo = "p.abslineinfo",
        p_sizeabslineinfo = "p.sizeabslineinfo",
        p_locvars = "p.locvars",
        p_sizelocvars = "p.sizelocvars",
        p_source = "p.source",
        p_linedefined = "p.linedefined",
        p_lastlinedefined = "p.lastlinedefined",
        p_size = "p.size",
        p_lineinfo_size = "p.lineinfo_size",
        p_upvaldesc_size = "p.upvaldesc_size",
        s_shrlen = "s.shrlen",
        s_len = "s.len",
        s_hnext = "s.hnext",
        s_data = "s.data",
    }
}

/// How a release stores a string's length and text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strings {
    /// 5.1–5.2: one length field, the text right after the header.
    Len,
    /// 5.3–5.4: short strings' length in a byte, long ones' in `lnglen`.
    ShortLong,
    /// 5.5: a negative short length marks long strings, whose text is a pointer.
    V55,
}

/// Where one `luaV_execute` frame's run of Lua frames begins (see ebpf/puc.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreshRule {
    /// A CallInfo flag (`CIST_FRESH`) marks the frame entered by a fresh `luaV_execute`.
    Fresh,
    /// 5.2, 5.3.0–1: `CIST_REENTRY` marks the others.
    Reentry,
    /// 5.4.0–1: every Lua call recurses into `luaV_execute`.
    All,
    /// 5.1: derived from the calling instruction.
    Opcode,
}

/// What a release does, as opposed to where it keeps things: fixed by its sources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// 501 … 505.
    pub version: u32,
    pub fresh: FreshRule,
    pub cist_fresh: u32,
    pub cist_tail: u32,
    pub strings: Strings,
    /// Type tags as a TValue holds them: Lua closure, C closure, light C function, thread.
    pub tag_lcl: u32,
    pub tag_ccl: u32,
    pub tag_lcf: u32,
    pub tag_thread: u32,
    /// 5.1: OP_CALL and OP_TAILCALL.
    pub op_call: u32,
    pub op_tailcall: u32,
}

/// A PUC Lua build's layout: its release's rules, its offsets, and where they came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// A release's name (`lua-5.4.3-9`), or how the layout was learned.
    pub name: String,
    pub rules: Rules,
    pub offsets: Offsets,
}

impl Layout {
    pub fn minor(&self) -> u32 {
        self.rules.version % 100
    }
}

impl Offsets {
    /// The fields the BPF walker reads that are not known (none: it can walk).
    pub fn missing_for_walk(&self, version: u32) -> Vec<&'static str> {
        let mut needed = vec![
            ("L.G", self.l_g),
            ("L.ci", self.l_ci),
            ("L.status", self.l_status),
            ("L.base_ci", self.l_base_ci),
            ("L.errorJmp", self.l_errorjmp),
            ("g.mainthread", self.g_mainthread),
            ("ci.func", self.ci_func),
            ("ci.savedpc", self.ci_savedpc),
            ("lcl.p", self.lcl_p),
            ("ccl.f", self.ccl_f),
            ("ccl.upvalue", self.ccl_upvalue),
            ("p.source", self.p_source),
            ("p.linedefined", self.p_linedefined),
            ("p.lastlinedefined", self.p_lastlinedefined),
            ("p.code", self.p_code),
            ("p.sizecode", self.p_sizecode),
            ("p.lineinfo", self.p_lineinfo),
            ("p.sizelineinfo", self.p_sizelineinfo),
            ("s.len", self.s_len),
            ("s.data", self.s_data),
        ];
        if version == 501 {
            // CallInfos are an array: their size is the walk's step.
            needed.extend([
                ("L.savedpc", self.l_savedpc),
                ("cl.isC", self.cl_isc),
                ("ci.size", self.ci_size),
            ]);
        } else {
            needed.extend([
                ("ci.previous", self.ci_previous),
                ("ci.callstatus", self.ci_callstatus),
            ]);
        }
        if version >= 503 {
            needed.push(("s.shrlen", self.s_shrlen));
        }
        if version >= 504 {
            needed.extend([
                ("p.abslineinfo", self.p_abslineinfo),
                ("p.sizeabslineinfo", self.p_sizeabslineinfo),
            ]);
        }
        needed
            .into_iter()
            .filter(|(_, v)| *v == ABSENT)
            .map(|(k, _)| k)
            .collect()
    }
}
