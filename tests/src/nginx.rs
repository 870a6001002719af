//! nginx with the lua module from fixtures/nginx, as the nginx and heap suites run it.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::{root, run};

/// Starts nginx from fixtures/nginx in `prefix`; returns the master's pid.
pub fn start_nginx(prefix: &Path, port: u16) -> u32 {
    let src = root().join("fixtures/nginx");
    std::fs::create_dir_all(prefix.join("lua")).unwrap();
    std::fs::create_dir_all(prefix.join("tmp")).unwrap();
    for lua in ["handler.lua", "waits.lua", "heapmod.lua"] {
        std::fs::copy(src.join("lua").join(lua), prefix.join("lua").join(lua)).unwrap();
    }
    let conf = std::fs::read_to_string(src.join("nginx.conf"))
        .unwrap()
        .replace("@PREFIX@", prefix.to_str().unwrap())
        .replace("@PORT@", &port.to_string());
    std::fs::write(prefix.join("nginx.conf"), conf).unwrap();
    run(Command::new("/usr/sbin/nginx")
        .arg("-p")
        .arg(prefix)
        .arg("-c")
        .arg(prefix.join("nginx.conf")));
    let pid_file = prefix.join("nginx.pid");
    let t0 = Instant::now();
    loop {
        if let Ok(pid) = std::fs::read_to_string(&pid_file) {
            if let Ok(pid) = pid.trim().parse() {
                return pid;
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "nginx did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether nginx and its lua module are installed (said loudly when not).
pub fn nginx_installed() -> bool {
    crate::installed("/usr/sbin/nginx", "nginx + lua").is_some()
        && crate::installed("/usr/lib/nginx/modules/ngx_http_lua_module.so", "nginx lua").is_some()
}
