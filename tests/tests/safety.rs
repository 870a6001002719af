//! lrec and lanalyze as root in a directory someone else controls: a symbolic link, a
//! FIFO, a directory or a foreign file at `-o` is refused with a clear error and left as
//! it was; under sudo the capture belongs to the user who ran it; `--user` runs the
//! command as another user.

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};

use lrec_e2e::*;

/// `lrec -d 1 -q -o OUT ARGS… -- sh -c SCRIPT`, its output whatever its exit status.
fn lrec(out: &Path, args: &[&str], script: &str, env: &[(&str, &str)]) -> Output {
    Command::new(bin("lrec"))
        .args(["-d", "1", "-q", "-o"])
        .arg(out)
        .args(args)
        .args(["--", "sh", "-c", script])
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

fn succeeded(out: &Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "lrec failed: {stderr}");
}

fn refused(what: &str, out: &Output, says: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{what}: lrec succeeded: {stderr}");
    assert!(stderr.contains(says), "{what}: lrec said: {stderr}");
}

#[test]
fn outputs_are_never_written_through_links_or_onto_foreign_files() {
    let Some(_guard) = bpf_test("outputs_are_never_written_through_links_or_onto_foreign_files")
    else {
        return;
    };
    let dir = tempfile_dir("safety");
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, b"precious").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).unwrap();
    let link = dir.join("link.lrec");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    refused("link", &lrec(&link, &[], "true", &[]), "symbolic link");
    refused(
        "link, forced",
        &lrec(&link, &["--force"], "true", &[]),
        "symbolic link",
    );
    let fifo = dir.join("fifo.lrec");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    refused(
        "fifo",
        &lrec(&fifo, &["--force"], "true", &[]),
        "FIFO, not a regular file",
    );
    refused(
        "directory",
        &lrec(&dir, &["--force"], "true", &[]),
        "directory",
    );
    refused(
        "foreign file",
        &lrec(&victim, &[], "true", &[]),
        "add --force",
    );
    // Left as they were.
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    assert_eq!(mode(&victim), 0o644);
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());

    // A capture: replaced by the next recording; lanalyze refuses the same things.
    let cap = dir.join("cap.lrec");
    let busy = "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done";
    succeeded(&lrec(&cap, &[], busy, &[]));
    succeeded(&lrec(&cap, &[], busy, &[]));
    for target in [&link, &victim] {
        let out = Command::new(bin("lanalyze"))
            .arg(&cap)
            .args(["--folded", "-o"])
            .arg(target)
            .output()
            .unwrap();
        assert!(!out.status.success(), "lanalyze wrote {}", target.display());
    }
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    let svg = dir.join("flame.svg");
    for _ in 0..2 {
        let out = lanalyze(&[
            cap.as_os_str(),
            "--flamegraph".as_ref(),
            "-o".as_ref(),
            svg.as_os_str(),
        ]);
        assert!(out.is_empty());
    }
    assert_eq!(mode(&svg), 0o600);
    // Nothing half-written was left behind.
    let partial = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".partial"))
        .count();
    assert_eq!(partial, 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn under_sudo_the_capture_belongs_to_the_user_and_user_runs_the_command_as_one() {
    let Some(_guard) = bpf_test("under_sudo_the_capture_belongs_to_the_user") else {
        return;
    };
    let dir = tempfile_dir("sudo");
    // A directory the invoking user may enter: as sudo leaves it.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cap = dir.join("mine.lrec");
    let sudo = [("SUDO_UID", "65534"), ("SUDO_GID", "65534")];
    succeeded(&lrec(&cap, &[], "id -u > /dev/null", &sudo));
    let meta = std::fs::metadata(&cap).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (65534, 65534));
    assert_eq!(mode(&cap), 0o600);
    // lanalyze's outputs too.
    let folded = dir.join("mine.folded");
    run(Command::new(bin("lanalyze"))
        .arg(&cap)
        .args(["--folded", "-o"])
        .arg(&folded)
        .envs(sudo));
    assert_eq!(std::fs::metadata(&folded).unwrap().uid(), 65534);

    // --user: the command runs as that user (its `id -u` says so), lrec stays root.
    let ids = dir.join("ids");
    std::fs::write(&ids, b"").unwrap();
    std::fs::set_permissions(&ids, std::fs::Permissions::from_mode(0o666)).unwrap();
    let script = format!("id -u > {} && id -g >> {}", ids.display(), ids.display());
    let as_nobody = dir.join("nobody.lrec");
    succeeded(&lrec(&as_nobody, &["--user", "nobody"], &script, &[]));
    let text = std::fs::read_to_string(&ids).unwrap();
    assert_eq!(text.lines().next(), Some("65534"), "{text}");
    let out = lrec(
        &dir.join("x.lrec"),
        &["--user", "no-such-user-here"],
        "true",
        &[],
    );
    refused("unknown user", &out, "no such user");
    std::fs::remove_dir_all(&dir).unwrap();
}
