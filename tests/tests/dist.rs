//! lrec as one file to copy onto a server (issue 41): `make dist`'s dist/lrec is a static
//! executable (`ldd` says so: a static PIE), and, copied into an empty root that holds only itself, a
//! static LuaJIT, its script, /proc and /sys (a mount namespace and a chroot: no libc.so,
//! no loader, no /etc), it records the LuaJIT there; the capture, read outside with
//! `--offline`, is exact on chains.lua's true chains. `make test` builds dist first.

use std::path::Path;
use std::process::Command;

use lrec_e2e::{
    assert_lua_exact, bpf_test, cannot_run, chains_truth, fixture_bin, lua_workload, root,
    tempfile_dir,
};

/// dist/NAME, or None after saying why (a failure under CI).
fn dist(name: &str) -> Option<std::path::PathBuf> {
    let p = root().join("dist").join(name);
    if p.exists() {
        return Some(p);
    }
    cannot_run(
        &format!("dist/{name}"),
        "not built: `make test` runs `make dist` first",
    );
    None
}

fn copy_into(root: &Path, from: &Path, name: &str) {
    std::fs::copy(from, root.join(name))
        .unwrap_or_else(|e| panic!("copying {} into the root: {e}", from.display()));
}

#[test]
fn dist_binaries_are_static() {
    for name in ["lrec", "lanalyze"] {
        let Some(p) = dist(name) else {
            return;
        };
        let out = Command::new("ldd").arg(&p).output().unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // A static PIE (ASLR kept) is "statically linked"; a static non-PIE "not a
        // dynamic executable".
        assert!(
            said.contains("statically linked") || said.contains("not a dynamic executable"),
            "dist/{name} is not static; ldd says: {said}"
        );
        let version = Command::new(&p).arg("--version").output().unwrap();
        let version = String::from_utf8_lossy(&version.stdout);
        eprintln!(
            "dist/{name}: {} bytes, {}",
            std::fs::metadata(&p).unwrap().len(),
            version.trim()
        );
        assert!(version.contains("static"), "dist/{name}: {version}");
    }
}

#[test]
fn dist_lrec_records_inside_an_empty_root() {
    let what = "dist lrec in an empty root";
    let Some(_guard) = bpf_test(what) else {
        return;
    };
    let Some(lrec) = dist("lrec") else {
        return;
    };
    let dir = tempfile_dir("dist-root");
    let r = dir.join("root");
    for d in ["proc", "sys"] {
        std::fs::create_dir_all(r.join(d)).unwrap();
    }
    copy_into(&r, &lrec, "lrec");
    copy_into(&r, &fixture_bin("luajit-gc64-static"), "luajit");
    copy_into(&r, &lua_workload("chains.lua"), "chains.lua");
    // Mounts private to the namespace, so nothing is left mounted when it ends.
    let script = format!(
        "mount --rbind /proc {r}/proc && mount --rbind /sys {r}/sys && \
         exec chroot {r} /lrec -F 499 -o /c.lrec -- /luajit /chains.lua 6",
        r = r.display()
    );
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!("{what}: {}", err.trim_end());
    assert!(out.status.success(), "{what}: lrec failed: {err}");
    let entries: Vec<String> = std::fs::read_dir(&r)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    eprintln!("{what}: the root held {entries:?}");
    assert_lua_exact(what, &r.join("c.lrec"), "chains.lua", &chains_truth(), 0.95);
    std::fs::remove_dir_all(&dir).unwrap();
}
