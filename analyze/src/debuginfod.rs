//! A debuginfod client (the elfutils protocol that Debian, Ubuntu, Fedora and Arch serve):
//! a binary's debug file or executable by build-id, from the servers in `DEBUGINFOD_URLS`,
//! through the cache that gdb, perf and elfutils share (`$DEBUGINFOD_CACHE_PATH`, else
//! `$XDG_CACHE_HOME/debuginfod_client`, else `~/.cache/debuginfod_client`, laid out as
//! `BUILDID/debuginfo` and `BUILDID/executable`).
//!
//! Nothing here is trusted: a file is used only if its build-id is the one asked for. A
//! server that does not answer within the time-out (`DEBUGINFOD_TIMEOUT` seconds to
//! connect and between bytes, default 10; `DEBUGINFOD_MAXTIME` for a whole download,
//! default 300) is reported once and not asked again in this run.

use std::collections::HashMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use lrec_inspect::debug_files::{build_id_hex, map_regular_file};
use lrec_inspect::elf;

/// What to fetch for a build-id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Artifact {
    /// The separate debug file (symbols and DWARF).
    DebugInfo,
    /// The binary itself (its unwind and dynamic symbol sections).
    Executable,
}

impl Artifact {
    fn name(self) -> &'static str {
        match self {
            Artifact::DebugInfo => "debuginfo",
            Artifact::Executable => "executable",
        }
    }
}

/// A file fetched (or found in the cache), mapped and checked.
pub struct Fetched {
    pub path: PathBuf,
    pub data: memmap2::Mmap,
    /// The server it came from; None when the cache held it.
    pub server: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Health {
    /// Not asked yet: the first request to it is made alone, so that a server that does
    /// not answer costs one time-out, not one per binary.
    Unknown,
    Answers,
    Dead,
}

/// The servers of `DEBUGINFOD_URLS` and the shared cache.
pub struct Debuginfod {
    servers: Vec<String>,
    cache: PathBuf,
    agent: ureq::Agent,
    /// The longest a download may take.
    max_time: Duration,
    /// How long a missing file is remembered (elfutils' `cache_miss_s`, default 600 s).
    miss_ttl: Duration,
    health: Mutex<HashMap<String, Health>>,
    /// Held while a server of unknown health is asked.
    first_contact: Mutex<()>,
}

impl Debuginfod {
    /// The client the environment asks for; None when `DEBUGINFOD_URLS` is unset or empty.
    pub fn from_env() -> Option<Debuginfod> {
        let urls = std::env::var("DEBUGINFOD_URLS").ok()?;
        let seconds = |name: &str, default: u64| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .filter(|&s| s > 0)
                .unwrap_or(default)
        };
        let timeout = Duration::from_secs(seconds("DEBUGINFOD_TIMEOUT", 10));
        let max_time = Duration::from_secs(seconds("DEBUGINFOD_MAXTIME", 300));
        Debuginfod::new(&urls, cache_dir()?, timeout, max_time)
    }

