//! The Lua VM layouts lrec writes into the BPF walkers' maps (`lua_config`, `puc_config`):
//! the Rust mirrors of `struct lrec_lua_config` and `struct lrec_puc_config`, each filled
//! from the one statement of a layout in lrec-inspect.

use lrec_inspect::lua::named::ABSENT;
use lrec_inspect::lua::{luajit, puc};

use super::MAX_LUA_RANGES;

/// `struct lrec_lua_config`: a LuaJIT layout, written into the `lua_config` map.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawLuaConfig {
    pub vm_start: [u64; MAX_LUA_RANGES],
    pub vm_end: [u64; MAX_LUA_RANGES],
    pub gc64: u32,
    pub g2disp: u32,
    pub g_vmstate: u32,
    pub g_cur_l: u32,
    pub g_jit_base: u32,
    pub l_glref: u32,
    pub l_base: u32,
    pub l_stack: u32,
    pub l_cframe: u32,
    pub l_maxstack: u32,
    pub cf_size: u32,
    pub cf_l: u32,
    pub cf_pc: u32,
    pub cf_prev: u32,
    pub cf_nres: u32,
    pub fn_ffid: u32,
    pub fn_pc: u32,
    pub fn_f: u32,
    pub pt_size: u32,
    pub pt_sizebc: u32,
    pub pt_chunkname: u32,
    pub pt_firstline: u32,
    pub pt_lineinfo: u32,
    pub str_len: u32,
    pub str_data: u32,
    pub j_trace: u32,
    pub tr_nsnap: u16,
    pub tr_ir: u16,
    pub tr_snap: u16,
    pub tr_snapmap: u16,
    pub tr_nsnapmap: u16,
    pub tr_szmcode: u16,
    pub tr_mcode: u16,
    pub tr_traceno: u16,
    pub cts_stack: u32,
    pub g_ctype_state: u32,
    pub str_id: u32,
    pub pt_numline: u32,
    /// Derived from the offsets above ([`RawLuaConfig::new`]): the proto fields' span, the
    /// bytes of a lua_State read at once, and where and how many bytes of global_State.
    pub pt_lo: u32,
    pub pt_span: u32,
    pub pad: u32,
    pub lh_size: u32,
    pub gh_lo: u32,
    pub gh_size: u32,
}

impl RawLuaConfig {
    /// The walker's configuration for a LuaJIT layout and the interpreter's mapped ranges
    /// (`code`: start, end), with the trace array at `j_trace` from G (0: not known).
    pub fn new(o: &luajit::Offsets, code: &[(u64, u64)], j_trace: u32) -> RawLuaConfig {
        let mut c = RawLuaConfig {
            gc64: o.gc64,
            g2disp: o.g2disp,
            g_vmstate: o.g_vmstate,
            g_cur_l: o.g_cur_l,
            g_jit_base: o.g_jit_base,
            l_glref: o.l_glref,
            l_base: o.l_base,
            l_stack: o.l_stack,
            l_cframe: o.l_cframe,
            l_maxstack: o.l_maxstack,
            cf_size: o.cf_size,
            cf_l: o.cf_l,
            cf_pc: o.cf_pc,
            cf_prev: o.cf_prev,
            cf_nres: o.cf_nres,
            fn_ffid: o.fn_ffid,
            fn_pc: o.fn_pc,
            fn_f: o.fn_f,
            pt_size: o.pt_size,
            pt_sizebc: o.pt_sizebc,
            pt_chunkname: o.pt_chunkname,
            pt_firstline: o.pt_firstline,
            pt_lineinfo: o.pt_lineinfo,
            str_len: o.str_len,
            str_data: o.str_data,
            j_trace,
            tr_nsnap: o.tr_nsnap as u16,
            tr_ir: o.tr_ir as u16,
            tr_snap: o.tr_snap as u16,
            tr_snapmap: o.tr_snapmap as u16,
            tr_nsnapmap: o.tr_nsnapmap as u16,
            tr_szmcode: o.tr_szmcode as u16,
            tr_mcode: o.tr_mcode as u16,
            tr_traceno: o.tr_traceno as u16,
            // Unknown (a build without the FFI's callbacks known): never an FFI callback.
            cts_stack: if o.cts_cb_stack == ABSENT {
                0
            } else {
                o.cts_cb_stack
            },
            g_ctype_state: if o.g_ctype_state == ABSENT {
                0
            } else {
                o.g_ctype_state
            },
            str_id: o.str_hash,
            pt_numline: o.pt_numline,
            ..RawLuaConfig::default()
        };
        for (i, &(start, end)) in code.iter().take(MAX_LUA_RANGES).enumerate() {
            c.vm_start[i] = start;
            c.vm_end[i] = end;
        }
        c.read_spans()
    }

