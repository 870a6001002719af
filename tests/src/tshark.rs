//! Debian's tshark running a Lua tap (fixtures/workloads/hosts/tshark.lua): a big host (Lua
//! 5.2 from the stripped, shared liblua5.2 among ~60 libraries, libwireshark's 110 MB
//! among them) that the tests record and stop.

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::root;

/// A pcap file of `n` small UDP packets.
pub fn write_pcap(path: &Path, n: u32) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    // Global header: magic, version 2.4, zone, sigfigs, snaplen, Ethernet.
    let mut header = 0xa1b2c3d4u32.to_le_bytes().to_vec();
    header.extend(2u16.to_le_bytes());
    header.extend(4u16.to_le_bytes());
    for v in [0u32, 0, 65535, 1] {
        header.extend(v.to_le_bytes());
    }
    f.write_all(&header).unwrap();
    for i in 0..n {
        let payload = [i as u8; 32];
        let mut udp = Vec::new();
        udp.extend((1000 + (i % 50) as u16).to_be_bytes());
        udp.extend(2000u16.to_be_bytes());
        udp.extend((8 + payload.len() as u16).to_be_bytes());
        udp.extend(0u16.to_be_bytes());
        udp.extend(payload);
        let mut ip = vec![0x45, 0];
        ip.extend((20 + udp.len() as u16).to_be_bytes());
        ip.extend((i as u16).to_be_bytes());
        ip.extend([0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        ip.extend(udp);
        let mut eth = vec![0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 6, 8, 0];
        eth.extend(ip);
        for v in [
            i / 1000,
            (i % 1000) * 1000,
            eth.len() as u32,
            eth.len() as u32,
        ] {
            f.write_all(&v.to_le_bytes()).unwrap();
        }
        f.write_all(&eth).unwrap();
    }
}

/// tshark reading a pcap of `packets` UDP packets (~1 ms of Lua each) written into `dir`,
/// its tap's Lua running; killed when dropped.
pub fn start_tshark(tshark: &Path, dir: &Path, packets: u32) -> Killed {
    let pcap = dir.join("udp.pcap");
    write_pcap(&pcap, packets);
    let tap = root().join("fixtures/workloads/hosts/tshark.lua");
    Killed(
        Command::new(tshark)
            .arg("-r")
            .arg(&pcap)
            .args(["-q", "-X"])
            .arg(format!("lua_script:{}", tap.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// A child process killed (and reaped) when dropped.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
