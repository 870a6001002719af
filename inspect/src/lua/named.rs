//! Layouts as named offsets: each field of a layout struct has the name a capture stores
//! it under (`g.vmstate`, `L.glref`, …), so that the BPF configuration, the heap finder
//! and lanalyze's heap walker read one statement of each layout, and captures carry it.

/// An offset a layout does not have (the field does not exist in that build).
pub const ABSENT: u32 = u32::MAX;

/// Defines a layout struct of `u32` offsets, each with its capture name, and its
/// conversions to and from `(name, offset)` pairs ([`ABSENT`] fields are left out).
macro_rules! named_offsets {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$fmeta:meta])* $field:ident = $key:literal, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name {
            $( $(#[$fmeta])* pub $field: u32, )*
        }

        impl $name {
            /// Every field absent: what nothing is known of.
            pub const UNKNOWN: Self = $name { $( $field: $crate::lua::named::ABSENT, )* };

            /// The capture name of every field, in order.
            pub const NAMES: &'static [&'static str] = &[$($key),*];

            /// Every field present, by name.
            pub fn named(&self) -> Vec<(String, u32)> {
                let mut out = Vec::new();
                $( if self.$field != $crate::lua::named::ABSENT {
                    out.push(($key.to_string(), self.$field));
                } )*
                out
            }

            /// A layout from named offsets (a capture's); fields not named are absent.
            pub fn from_named(named: &[(String, u32)]) -> Self {
                let get = |key: &str| {
                    named
                        .iter()
                        .find(|(k, _)| k == key)
                        .map_or($crate::lua::named::ABSENT, |(_, v)| *v)
                };
                $name { $( $field: get($key), )* }
            }

            /// The names of the fields that differ from `other`'s.
            pub fn differences(&self, other: &Self) -> Vec<&'static str> {
                let mut out = Vec::new();
                $( if self.$field != other.$field { out.push($key); } )*
                out
            }
        }
    };
}

pub(crate) use named_offsets;

/// An offset as an `Option` (None when [`ABSENT`]).
pub fn present(offset: u32) -> Option<u64> {
    (offset != ABSENT).then_some(u64::from(offset))
}
