//! What lrec keeps of the protos BPF copied out, in two generations: a host whose VMs live
//! for one request allocates new protos (new keys: their addresses, their chunk names'
//! addresses) for as long as it runs, and a key kept forever is memory kept forever.
//! When the newer generation holds [`KEYS`] keys, BPF starts a new one (ebpf/lua_protos.h,
//! lua_proto_gen: every proto a frame names from then on is copied out again, once) and
//! lrec forgets the older: a key still in use is found in the generation before and kept.

use std::hash::Hash;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

/// Keys the newer generation holds before the next one starts (~1.6 MB with the older):
/// far more than a long-lived program's protos that run in a few seconds, so that
/// such a program keeps one generation.
pub(super) const KEYS: usize = 8192;

/// The least time between two generations: a frame BPF sent in one is read by lrec
/// before the next but one starts (the ring holds a fraction of that: Config::ring_mib).
pub(super) const AT_LEAST: Duration = Duration::from_secs(2);

/// A map whose entries live the generation they were inserted or last used in, and the
/// next.
pub(super) struct TwoGen<K, V> {
    new: FxHashMap<K, V>,
    old: FxHashMap<K, V>,
}

impl<K, V> Default for TwoGen<K, V> {
    fn default() -> Self {
        TwoGen {
            new: FxHashMap::default(),
            old: FxHashMap::default(),
        }
    }
}

impl<K: Hash + Eq + Copy, V: Copy> TwoGen<K, V> {
    /// The value of `k`, moved into the newer generation if it was in the older: one
    /// lookup when it is in the newer (every Lua frame converted asks).
    pub(super) fn get(&mut self, k: &K) -> Option<V> {
        if let Some(&v) = self.new.get(k) {
            return Some(v);
        }
        let v = self.old.remove(k)?;
        self.new.insert(*k, v);
        Some(v)
    }

    pub(super) fn contains(&mut self, k: &K) -> bool {
        self.get(k).is_some()
    }
}

impl<K: Hash + Eq + Copy, V> TwoGen<K, V> {
    pub(super) fn insert(&mut self, k: K, v: V) {
        self.new.insert(k, v);
    }

    pub(super) fn remove(&mut self, k: &K) -> Option<V> {
        self.new.remove(k).or_else(|| self.old.remove(k))
    }

    /// Keys in the newer generation.
    pub(super) fn len(&self) -> usize {
        self.new.len()
    }

    /// A new generation starts: the older one is forgotten (its memory serves the new).
    pub(super) fn rotate(&mut self) {
        self.old.clear();
        std::mem::swap(&mut self.new, &mut self.old);
    }
}

/// When the generations of proto keys turn.
pub(super) struct Clock {
    pub(super) gen: u32,
    last: Instant,
}

impl Default for Clock {
    fn default() -> Self {
        Clock {
            gen: 0,
            last: Instant::now(),
        }
    }
}

impl Clock {
    /// Whether a new generation starts now, with `keys` in the newer one: then counted.
    pub(super) fn turn(&mut self, keys: usize) -> bool {
        if keys < KEYS || self.last.elapsed() < AT_LEAST {
            return false;
        }
        self.gen = self.gen.wrapping_add(1);
        self.last = Instant::now();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_lives_its_generation_and_the_next_unless_used() {
        let mut m = TwoGen::<u32, u32>::default();
        m.insert(1, 10);
        m.insert(2, 20);
        m.rotate();
        assert_eq!(m.len(), 0);
        // Used in the next generation: kept in it.
        assert_eq!(m.get(&1), Some(10));
        assert_eq!(m.len(), 1);
        m.rotate();
        assert_eq!(m.get(&1), Some(10));
        assert_eq!(m.get(&2), None, "unused for a whole generation: forgotten");
        assert_eq!(m.remove(&1), Some(10));
        assert!(!m.contains(&1));
    }

    #[test]
    fn generations_turn_when_full_and_not_too_often() {
        let mut c = Clock::default();
        assert!(!c.turn(KEYS - 1));
        assert!(!c.turn(KEYS), "less than AT_LEAST after the start");
        c.last -= AT_LEAST;
        assert!(c.turn(KEYS));
        assert_eq!(c.gen, 1);
        assert!(!c.turn(KEYS));
    }
}
