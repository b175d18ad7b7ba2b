//! Loopback ports for test servers, and the programs the harness runs.

use std::fs::OpenOptions;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::*;

// ---------------------------------------------------------------------------------------------
// Ports and binaries
// ---------------------------------------------------------------------------------------------

/// The ports of test servers come from below the kernel's ephemeral range, which every outbound
/// connection (of the tests, of etcd, of the members) draws its local port from: a port picked by
/// binding port 0 and releasing it can be taken by any such connection before the server binds
/// it. Below that range only an explicit bind takes a port, and every test process that binds
/// one first holds its lock file (`flock` on `<tmp>/leasehold-test-ports/<port>.lock`, released
/// by the kernel when the process exits, however it exits). So two servers of this run, or of
/// two runs at once, never get the same port.
const TEST_PORTS_LOW: u16 = 10_000;
/// Ports never handed out when the ephemeral range starts lower than usual.
const TEST_PORTS_SPAN_MIN: u16 = 2_000;

/// The lock files of the ports this process holds: held until it exits, so a port is never
/// handed out twice even after its server stopped (a restarted server keeps its ports).
static PORTS_HELD: Mutex<Vec<(u16, std::fs::File)>> = Mutex::new(Vec::new());

/// The first port of the kernel's ephemeral range (Linux: `ip_local_port_range`).
pub(crate) fn ephemeral_ports_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A loopback port reserved for this process (see [`TEST_PORTS_LOW`]).
pub fn free_port() -> u16 {
    free_ports::<1>()[0]
}

/// `N` distinct loopback ports reserved for this process: below the ephemeral range, locked
/// against every other test process, and free to bind right now.
pub fn free_ports<const N: usize>() -> [u16; N] {
    let high = ephemeral_ports_low();
    assert!(
        high >= TEST_PORTS_LOW + TEST_PORTS_SPAN_MIN,
        "the ephemeral port range starts at {high}: no room below it for test servers"
    );
    let span = u32::from(high - TEST_PORTS_LOW);
    let lock_dir = std::env::temp_dir().join("leasehold-test-ports");
    std::fs::create_dir_all(&lock_dir).expect("create the port lock dir");
    let mut held = PORTS_HELD.lock().unwrap_or_else(|e| e.into_inner());
    // Start at a place of this process's own, so concurrent processes rarely probe the same
    // ports; then walk the whole span once.
    let seed = std::process::id().wrapping_mul(2_654_435_761) ^ (held.len() as u32 * 7_919);
    let mut ports = Vec::with_capacity(N);
    for step in 0..span {
        if ports.len() == N {
            break;
        }
        let port = TEST_PORTS_LOW + ((seed.wrapping_add(step)) % span) as u16;
        if held.iter().any(|(p, _)| *p == port) {
            continue;
        }
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(lock_dir.join(format!("{port}.lock")))
            .expect("open a port lock file");
        if lock.try_lock().is_err() {
            continue; // Another test process holds it.
        }
        // Something outside the tests (a system service) may listen there.
        if TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        held.push((port, lock));
        ports.push(port);
    }
    assert_eq!(
        ports.len(),
        N,
        "no {N} free test ports in {TEST_PORTS_LOW}..{high}"
    );
    std::array::from_fn(|i| ports[i])
}

pub(crate) fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

pub(crate) fn etcd_binary() -> PathBuf {
    find_on_path("etcd").unwrap_or_else(|| panic!("`etcd` {MISSING_ETCD}"))
}

pub fn etcdctl_binary() -> PathBuf {
    find_on_path("etcdctl").unwrap_or_else(|| panic!("`etcdctl` {MISSING_ETCD}"))
}

/// The `leasehold` binary under test: `$LEASEHOLD_BIN` if set, else the one cargo built next to
/// the running test (an integration test runs from `target/<profile>/deps/`; cargo builds the
/// package's binary into `target/<profile>/` before its integration tests).
pub fn leasehold_binary() -> PathBuf {
    if let Some(path) = std::env::var_os(BIN_VAR) {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("the test's own path");
    let beside = exe
        .parent()
        .and_then(Path::parent)
        .map(|profile| profile.join("leasehold"));
    match beside {
        Some(path) if path.is_file() => path,
        _ => panic!(
            "no `leasehold` binary next to {}: run the tests with cargo from the `leasehold` \
             package, set {BIN_VAR} to the binary, or set {AGAINST_ETCD_VAR}=1 to run against \
             etcd only",
            exe.display()
        ),
    }
}

/// True when `LEASEHOLD_DIFF_AGAINST_ETCD=1`: every "leasehold" becomes a real etcd.
pub fn against_etcd() -> bool {
    std::env::var(AGAINST_ETCD_VAR).is_ok_and(|v| v == "1")
}