    /// Fills the read spans the BPF walk reads fields with, once: the proto's key fields
    /// (at most 128 bytes, else the layout is refused), the lua_State fields it reads up to
    /// the last one (at most 128 bytes), and global_State's vmstate, cur_L, jit_base and
    /// ctype_state (at most 256); 0 where the fields lie farther apart (each is then read
    /// alone).
    fn read_spans(mut self) -> Self {
        let pt = [
            self.pt_sizebc,
            self.pt_chunkname,
            self.pt_firstline,
            self.pt_numline,
        ];
        self.pt_lo = pt.into_iter().min().unwrap_or(0);
        self.pt_span = pt.into_iter().max().unwrap_or(0) + 8 - self.pt_lo;
        let l_last = [
            self.l_glref,
            self.l_base,
            self.l_stack,
            self.l_cframe,
            self.l_maxstack,
        ]
        .into_iter()
        .max()
        .unwrap_or(0);
        self.lh_size = if l_last <= 120 { l_last + 8 } else { 0 };
        let mut g = vec![self.g_vmstate, self.g_cur_l, self.g_jit_base];
        if self.g_ctype_state != 0 {
            g.push(self.g_ctype_state);
        }
        let lo = g.iter().copied().min().unwrap_or(0);
        let hi = g.iter().copied().max().unwrap_or(0) + 16;
        self.gh_lo = lo;
        self.gh_size = if hi - lo <= 256 { hi - lo } else { 0 };
        self
    }

    /// Whether BPF can read this layout's proto fields at once (their span is at most
    /// 128 bytes).
    pub fn readable(&self) -> bool {
        self.pt_span <= 120
    }
}

/// `struct lrec_puc_config`: a PUC Lua layout, written into the `puc_config` map.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawPucConfig {
    pub version: u32,
    pub fresh_rule: u32,
    pub cist_fresh: u32,
    pub cist_tail: u32,
    pub callstatus_size: u32,
    pub l_g: u32,
    pub l_ci: u32,
    pub l_status: u32,
    pub l_base_ci: u32,
    pub l_savedpc: u32,
    pub l_errorjmp: u32,
    pub g_mainthread: u32,
    pub ci_func: u32,
    pub ci_previous: u32,
    pub ci_savedpc: u32,
    pub ci_callstatus: u32,
    pub ci_size: u32,
    pub tag_lcl: u32,
    pub tag_ccl: u32,
    pub tag_lcf: u32,
    pub tag_thread: u32,
    pub cl_isc: u32,
    pub cl_p: u32,
    pub ccl_f: u32,
    pub ccl_upvalue: u32,
    pub p_source: u32,
    pub p_linedefined: u32,
    pub p_lastlinedefined: u32,
    pub p_code: u32,
    pub p_sizecode: u32,
    pub p_lineinfo: u32,
    pub p_sizelineinfo: u32,
    pub p_abslineinfo: u32,
    pub p_sizeabslineinfo: u32,
    pub strings: u32,
    pub str_len: u32,
    pub str_shrlen: u32,
    pub str_data: u32,
    pub op_call: u32,
    pub op_tailcall: u32,
    pub l_size: u32,
    pub p_size: u32,
    pub ci_tailcalls: u32,
    pub str_hdr: u32,
}

/// sizeof a struct the walker reads whole: known, else past the last field it reads
/// (`width` bytes each, rounded up to 8), which bounds the read as well.
fn bound(size: u32, read: &[u32], width: u32) -> u32 {
    if size != ABSENT {
        return size;
    }
    let last = read
        .iter()
        .copied()
        .filter(|&v| v != ABSENT)
        .max()
        .unwrap_or(0);
    (last + width).next_multiple_of(8)
}

