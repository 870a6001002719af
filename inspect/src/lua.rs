//! Lua VMs in binaries: where their interpreters are ([`detect`]) and how each build
//! lays out the structures read from outside.

pub mod detect;