    /// A client of the servers in `urls` (separated by spaces), caching under `cache`.
    pub fn new(
        urls: &str,
        cache: PathBuf,
        timeout: Duration,
        max_time: Duration,
    ) -> Option<Debuginfod> {
        let servers: Vec<String> = urls
            .split_whitespace()
            .map(|u| u.trim_end_matches('/').to_owned())
            .filter(|u| !u.is_empty())
            .collect();
        if servers.is_empty() {
            return None;
        }
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(timeout)
            .timeout_read(timeout)
            .timeout_write(timeout)
            // Not `.timeout(max_time)`: it would replace the read time-out.
            .try_proxy_from_env(true)
            .user_agent(concat!("lanalyze/", env!("CARGO_PKG_VERSION")))
            .build();
        let miss_ttl = std::fs::read_to_string(cache.join("cache_miss_s"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(600);
        let health = servers.iter().map(|s| (s.clone(), Health::Unknown));
        Some(Debuginfod {
            health: Mutex::new(health.collect()),
            servers,
            cache,
            agent,
            max_time,
            miss_ttl: Duration::from_secs(miss_ttl),
            first_contact: Mutex::new(()),
        })
    }

    /// `what` of the binary with `build_id` (`label` names it in progress lines): from the
    /// cache, else from the first server that has it.
    pub fn fetch(&self, build_id: &[u8], what: Artifact, label: &str) -> Option<Fetched> {
        let hex = build_id_hex(build_id);
        if hex.len() < 4 {
            return None;
        }
        let dir = self.cache.join(&hex);
        let path = dir.join(what.name());
        match cached(&path, build_id, self.miss_ttl) {
            Cached::Hit(data) => {
                return Some(Fetched {
                    path,
                    data,
                    server: None,
                })
            }
            Cached::KnownMissing => return None,
            Cached::No => {}
        }
        let mut all_answered = true;
        for server in &self.servers {
            match self.fetch_from(server, &hex, what, &dir, label) {
                Ok(Some((tmp, server))) => {
                    let data = map_regular_file(&tmp);
                    if data.as_ref().and_then(|d| elf::build_id(d)).as_deref() != Some(build_id) {
                        let _ = std::fs::remove_file(&tmp);
                        warn(&format!(
                            "{server} sent a {} for {label} that is not build-id {hex}; ignored",
                            what.name()
                        ));
                        continue;
                    }
                    std::fs::rename(&tmp, &path).ok()?;
                    let data = map_regular_file(&path)?;
                    let server = Some(server);
                    return Some(Fetched { path, data, server });
                }
                Ok(None) => {}
                Err(()) => all_answered = false,
            }
        }
        if all_answered {
            remember_missing(&dir, &path);
        }
        None
    }

    /// Downloads `what` from `server` into a temporary file under `dir`: Ok(None) when the
    /// server has no such file, Err when it did not answer.
    fn fetch_from(
        &self,
        server: &str,
        hex: &str,
        what: Artifact,
        dir: &Path,
        label: &str,
    ) -> Result<Option<(PathBuf, String)>, ()> {
        let url = format!("{server}/buildid/{hex}/{}", what.name());
        let health = self.health(server);
        if health == Health::Dead {
            return Err(());
        }
        // Only one request at a time to a server not yet known to answer.
        let _alone = match health {
            Health::Unknown => Some(self.first_contact.lock().unwrap_or_else(|e| e.into_inner())),
            _ => None,
        };
        if self.health(server) == Health::Dead {
            return Err(());
        }
        let started = Instant::now();
        let response = match self.agent.get(&url).call() {
            Ok(r) => r,
            Err(ureq::Error::Status(code, _)) => {
                self.set_health(server, Health::Answers);
                // 404 is "no such file"; anything else is no answer about it.
                return if code == 404 { Ok(None) } else { Err(()) };
            }
            Err(ureq::Error::Transport(e)) => {
                // The cause, without the URL the warning already names.
                let why = match (std::error::Error::source(&e), e.message()) {
                    (Some(cause), _) => cause.to_string(),
                    (None, Some(m)) => format!("{}: {m}", e.kind()),
                    (None, None) => e.kind().to_string(),
                };
                self.give_up(server, &why);
                return Err(());
            }
        };
        self.set_health(server, Health::Answers);
        eprintln!(
            "lanalyze: debuginfod: {label}: fetching its {} from {server}",
            what.name()
        );
        let written = std::fs::create_dir_all(dir).and_then(|()| {
            let tmp = dir.join(format!(".{}.{}.part", what.name(), std::process::id()));
            let mut file = std::fs::File::create(&tmp)?;
            let copied = copy_until(
                &mut response.into_reader(),
                &mut file,
                started + self.max_time,
            );
            match copied.and_then(|n| file.flush().map(|()| n)) {
                Ok(n) => Ok((tmp, n)),
                Err(e) => {
                    let _ = std::fs::remove_file(&tmp);
                    Err(e)
                }
            }
        });
        match written {
            Ok((tmp, bytes)) => {
                eprintln!(
                    "lanalyze: debuginfod: {label}: {} in {:.1} s",
                    size(bytes),
                    started.elapsed().as_secs_f64()
                );
                Ok(Some((tmp, server.to_owned())))
            }
            Err(e) => {
                self.give_up(server, &format!("download of {url} failed: {e}"));
                Err(())
            }
        }
    }

    fn health(&self, server: &str) -> Health {
        let health = self.health.lock().unwrap_or_else(|e| e.into_inner());
        health.get(server).copied().unwrap_or(Health::Unknown)
    }

    fn set_health(&self, server: &str, h: Health) {
        let mut health = self.health.lock().unwrap_or_else(|e| e.into_inner());
        health.insert(server.to_owned(), h);
    }

    /// Marks `server` dead and says so once.
    fn give_up(&self, server: &str, why: &str) {
        let mut health = self.health.lock().unwrap_or_else(|e| e.into_inner());
        if health.insert(server.to_owned(), Health::Dead) != Some(Health::Dead) {
            warn(&format!(
                "debuginfod server {server} did not answer ({why}); not asked again in this \
                 run, and functions it would have named keep their offsets"
            ));
        }
    }
}

/// Copies `from` to `to` until its end, or fails once `deadline` has passed (a server
/// that sends, but too slowly to finish).
fn copy_until(from: &mut dyn io::Read, to: &mut dyn Write, deadline: Instant) -> io::Result<u64> {
    let mut buf = vec![0u8; 1 << 16];
    let mut total = 0u64;
    loop {
        if Instant::now() > deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "DEBUGINFOD_MAXTIME passed before the end",
            ));
        }
        match from.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => {
                to.write_all(&buf[..n])?;
                total += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// `11.7 KiB`, `4.2 MiB`.
fn size(bytes: u64) -> String {
    match bytes {
        0..1024 => format!("{bytes} B"),
        1024..1_048_576 => format!("{:.1} KiB", bytes as f64 / 1024.0),
        _ => format!("{:.1} MiB", bytes as f64 / 1_048_576.0),
    }
}

fn warn(message: &str) {
    eprintln!("lanalyze: warning: {message}");
}

/// The cache directory the elfutils client uses.
fn cache_dir() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(p) = var("DEBUGINFOD_CACHE_PATH") {
        return Some(PathBuf::from(p));
    }
    if let Some(p) = var("XDG_CACHE_HOME") {
        return Some(PathBuf::from(p).join("debuginfod_client"));
    }
    Some(PathBuf::from(var("HOME")?).join(".cache/debuginfod_client"))
}

enum Cached {
    Hit(memmap2::Mmap),
    /// A server said it has no such file, less than `cache_miss_s` ago.
    KnownMissing,
    No,
}

/// What the cache holds at `path`. elfutils marks a file no server had with an empty file
/// of mode 000.
fn cached(path: &Path, build_id: &[u8], miss_ttl: Duration) -> Cached {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Cached::No;
    };
    if meta.is_file() && meta.len() == 0 && meta.permissions().mode() & 0o777 == 0 {
        let age = meta
            .modified()
            .ok()
            .and_then(|m| SystemTime::now().duration_since(m).ok());
        if age.is_some_and(|a| a < miss_ttl) {
            return Cached::KnownMissing;
        }
        let _ = std::fs::remove_file(path);
        return Cached::No;
    }
    match map_regular_file(path) {
        Some(data) if elf::build_id(&data).as_deref() == Some(build_id) => Cached::Hit(data),
        _ => Cached::No,
    }
}