impl RawPucConfig {
    /// The walker's configuration for a PUC Lua layout.
    pub fn new(l: &puc::Layout) -> RawPucConfig {
        let (r, o) = (&l.rules, &l.offsets);
        // An absent field the walker does not read in this release (5.1's CallInfo links).
        let or0 = |v: u32| if v == ABSENT { 0 } else { v };
        RawPucConfig {
            version: r.version,
            fresh_rule: match r.fresh {
                puc::FreshRule::Fresh => puc_rule::FRESH,
                puc::FreshRule::Reentry => puc_rule::REENTRY,
                puc::FreshRule::All => puc_rule::ALL,
                puc::FreshRule::Opcode => puc_rule::OPCODE,
            },
            cist_fresh: r.cist_fresh,
            cist_tail: r.cist_tail,
            callstatus_size: if o.ci_callstatus_size == ABSENT {
                1
            } else {
                o.ci_callstatus_size
            },
            l_g: o.l_g,
            l_ci: o.l_ci,
            l_status: o.l_status,
            l_base_ci: o.l_base_ci,
            l_savedpc: or0(o.l_savedpc),
            l_errorjmp: o.l_errorjmp,
            g_mainthread: o.g_mainthread,
            ci_func: o.ci_func,
            ci_previous: or0(o.ci_previous),
            ci_savedpc: o.ci_savedpc,
            ci_callstatus: or0(o.ci_callstatus),
            ci_size: bound(
                o.ci_size,
                &[
                    o.ci_func,
                    or0(o.ci_previous),
                    o.ci_savedpc,
                    or0(o.ci_callstatus),
                    or0(o.ci_tailcalls),
                ],
                8,
            ),
            tag_lcl: r.tag_lcl,
            tag_ccl: r.tag_ccl,
            tag_lcf: r.tag_lcf,
            tag_thread: r.tag_thread,
            cl_isc: or0(o.cl_isc),
            cl_p: o.lcl_p,
            ccl_f: o.ccl_f,
            ccl_upvalue: o.ccl_upvalue,
            p_source: o.p_source,
            p_linedefined: o.p_linedefined,
            p_lastlinedefined: o.p_lastlinedefined,
            p_code: o.p_code,
            p_sizecode: o.p_sizecode,
            p_lineinfo: o.p_lineinfo,
            p_sizelineinfo: o.p_sizelineinfo,
            p_abslineinfo: or0(o.p_abslineinfo),
            p_sizeabslineinfo: or0(o.p_sizeabslineinfo),
            strings: match r.strings {
                puc::Strings::Len => puc_strings::LEN,
                puc::Strings::ShortLong => puc_strings::SHORT_LONG,
                puc::Strings::V55 => puc_strings::V55,
            },
            str_len: o.s_len,
            str_shrlen: or0(o.s_shrlen),
            str_data: o.s_data,
            op_call: r.op_call,
            op_tailcall: r.op_tailcall,
            l_size: bound(
                o.l_size,
                &[
                    o.l_g,
                    o.l_ci,
                    o.l_status,
                    o.l_base_ci,
                    o.l_errorjmp,
                    or0(o.l_savedpc),
                ],
                8,
            ),
            p_size: bound(
                o.p_size,
                &[
                    o.p_source,
                    o.p_linedefined,
                    o.p_lastlinedefined,
                    o.p_code,
                    o.p_sizecode,
                    o.p_lineinfo,
                    o.p_sizelineinfo,
                    or0(o.p_abslineinfo),
                    or0(o.p_sizeabslineinfo),
                ],
                8,
            ),
            ci_tailcalls: or0(o.ci_tailcalls),
            // The type byte, the short length and the long one (the text's pointer, in
            // 5.5, is read on its own).
            str_hdr: [9, or0(o.s_shrlen) + 1, o.s_len + 8]
                .into_iter()
                .max()
                .unwrap_or(24),
        }
    }
}

/// `lrec_puc_config.fresh_rule`.
pub mod puc_rule {
    pub const FRESH: u32 = 0;
    pub const REENTRY: u32 = 1;
    pub const ALL: u32 = 2;
    pub const OPCODE: u32 = 3;
}

/// `lrec_puc_config.strings`.
pub mod puc_strings {
    pub const LEN: u32 = 0;
    pub const SHORT_LONG: u32 = 1;
    pub const V55: u32 = 2;
}

// SAFETY: plain old data without padding (asserted in the layout test).
unsafe impl aya::Pod for RawLuaConfig {}
// SAFETY: as above: u32 fields only.
unsafe impl aya::Pod for RawPucConfig {}
