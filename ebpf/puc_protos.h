/* PUC Lua prototypes as the walker (puc.h) reads them: a proto's header (puc_read_proto) and the frame fields it
 * gives (puc_proto_fields), its source string (puc_string) and that string's identity
 * (puc_name_id), the copy sent to lrec the first time a sample runs it (puc_note_proto),
 * and the proof that a remembered call site's proto is still the one at its address
 * (puc_site_proved). */
#ifndef LREC_PUC_PROTOS_H
#define LREC_PUC_PROTOS_H

#include "puc_work.h"
#include "puc_find.h"

/* The length and text address of a TString. */
static __always_inline int puc_string(struct puc_work *w, __u64 s, __u32 *len, __u64 *text)
{
	struct lrec_puc_config *c = &w->cfg;
	/* The header only (lrec's span of the fields read): a short string may end right
	 * after it. */
	__u32 hdr = c->str_hdr;
	if (hdr > 56)
		return 0;
	if (!puc_user_ptr(s) || bpf_probe_read_user(w->str, hdr & 63, (void *)s))
		return 0;
	__u8 tt = w->str[8];
	__u8 shr = w->str[c->str_shrlen & 63];
	__u64 lng = *(__u64 *)&w->str[c->str_len & 63];
	*text = s + c->str_data;
	switch (c->strings) {
	case LREC_PUC_STR_LEN:
		*len = lng;
		break;
	case LREC_PUC_STR_SHORTLONG:
		*len = (tt & 0x30) ? lng : shr;
		break;
	default:
		if ((__s8)shr >= 0) {
			*len = shr;
		} else {
			*len = lng;
			*text = rd64(s + c->str_data);
		}
	}
	return 1;
}

/* The identity of source string s (a proto's chunk name): its length and last 16 bytes,
 * read once per sample and string. A new string allocated where a freed one was (another
 * VM's, another chunk's) has other text, and its protos other keys: a proto of another
 * chunk at a freed proto's address, with the same lines and size, is not taken for it. */
static __always_inline __u32 puc_name_id(struct puc_work *w, __u64 s)
{
	if (s == w->last_name)
		return w->last_name_id;
	__u32 len = 0, id = 0;
	__u64 text = 0;
	if (puc_string(w, s, &len, &text)) {
		__u32 n = len < 16 ? len : 16;
		/* Keeps the mask below for the verifier. */
		asm volatile("" : "+r"(n));
		__u64 *tail = (__u64 *)w->str;
		tail[0] = 0;
		tail[1] = 0;
		if (!n || !bpf_probe_read_user(w->str, n & 31, (void *)(text + len - n))) {
			__u64 h = len ^ (tail[0] * 0x9E3779B97F4A7C15ULL) ^
				  (tail[1] * 0xC2B2AE3D27D4EB4FULL);
			id = (__u32)(h ^ (h >> 32)) | 1;
		}
	}
	w->last_name = s;
	w->last_name_id = id;
	return id;
}

/* Copies a proto's source name, first instructions and line table out the first time a
 * sample runs it (w->pt holds the proto's fields). */
static __always_inline void puc_note_proto(struct puc_work *w, struct lrec_lua_frame *f)
{
	struct lrec_puc_config *c = &w->cfg;
	struct lua_proto_key k;
	struct lrec_lua_proto *p = lua_proto_begin(&k, w->tgid, w->gen, f);
	if (!p)
		return;
	__u32 len = 0;
	__u64 text = 0;
	if (puc_string(w, f->chunkname, &len, &text)) {
		p->chunkname_len = len;
		__u32 n = len > LREC_LUA_CHUNKNAME ? LREC_LUA_CHUNKNAME : len;
		/* Keeps the mask below for the verifier. */
		asm volatile("" : "+r"(n));
		n &= 2 * LREC_LUA_CHUNKNAME - 1;
		if (n && bpf_probe_read_user(p->name, n, (void *)text))
			p->chunkname_len = 0;
	}
	/* The code's first instructions: what a free overwrites first, and a reuse. */
	__u32 nc = f->sizebc < LREC_LUA_CODE_HEAD ? f->sizebc : LREC_LUA_CODE_HEAD;
	if (nc && w->last_code &&
	    !bpf_probe_read_user(p->code_head, (nc * 4) & 31, (void *)w->last_code))
		p->code_words = nc;
	__u64 li = PUC_U64(w->pt, PUC_PT, c->p_lineinfo);
	__u32 nli = PUC_U32(w->pt, PUC_PT, c->p_sizelineinfo);
	if (c->p_abslineinfo) {
		/* 5.4+: a signed byte per instruction, and absolute lines now and then. */
		__u32 n = nli > LREC_PUC_ABS_AT ? LREC_PUC_ABS_AT : nli;
		if (n && li && !bpf_probe_read_user(p->lineinfo, n & 4095, (void *)li))
			p->lineinfo_len = n;
		__u64 abs = PUC_U64(w->pt, PUC_PT, c->p_abslineinfo);
		__u32 na = PUC_U32(w->pt, PUC_PT, c->p_sizeabslineinfo) * 8;
		if (na > LREC_LUA_LINEINFO - LREC_PUC_ABS_AT)
			na = LREC_LUA_LINEINFO - LREC_PUC_ABS_AT;
		if (na && abs &&
		    !bpf_probe_read_user(&p->lineinfo[LREC_PUC_ABS_AT], na & 1023, (void *)abs))
			p->abs_len = na;
	} else {
		/* 5.1–5.3: an int line per instruction. */
		__u32 n = nli * 4;
		if (n > LREC_LUA_LINEINFO)
			n = LREC_LUA_LINEINFO;
		if (n && li && !bpf_probe_read_user(p->lineinfo, n & (2 * LREC_LUA_LINEINFO - 1),
						    (void *)li))
			p->lineinfo_len = n;
	}
	lua_proto_commit(p, &k);
}

