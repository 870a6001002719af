//! Lua VMs in binaries: where their interpreters are ([`detect`]) and how each build
//! lays out the structures read from outside ([`luajit`], [`puc`]), stated once by name
//! ([`named`]).

pub mod detect;
pub mod evidence;
pub mod luajit;
pub mod named;
pub mod puc;
