//! What a learner found out about a build's layout, field by field, and how a layout is
//! assembled from it: a field is proved by evidence (DWARF, machine code), else placed
//! from a reference layout only where proved fields of its struct on both sides of it lie
//! as far apart as there (nothing was inserted or removed between them), else taken from
//! the reference when everything the binary shows agrees with it (the binary is that
//! release, as far as it tells), else unknown.

use std::collections::BTreeMap;

use crate::lua::named::ABSENT;

/// Offsets found so far, by name, with where each came from; disagreements are kept.
#[derive(Debug, Default)]
pub struct Facts {
    found: BTreeMap<&'static str, (i64, String)>,
    pub conflicts: Vec<String>,
}

impl Facts {
    /// Notes that evidence `source` says field `name` is at `value`.
    pub fn set(&mut self, name: &'static str, value: i64, source: &str) {
        match self.found.get(name) {
            Some((v, _)) if *v == value => {}
            Some((v, s)) => self
                .conflicts
                .push(format!("{name}: {s} says {v}, {source} says {value}")),
            None => {
                self.found.insert(name, (value, source.to_string()));
            }
        }
    }

    pub fn get(&self, name: &str) -> Option<i64> {
        self.found.get(name).map(|(v, _)| *v)
    }

    fn source(&self, name: &str) -> Option<&str> {
        self.found.get(name).map(|(_, s)| s.as_str())
    }
}

/// How to assemble a layout: the reference (a release's layout, by name), the structs by
/// field-name prefix with the field that is each one's end (its size), and the fields
/// that may come from the reference as they are.
pub struct Assembly<'a> {
    pub reference: &'a [(String, u32)],
    /// The reference's name, for the sources (`lua-5.4.3-9`, `GC64 builds`).
    pub reference_name: &'a str,
    pub structs: &'a [(&'a str, Option<&'a str>)],
    /// Fields taken from the reference whatever the evidence says (none changes them).
    pub fixed: &'a [&'a str],
    /// Fields that hold a struct (`L.base_ci`, a CallInfo), with the field that is that
    /// struct's size and a name for where it ends: its end is a place in the outer struct
    /// when both are known.
    pub embedded: &'a [Embedded],
}

/// A struct held in a field of another (see [`Assembly::embedded`]).
pub struct Embedded {
    pub field: &'static str,
    pub size: &'static str,
    pub end: &'static str,
}

/// Each field's value (absent when unknown) and its source.
pub struct Assembled {
    pub named: Vec<(String, u32)>,
    pub sources: Vec<(&'static str, String)>,
}

impl Assembly<'_> {
    /// Assembles the fields `names` from `f`.
    pub fn run(&self, f: &Facts, names: &[&'static str]) -> Assembled {
        let mut named = Vec::new();
        let mut sources = Vec::new();
        for &name in names {
            let reference = self.at(name);
            let (value, source) = if let Some(v) = f.get(name) {
                (Some(v), f.source(name).map(str::to_string))
            } else if let Some((v, why)) = self.between(f, name) {
                (Some(v), Some(why))
            } else if reference.is_some() && (self.agrees(f, name) || self.fixed.contains(&name)) {
                let why = format!(
                    "as in {} (nothing the binary shows of this struct differs)",
                    self.reference_name
                );
                (reference, Some(why))
            } else {
                (None, None)
            };
            if let (Some(v), Some(s)) = (value.filter(|&v| (0..1 << 20).contains(&v)), source) {
                named.push((name.to_string(), v as u32));
                sources.push((name, s));
            }
        }
        Assembled { named, sources }
    }

    fn at(&self, name: &str) -> Option<i64> {
        self.reference
            .iter()
            .find(|(n, v)| n == name && *v != ABSENT)
            .map(|(_, v)| i64::from(*v))
    }

    /// Whether every field the evidence gives of `name`'s struct (its fields share the
    /// prefix before the dot) has the reference's value, also when it gives none: a struct
    /// no code reads, or a stripped host that exports nothing, which the live process
    /// proves. Conflicting evidence agrees with nothing.
    fn agrees(&self, f: &Facts, name: &str) -> bool {
        let prefix = match name.find('.') {
            Some(dot) => &name[..=dot],
            None => name,
        };
        f.conflicts.is_empty()
            && self
                .reference
                .iter()
                .filter(|(k, v)| k.starts_with(prefix) && *v != ABSENT)
                .all(|(k, v)| f.get(k).is_none_or(|found| found == i64::from(*v)))
    }

    /// A field no evidence gave, placed from the reference where the proved fields of its
    /// struct nearest below and above it (or the struct's end) lie as far apart as there.
    fn between(&self, f: &Facts, name: &str) -> Option<(i64, String)> {
        let (prefix, end) = self.structs.iter().find(|(p, _)| name.starts_with(p))?;
        let t = self.at(name)?;
        // Widths (`*_size` fields other than the end) are no places.
        let place = |k: &str| !k.ends_with("_size") && (Some(k) == *end || !k.ends_with(".size"));
        if !place(name) {
            return None;
        }
        let mut anchors: Vec<(&str, i64, i64)> = self
            .reference
            .iter()
            .filter(|(k, v)| k.starts_with(prefix) && *v != ABSENT && place(k))
            .filter_map(|(k, v)| Some((k.as_str(), i64::from(*v), f.get(k)?)))
            .collect();
        for e in self.embedded.iter().filter(|e| e.field.starts_with(prefix)) {
            let size = f
                .get(e.size)
                .or_else(|| self.between(f, e.size).map(|(v, _)| v));
            let (Some(r), Some(rs), Some(at), Some(size)) =
                (self.at(e.field), self.at(e.size), f.get(e.field), size)
            else {
                continue;
            };
            anchors.push((e.end, r + rs, at + size));
        }
        let below = anchors
            .iter()
            .filter(|(k, r, _)| *r <= t && Some(*k) != *end)
            .max_by_key(|(_, r, _)| *r)?;
        // The struct's size, after its last field when that field is proved: sizeof is
        // where the reference puts it after that field (a field added at the very end of
        // a struct no code reads would not show).
        if Some(name) == *end {
            let last = self
                .reference
                .iter()
                .filter(|(k, v)| {
                    k.starts_with(prefix) && *v != ABSENT && place(k) && Some(k.as_str()) != *end
                })
                .map(|(_, v)| i64::from(*v))
                .max()?;
            return (below.1 == last).then(|| {
                (
                    below.2 + (t - below.1),
                    format!(
                        "after {}, the last field, as in {}",
                        below.0, self.reference_name
                    ),
                )
            });
        }
        let above = anchors
            .iter()
            .filter(|(k, r, _)| *r > t || (Some(*k) == *end && *k != below.0))
            .min_by_key(|(_, r, _)| *r)?;
        (above.2 - below.2 == above.1 - below.1).then(|| {
            (
                below.2 + (t - below.1),
                format!("between {} and {}, proved", below.0, above.0),
            )
        })
    }
}
