//! Lua VMs in binaries: where their interpreters are ([`detect`]), how each build lays
//! out the structures read from outside ([`luajit`], [`puc`]), stated once by name
//! ([`named`]), and where it frees its protos ([`frees`]).

pub mod detect;
pub mod evidence;
pub mod frees;
pub mod luajit;
pub mod meet;
pub mod named;
pub mod puc;

/// Debian's Lua libraries and their debug files, which the unit tests check lrec's findings
/// against.
#[cfg(test)]
pub(crate) mod system_files {
    pub const LIB: &str = "/usr/lib/x86_64-linux-gnu";

    /// A system file, or None (it is installed by `make setup`; unit tests say so).
    pub fn read(path: &str) -> Option<Vec<u8>> {
        let data = std::fs::read(path).ok();
        if data.is_none() {
            eprintln!("{path} is missing (`make setup` installs it): not checked");
        }
        data
    }

    /// Debian's separate debug file of `data`, by build-id.
    pub fn debug_file(data: &[u8]) -> Option<Vec<u8>> {
        let id: String = crate::elf::build_id(data)?
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        std::fs::read(format!(
            "/usr/lib/debug/.build-id/{}/{}.debug",
            &id[..2],
            &id[2..]
        ))
        .ok()
    }
}