/* Reads proto pt's header into w->pt unless it is there already (w->last_pt); *fresh
 * is set when it was read. */
static __always_inline int puc_read_proto(struct puc_work *w, __u64 pt, int *fresh)
{
	if (pt == w->last_pt)
		return 0;
	w->last_pt = 0; /* a failed read leaves w->pt zeroed */
	if (!puc_user_ptr(pt))
		return -1;
	/* From the window of protos read in this sample (reaching on from the proto read
	 * before), else read alone. */
	__u32 n = w->cfg.p_size & (PUC_PT - 1);
	int off = window_toward(&w->ptw, pt, n, w->pt_prev);
	w->pt_prev = pt;
	if (off >= 0) {
		__u8 *src = &w->ptw.buf[off & (WINDOW - 1)];
		__u64 *dst = (__u64 *)w->pt;
		for (int i = 0; i < PUC_PT / 8; i++) {
			if (i * 8 >= n)
				break;
			dst[i] = *(__u64 *)&src[i * 8];
		}
	} else if (bpf_probe_read_user(w->pt, n, (void *)pt)) {
		return -1;
	}
	w->last_pt = pt;
	w->last_code = PUC_U64(w->pt, PUC_PT, w->cfg.p_code);
	*fresh = 1;
	return 0;
}

/* Whether the proto remembered for a call site (lua_sites) is still the one at its
 * address: read now (into w->pt, shared with a recursion's frames), it has the remembered
 * fields and code. A site that fails counts in w->stale (its frame is read in full). */
static __always_inline int puc_site_proved(struct puc_work *w, struct lua_site *s)
{
	struct lrec_puc_config *c = &w->cfg;
	int fresh = 0;
	if (!puc_read_proto(w, s->k.ptr, &fresh) && w->last_code == s->a &&
	    PUC_U64(w->pt, PUC_PT, c->p_source) == s->k.chunkname &&
	    PUC_U32(w->pt, PUC_PT, c->p_linedefined) == (__u32)s->k.firstline &&
	    PUC_U32(w->pt, PUC_PT, c->p_lastlinedefined) == s->k.numline &&
	    PUC_U32(w->pt, PUC_PT, c->p_sizecode) == s->k.sizebc &&
	    puc_name_id(w, s->k.chunkname) == s->k.name_id)
		return 1;
	w->unnoted = w->last_pt;
	w->stale++;
	return 0;
}

/* Frame f's proto fields, from the proto in w->pt. */
static __always_inline void puc_proto_fields(struct puc_work *w, struct lrec_lua_frame *f)
{
	struct lrec_puc_config *c = &w->cfg;
	f->ptr = w->last_pt;
	f->chunkname = PUC_U64(w->pt, PUC_PT, c->p_source);
	f->firstline = PUC_U32(w->pt, PUC_PT, c->p_linedefined);
	f->numline = PUC_U32(w->pt, PUC_PT, c->p_lastlinedefined);
	f->sizebc = PUC_U32(w->pt, PUC_PT, c->p_sizecode);
	f->name_id = puc_name_id(w, f->chunkname);
}

#endif
