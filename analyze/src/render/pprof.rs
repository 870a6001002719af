//! TODO(issue 9): pprof output.

use std::io::{self, Write};

use crate::Profile;

/// Not yet written.
pub fn write_pprof(_profile: &Profile, _out: &mut dyn Write) -> io::Result<()> {
    Err(io::Error::other("--pprof is not implemented yet"))
}
