//! A capture file as lrec writes it: created private (mode 0600, as perf does: it holds
//! the target's stack memory, which may hold secrets), safely ([`OutputFile`]: no link
//! followed, nothing foreign replaced, owned by the user who ran sudo), under a temporary
//! name until it is complete ([`commit_capture`]); the flight recorder's dumps' names.

use std::io::{self, BufWriter};
use std::path::{Path, PathBuf};

use lrec_inspect::files::{OutputError, OutputFile, OutputOptions};

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

/// A capture file being written, buffered as lrec writes captures.
pub type CaptureFile = BufWriter<OutputFile>;

/// A new capture file ([`OutputFile`]), buffered.
pub fn create_capture(path: &Path, opts: &OutputOptions) -> Result<CaptureFile, OutputError> {
    Ok(BufWriter::with_capacity(
        1 << 20,
        OutputFile::create(path, opts)?,
    ))
}

/// Writes out what is buffered and gives the capture its name; returns its size.
pub fn commit_capture(out: CaptureFile) -> Result<u64, WriteFailed> {
    let path = out.get_ref().destination().to_path_buf();
    let failed = |error| WriteFailed {
        path: path.clone(),
        error,
    };
    let file = out.into_inner().map_err(|e| failed(e.into_error()))?;
    let bytes = file.file().metadata().map(|m| m.len()).unwrap_or(0);
    file.commit().map_err(|e| failed(io::Error::other(e)))?;
    Ok(bytes)
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
        // An old capture of lrec's, readable by all.
        std::fs::write(&path, lrec_format::MAGIC).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let out = create_capture(&path, &OutputOptions::default()).unwrap();
        assert_eq!(commit_capture(out).unwrap(), 0);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