/// Remembers that no server has `path`'s file, as elfutils does.
fn remember_missing(dir: &Path, path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if std::fs::create_dir_all(dir).is_ok() && std::fs::File::create(path).is_ok() {
        let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o000));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn client(urls: &str, cache: &Path, timeout_ms: u64) -> Debuginfod {
        let t = Duration::from_millis(timeout_ms);
        Debuginfod::new(urls, cache.to_owned(), t, t * 4).unwrap()
    }

    #[test]
    fn no_servers_is_no_client() {
        let dir = tempfile::tempdir().unwrap();
        let t = Duration::from_secs(1);
        assert!(Debuginfod::new("  ", dir.path().into(), t, t).is_none());
    }

    #[test]
    fn a_closed_port_costs_one_time_out_and_is_not_asked_again() {
        let dir = tempfile::tempdir().unwrap();
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let d = client(&format!("http://127.0.0.1:{port}"), dir.path(), 2000);
        assert!(d.fetch(&[1, 2, 3, 4], Artifact::DebugInfo, "x").is_none());
        assert_eq!(d.health(&format!("http://127.0.0.1:{port}")), Health::Dead);
        // Nothing remembered as missing: the server never said so.
        assert!(!dir.path().join("01020304/debuginfo").exists());
    }

    #[test]
    fn a_server_that_never_answers_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        // Accepts and holds connections without a byte of answer.
        std::thread::spawn(move || {
            let held: Vec<_> = listener.incoming().take(4).collect();
            std::thread::sleep(Duration::from_secs(30));
            drop(held);
        });
        let d = client(&url, dir.path(), 500);
        let started = Instant::now();
        for _ in 0..3 {
            assert!(d.fetch(&[5, 6, 7, 8], Artifact::DebugInfo, "x").is_none());
        }
        // One time-out in all, not one per request (margin for a loaded machine).
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn a_download_too_slow_to_finish_is_cut_at_the_maximum_time() {
        let dir = tempfile::tempdir().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        // Answers, then sends a byte every 50 ms of a body of a million.
        std::thread::spawn(move || {
            if let Some(Ok(mut s)) = listener.incoming().next() {
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n");
                while s.write_all(b"x").is_ok() {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        });
        let d = client(&url, dir.path(), 500);
        let started = Instant::now();
        assert!(d.fetch(&[9, 9, 9, 9], Artifact::DebugInfo, "x").is_none());
        // Cut at 2 s (4 time-outs), with a margin for a loaded machine.
        let took = started.elapsed();
        assert!(
            took >= Duration::from_secs(2) && took < Duration::from_secs(10),
            "{took:?}"
        );
        // The partial download is removed.
        let left: Vec<_> = std::fs::read_dir(dir.path().join("09090909"))
            .unwrap()
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn cache_hits_are_checked_and_misses_remembered() {
        let dir = tempfile::tempdir().unwrap();
        let exe = std::env::current_exe().unwrap();
        let id = elf::build_id(&std::fs::read(&exe).unwrap()).unwrap();
        let hex = build_id_hex(&id);
        std::fs::create_dir_all(dir.path().join(&hex)).unwrap();
        std::fs::copy(&exe, dir.path().join(&hex).join("executable")).unwrap();
        // No server is asked for what the cache holds.
        let d = client("http://127.0.0.1:9", dir.path(), 100);
        let hit = d.fetch(&id, Artifact::Executable, "x").expect("cached");
        assert!(hit.server.is_none());
        // A file of another build at the path is not a hit.
        let mut other = id.clone();
        other[0] ^= 0xff;
        let other_dir = dir.path().join(build_id_hex(&other));
        std::fs::create_dir_all(&other_dir).unwrap();
        std::fs::copy(&exe, other_dir.join("executable")).unwrap();
        assert!(matches!(
            cached(
                &other_dir.join("executable"),
                &other,
                Duration::from_secs(600)
            ),
            Cached::No
        ));
        remember_missing(&other_dir, &other_dir.join("debuginfo"));
        assert!(matches!(
            cached(
                &other_dir.join("debuginfo"),
                &other,
                Duration::from_secs(600)
            ),
            Cached::KnownMissing
        ));
        assert!(matches!(
            cached(&other_dir.join("debuginfo"), &other, Duration::ZERO),
            Cached::No
        ));
    }
}
