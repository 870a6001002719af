//! lrec's own memory, counted and bounded. Every allocation goes through [`Counting`],
//! which keeps the bytes in use and their peak. What lrec keeps grows with what the
//! target does (binaries mapped, prototypes loaded, samples held), so past
//! [`SHED_AT`] it keeps less (the embedder leaves DWARF out: [`shedding`]), and at
//! [`CEILING`] it stops recording, its capture finished, saying why: lrec never takes
//! more than that (plus its ring buffer, mapped, and its code), whatever the target.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The most heap lrec uses: at this, the recording stops.
pub const CEILING: usize = 512 << 20;
/// Past this, lrec keeps less.
pub const SHED_AT: usize = CEILING / 4 * 3;

static USED: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counted.
pub struct Counting;

// SAFETY: every call is the system allocator's, with the same arguments; the counters
// only add and subtract the sizes it was asked for.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        USED.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            USED.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(new_size);
        }
        p
    }
}

fn grew(size: usize) {
    let now = USED.fetch_add(size, Ordering::Relaxed) + size;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

/// Heap bytes in use now.
pub fn used() -> usize {
    USED.load(Ordering::Relaxed)
}

/// The most heap bytes in use so far.
pub fn peak() -> usize {
    PEAK.load(Ordering::Relaxed)
}

/// Whether lrec is to keep less (it is past [`SHED_AT`]).
pub fn shedding() -> bool {
    used() >= SHED_AT
}

/// Whether lrec has reached its ceiling.
pub fn at_ceiling() -> bool {
    used() >= CEILING
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_counted_and_freed() {
        let before = used();
        let v = vec![1u8; 256 << 20];
        assert!(used() >= before + (256 << 20) && peak() >= 256 << 20);
        drop(v);
        // (Other tests' threads allocate meanwhile.)
        assert!(used() < before + (128 << 20));
    }
}
