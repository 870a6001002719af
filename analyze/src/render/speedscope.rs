//! TODO(issue 9): speedscope output.

use std::io::{self, Write};

use crate::Profile;

/// Not yet written.
pub fn write_speedscope(_profile: &Profile, _out: &mut dyn Write) -> io::Result<()> {
    Err(io::Error::other("--speedscope is not implemented yet"))
}
