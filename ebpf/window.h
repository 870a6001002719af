/* A window of user memory read at once, for the Lua walks (luajit.h, puc.h): they read
 * many small pieces of one region going down it (a Lua stack's slots, a CallInfo array),
 * and one read of WINDOW bytes costs little more than one of 8 does (2 KiB windows took
 * 4-5 % less BPF time per 200-frame sample than 512-byte ones). */
#ifndef LREC_WINDOW_H
#define LREC_WINDOW_H

#include "common.h"

#define WINDOW 2048
/* The largest piece taken from a window: the buffer's slack past WINDOW. */
#define WINDOW_PIECE 256
_Static_assert((WINDOW & (WINDOW - 1)) == 0, "offsets in a window are masked");

struct window {
	__u64 lo; /* the address of buf[0]; 0: nothing read */
	__u8 buf[WINDOW + WINDOW_PIECE];
};

/* The offset in win->buf of the len bytes (len <= WINDOW_PIECE) at addr: from the window
 * read last when it holds them, else from a new one ending at addr + len and starting at
 * floor or above (the region's start: nothing below it is read); a window reaching into
 * an unmapped page is retried from addr's page. -1 when the bytes cannot be read so (the
 * caller reads them alone). */
static __always_inline int window_at(struct window *win, __u64 addr, __u32 len, __u64 floor)
{
	if (addr >= win->lo && win->lo && addr + len <= win->lo + WINDOW)
		return (int)(addr - win->lo);
	__u64 lo = addr + len > WINDOW ? addr + len - WINDOW : 0;
	if (lo < floor)
		lo = floor;
	if (addr < lo || addr + len > lo + WINDOW)
		goto fail;
	if (bpf_probe_read_user(win->buf, WINDOW, (void *)lo)) {
		__u64 page = addr & ~(__u64)(LREC_PAGE_SIZE - 1);
		if (page <= lo ||
		    bpf_probe_read_user(win->buf, WINDOW, (void *)page))
			goto fail;
		lo = page;
	}
	win->lo = lo;
	return (int)(addr - lo);
fail:
	win->lo = 0;
	return -1;
}

/* As window_at, for pieces read in no order (the protos of a walk's frames, which lie near
 * one another when one chunk defined them): a new window reaches from addr the way the
 * walk went (below prev, the piece read before, it ends at addr's piece; above, it begins
 * there; with no prev it is centred), so that the pieces further on are in it too; one
 * reaching into an unmapped page is retried within addr's page (and the next, where the
 * piece runs on into it). */
static __always_inline int window_toward(struct window *win, __u64 addr, __u32 len, __u64 prev)
{
	if (addr >= win->lo && win->lo && addr + len <= win->lo + WINDOW)
		return (int)(addr - win->lo);
	if (len > WINDOW_PIECE || addr < WINDOW)
		goto fail;
	__u64 lo = !prev ? addr - WINDOW / 2 : addr < prev ? addr + len - WINDOW : addr;
	lo &= ~7ULL;
	if (bpf_probe_read_user(win->buf, WINDOW, (void *)lo)) {
		lo = addr & ~(__u64)(LREC_PAGE_SIZE - 1);
		if (addr + len > lo + WINDOW)
			lo = addr + len - WINDOW;
		if (bpf_probe_read_user(win->buf, WINDOW, (void *)lo))
			goto fail;
	}
	win->lo = lo;
	return (int)(addr - lo);
fail:
	win->lo = 0;
	return -1;
}

/* The 8-byte aligned piece at offset off of win->buf (from window_at), where it lies in the
 * window; NULL when off is not aligned or the window failed (the caller reads the piece
 * alone). */
static __always_inline __u8 *window_piece(struct window *win, int off)
{
	if (off < 0 || (off & 7))
		return NULL;
	return &win->buf[off & (WINDOW - 8)];
}

/* Copies the piece at offset off of win->buf (window_piece) to dst, in words: `words` of
 * them (constant). 0 when it cannot (the caller reads the piece alone). */
static __always_inline int window_copy(struct window *win, int off, __u64 *dst, int words)
{
	__u64 *src = (__u64 *)window_piece(win, off);
	if (!src)
		return 0;
	for (int i = 0; i < words; i++)
		dst[i] = src[i];
	return 1;
}

#endif
