//! Where the recorder's records go: a capture file, or the flight recorder's memory
//! ([`Flight`]). Every capture file lrec writes is created private (mode 0600, as perf
//! does): it holds the target's stack memory, which may hold secrets.

use std::fs::File;
use std::io::{self, BufWriter};
use std::path::{Path, PathBuf};

use lrec_format::{create_private, CaptureSink, Chunk};

use crate::flight::Flight;

/// Writing a capture failed (most often: the disk is full). Recording stops there; what
/// was written before stays readable.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot write {}: {error}; the capture is readable up to its last complete chunk",
    path.display()
)]
pub struct WriteFailed {
    pub path: PathBuf,
    pub error: io::Error,
}

/// A new capture file ([`create_private`]), buffered as lrec writes captures.
pub fn create_capture(path: &Path) -> io::Result<BufWriter<File>> {
    Ok(BufWriter::with_capacity(1 << 20, create_private(path)?))
}

/// The records' destination.
pub enum Output {
    /// A capture file, written as recording goes.
    File(BufWriter<File>),
    /// The flight recorder's window, written out on demand.
    Flight(Box<Flight>),
}

impl Output {
    pub fn flight(&self) -> Option<&Flight> {
        match self {
            Output::File(_) => None,
            Output::Flight(f) => Some(f),
        }
    }

    pub fn flight_mut(&mut self) -> Option<&mut Flight> {
        match self {
            Output::File(_) => None,
            Output::Flight(f) => Some(f),
        }
    }
}

impl CaptureSink for Output {
    fn write_file_header(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Output::File(f) => f.write_file_header(bytes),
            Output::Flight(f) => f.write_file_header(bytes),
        }
    }

    fn write_chunk(&mut self, chunk: Chunk) -> io::Result<()> {
        match self {
            Output::File(f) => f.write_chunk(chunk),
            Output::Flight(f) => f.write_chunk(chunk),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Output::File(f) => CaptureSink::flush(f),
            Output::Flight(f) => f.flush(),
        }
    }
}

/// The `n`th flight-recorder dump of `-o base`: `out.lrec` gives `out.1.lrec`, `out.2.lrec`,
/// …; a name without an extension gets `.1.lrec`, ….
pub fn numbered(base: &Path, n: u32) -> PathBuf {
    let name = base.file_name().unwrap_or_default().to_string_lossy();
    let name = match name.rsplit_once('.') {
        Some((stem, ext)) if !stem.is_empty() => format!("{stem}.{n}.{ext}"),
        _ => format!("{name}.{n}.lrec"),
    };
    base.with_file_name(name)
}

pub fn human_bytes(n: u64) -> String {
    match n {
        n if n >= 10 << 20 => format!("{} MiB", n >> 20),
        n if n >= 10 << 10 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_well() {
        assert_eq!(human_bytes(999), "999 B");
        assert_eq!(human_bytes(20 << 10), "20 KiB");
        assert_eq!(human_bytes(30 << 20), "30 MiB");
    }

    #[test]
    fn dumps_are_numbered_before_the_extension() {
        let n = |base: &str, i| numbered(Path::new(base), i);
        assert_eq!(n("out.lrec", 1), Path::new("out.1.lrec"));
        assert_eq!(
            n("/tmp/a.b/cap.lrec", 12),
            Path::new("/tmp/a.b/cap.12.lrec")
        );
        assert_eq!(n("capture", 2), Path::new("capture.2.lrec"));
        assert_eq!(n(".hidden", 3), Path::new(".hidden.3.lrec"));
    }

    #[test]
    fn captures_are_private_even_when_overwritten() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("lrec-private-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("old.lrec");
        std::fs::write(&path, b"old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        drop(create_private(&path).unwrap());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
