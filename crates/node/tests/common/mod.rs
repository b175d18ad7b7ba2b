//! End-to-end harness: real `leasehold` and real `etcd` processes on loopback, plus the
//! differential machinery that runs one scenario against both and compares the results.
//!
//! Invariants the harness keeps, so that a test can never hang CI or leak a process:
//! - every server binds `127.0.0.1` on ports reserved by [`free_ports`] (below the ephemeral
//!   range, locked per port across test processes), never on a port 0 picked and released;
//! - every wait is bounded ([`READY_TIMEOUT`], [`STOP_TIMEOUT`], [`ETCDCTL_TIMEOUT`],
//!   [`REQUEST_TIMEOUT`], [`SCENARIO_TIMEOUT`]) and panics with the server's log when exceeded;
//! - a [`Server`] SIGKILLs and reaps its process on drop, also while a test unwinds, and then
//!   prints the tail of the process's log so the failure explains itself.
//!
//! Switch: `LEASEHOLD_DIFF_AGAINST_ETCD=1` starts real etcd wherever a test asks for leasehold.
//! Running the suite that way checks the tests themselves (a differential scenario must pass
//! etcd-vs-etcd before it says anything about leasehold).
//!
//! `LEASEHOLD_DIFF_DUMP=<dir>` writes every differential recording there; `LEASEHOLD_TEST_KEEP=1`
//! keeps the log and data dir of every server of a failed test.
//!
//! Real etcd comes from Debian's `etcd-server` and `etcd-client` packages (3.4); the README's
//! test script installs them. A missing `etcd` is a loud failure, never a silent skip.

#![allow(dead_code)] // Each test binary uses a different part of the harness.

use std::fmt::Write as _;
use std::fs::OpenOptions;
use std::future::Future;
use std::io::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{
    CampaignResponse, Client, CompactionResponse, ConnectOptions, DeleteResponse,
    Error as EtcdError, GetResponse, KeyValue, LeaderKey, LeaderResponse, LeaseGrantResponse,
    LeaseKeepAliveResponse, LeaseLeasesResponse, LeaseRevokeResponse, LeaseTimeToLiveResponse,
    LockResponse, ProclaimResponse, PutResponse, ResignResponse, ResponseHeader, TxnOpResponse,
    TxnResponse, UnlockResponse, WatchResponse, WatchStream,
};
use serde_json::{Value, json};
use tempfile::TempDir;

/// How long a started server has to answer a Range.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a server has to exit after SIGTERM.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Per-request deadline of every client the harness hands out.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one `etcdctl` invocation may take.
pub const ETCDCTL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one side of a differential scenario may take.
pub const SCENARIO_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a test waits for the next message of a watch stream.
pub const WATCH_MESSAGE_TIMEOUT: Duration = Duration::from_secs(5);

const READY_POLL_INTERVAL: Duration = Duration::from_millis(50);
const STOP_POLL_INTERVAL: Duration = Duration::from_millis(20);
const LOG_TAIL_BYTES_MAX: usize = 64 * 1024;
/// Values longer than this are recorded as length + hash, so a 2 MiB value does not end up in
/// a diff.
const RECORDED_BYTES_LEN_MAX: usize = 512;

/// `--name` of every server: the same on both sides so that `member list` output compares.
pub const MEMBER_NAME: &str = "node-1";

const AGAINST_ETCD_VAR: &str = "LEASEHOLD_DIFF_AGAINST_ETCD";
const DUMP_VAR: &str = "LEASEHOLD_DIFF_DUMP";
/// `LEASEHOLD_TEST_KEEP=1` keeps a failed test's server dirs (log and data) for inspection.
const KEEP_VAR: &str = "LEASEHOLD_TEST_KEEP";

const MISSING_ETCD: &str = "is not on PATH. The end-to-end tests compare leasehold with real etcd \
     3.4 (Debian packages etcd-server and etcd-client): run the test script described in \
     README.md, which installs them, or `apt-get install etcd-server etcd-client`.";

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
fn ephemeral_ports_low() -> u16 {
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

fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

fn etcd_binary() -> PathBuf {
    find_on_path("etcd").unwrap_or_else(|| panic!("`etcd` {MISSING_ETCD}"))
}

fn etcdctl_binary() -> PathBuf {
    find_on_path("etcdctl").unwrap_or_else(|| panic!("`etcdctl` {MISSING_ETCD}"))
}

fn leasehold_binary() -> PathBuf {
    // `option_env!` rather than `env!` so that this file also compiles in a crate without the
    // binary (the scratch crate that validates the harness etcd-vs-etcd).
    match option_env!("CARGO_BIN_EXE_leasehold") {
        Some(path) => PathBuf::from(path),
        None => panic!(
            "CARGO_BIN_EXE_leasehold is not set: this test binary was not built by cargo as \
             part of the `leasehold` crate; set {AGAINST_ETCD_VAR}=1 to run against etcd only"
        ),
    }
}

/// True when `LEASEHOLD_DIFF_AGAINST_ETCD=1`: every "leasehold" becomes a real etcd.
pub fn against_etcd() -> bool {
    std::env::var(AGAINST_ETCD_VAR).is_ok_and(|v| v == "1")
}

// ---------------------------------------------------------------------------------------------
// Server processes
// ---------------------------------------------------------------------------------------------

/// Which program a [`Server`] runs. Both take the same etcd flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Leasehold,
    Etcd,
}

impl Kind {
    fn binary(self) -> PathBuf {
        match self {
            Kind::Leasehold => leasehold_binary(),
            Kind::Etcd => etcd_binary(),
        }
    }
}

/// Starts the server under test (real etcd under `LEASEHOLD_DIFF_AGAINST_ETCD=1`).
pub struct Leasehold;

impl Leasehold {
    /// A fresh server on free ports with a fresh temporary data dir; returns once it serves.
    pub async fn start() -> Server {
        Server::launch(Self::kind(), "leasehold", None).await
    }

    /// Like [`Leasehold::start`] but on an existing data dir (which the caller keeps alive).
    pub async fn start_in(data_dir: &Path) -> Server {
        Server::launch(Self::kind(), "leasehold", Some(data_dir)).await
    }

    fn kind() -> Kind {
        if against_etcd() {
            Kind::Etcd
        } else {
            Kind::Leasehold
        }
    }
}

/// Starts real etcd, the reference.
pub struct Etcd;

impl Etcd {
    pub async fn start() -> Server {
        Server::launch(Kind::Etcd, "etcd", None).await
    }

    pub async fn start_in(data_dir: &Path) -> Server {
        Server::launch(Kind::Etcd, "etcd", Some(data_dir)).await
    }
}

/// One single-member server process. Killed (SIGKILL) and reaped on drop.
pub struct Server {
    kind: Kind,
    /// How logs and diffs refer to this side ("etcd", "leasehold").
    label: String,
    /// Holds the log file and, unless the data dir was given, the data dir.
    root: TempDir,
    data_dir: PathBuf,
    log_path: PathBuf,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
    /// Number of times the process was spawned; shown in the log's separators.
    spawn_count: u32,
    /// Set once a panic message carried the log, so that drop does not print it again.
    log_shown: AtomicBool,
    /// `--name`.
    member_name: String,
    /// `--initial-cluster` and `--initial-cluster-token`; `None`: a one-member cluster.
    cluster: Option<(String, String)>,
    /// More flags for every start.
    extra_args: Vec<String>,
}

impl Server {
    async fn launch(kind: Kind, label: &str, data_dir: Option<&Path>) -> Server {
        let root = tempfile::Builder::new()
            .prefix(&format!("{label}-test-"))
            .tempdir()
            .expect("create temp dir");
        let data_dir = match data_dir {
            Some(dir) => dir.to_path_buf(),
            None => root.path().join("data"),
        };
        let log_path = root.path().join(format!("{label}.log"));
        let [client_port, peer_port] = free_ports::<2>();
        let mut server = Server {
            kind,
            label: label.to_string(),
            root,
            data_dir,
            log_path,
            client_port,
            peer_port,
            child: None,
            spawn_count: 0,
            log_shown: AtomicBool::new(false),
            member_name: MEMBER_NAME.to_owned(),
            cluster: None,
            extra_args: Vec::new(),
        };
        server.spawn();
        server.wait_ready().await;
        server
    }

    /// A member of a multi-member cluster, spawned but not yet waited for (a member cannot serve
    /// before a quorum is up).
    pub fn spawn_member(
        kind: Kind,
        name: &str,
        [client_port, peer_port]: [u16; 2],
        initial_cluster: &str,
        token: &str,
        extra_args: &[&str],
    ) -> Server {
        let label = format!("{}-{name}", kind_label(kind));
        let root = tempfile::Builder::new()
            .prefix(&format!("{label}-test-"))
            .tempdir()
            .expect("create temp dir");
        let data_dir = root.path().join("data");
        let log_path = root.path().join(format!("{label}.log"));
        let mut server = Server {
            kind,
            label,
            root,
            data_dir,
            log_path,
            client_port,
            peer_port,
            child: None,
            spawn_count: 0,
            log_shown: AtomicBool::new(false),
            member_name: name.to_owned(),
            cluster: Some((initial_cluster.to_owned(), token.to_owned())),
            extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
        };
        server.spawn();
        server
    }

    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "{}: spawn while running", self.label);
        self.spawn_count += 1;
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .expect("open log file");
        writeln!(
            log,
            "===== harness: spawn #{} of {:?} on {} (peer {}), data dir {} =====",
            self.spawn_count,
            self.kind,
            self.endpoint(),
            self.peer_url(),
            self.data_dir.display()
        )
        .expect("write log file");
        let client_url = self.endpoint();
        let peer_url = self.peer_url();
        let (initial_cluster, token) = self.cluster.clone().unwrap_or_else(|| {
            (
                format!("{MEMBER_NAME}={peer_url}"),
                format!("{}-test-{}", self.label, self.peer_port),
            )
        });
        let child = Command::new(self.kind.binary())
            .args(["--name", &self.member_name])
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &initial_cluster])
            .args(["--initial-cluster-state", "new"].iter().filter(|_| {
                !self
                    .extra_args
                    .iter()
                    .any(|a| a == "--initial-cluster-state")
            }))
            .args(["--initial-cluster-token", &token])
            .args(["--heartbeat-interval", "100"])
            .args(["--election-timeout", "1000"])
            .args(&self.extra_args)
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {:?}: {e}", self.kind.binary()));
        self.child = Some(child);
    }

    /// Polls a gRPC Range until it succeeds; panics with the log after [`READY_TIMEOUT`] or if
    /// the process exits.
    pub async fn wait_ready(&mut self) {
        let started = Instant::now();
        let mut last_error = String::from("(no attempt finished)");
        while started.elapsed() < READY_TIMEOUT {
            let exited = self
                .child
                .as_mut()
                .expect("spawned")
                .try_wait()
                .expect("try_wait");
            if let Some(status) = exited {
                self.child = None;
                self.fail(&format!("exited with {status} before serving"));
            }
            match tokio::time::timeout(Duration::from_secs(3), probe(&self.endpoint())).await {
                Ok(Ok(())) => return,
                Ok(Err(e)) => last_error = e.to_string(),
                Err(_) => last_error = String::from("probe timed out"),
            }
            tokio::time::sleep(READY_POLL_INTERVAL).await;
        }
        self.fail(&format!(
            "not serving after {READY_TIMEOUT:?}; last probe error: {last_error}"
        ));
    }

    /// Panics with `message` and the tail of this server's log.
    #[track_caller]
    pub fn fail(&self, message: &str) -> ! {
        self.log_shown.store(true, Ordering::Relaxed);
        panic!(
            "{} ({:?}, {}): {message}\n{}",
            self.label,
            self.kind,
            self.endpoint(),
            self.log_tail()
        )
    }

    /// The last [`LOG_TAIL_BYTES_MAX`] bytes of the process's stdout+stderr, framed.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read(&self.log_path).unwrap_or_default();
        let start = log.len().saturating_sub(LOG_TAIL_BYTES_MAX);
        format!(
            "----- {} log ({}, last {} of {} bytes) -----\n{}\n----- end of {} log -----",
            self.label,
            self.log_path.display(),
            log.len() - start,
            log.len(),
            String::from_utf8_lossy(&log[start..]),
            self.label
        )
    }

    /// `http://127.0.0.1:<client port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    pub fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }

    /// "etcd" or "leasehold" (which may be an etcd under `LEASEHOLD_DIFF_AGAINST_ETCD=1`).
    pub fn label(&self) -> &str {
        &self.label
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn client_port(&self) -> u16 {
        self.client_port
    }

    pub fn peer_port(&self) -> u16 {
        self.peer_port
    }

    /// The process id, if running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// A client with [`REQUEST_TIMEOUT`] on every request.
    pub async fn client(&self) -> Client {
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(REQUEST_TIMEOUT);
        match Client::connect([self.endpoint()], Some(options)).await {
            Ok(client) => client,
            Err(e) => self.fail(&format!("connect: {e}")),
        }
    }

    /// SIGKILL and reap. No-op if not running.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            // `Child::kill` is SIGKILL on Unix. It fails only if the child was already reaped.
            let _ = child.kill();
            child.wait().expect("wait for killed child");
        }
    }

    /// SIGTERM, then wait (bounded by [`STOP_TIMEOUT`]) for the process to exit.
    pub async fn terminate(&mut self) -> ExitStatus {
        let pid = self
            .pid()
            .unwrap_or_else(|| self.fail("terminate: not running"));
        let status = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("run kill -TERM");
        assert!(status.success(), "kill -TERM {pid} failed: {status}");
        let started = Instant::now();
        while started.elapsed() < STOP_TIMEOUT {
            let exited = self
                .child
                .as_mut()
                .expect("running")
                .try_wait()
                .expect("try_wait");
            if let Some(status) = exited {
                self.child = None;
                return status;
            }
            tokio::time::sleep(STOP_POLL_INTERVAL).await;
        }
        self.fail(&format!("still running {STOP_TIMEOUT:?} after SIGTERM"))
    }

    /// Waits (bounded by `within`) for the process to exit on its own; its exit status, or
    /// `None` if it is still running then.
    pub async fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let started = Instant::now();
        loop {
            let child = self.child.as_mut()?;
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.child = None;
                return Some(status);
            }
            if started.elapsed() >= within {
                return None;
            }
            tokio::time::sleep(STOP_POLL_INTERVAL).await;
        }
    }

    /// Starts the process again on the same data dir and ports (SIGKILLing it first if it is
    /// still running) and waits until it serves.
    pub async fn restart(&mut self) {
        self.kill9();
        self.spawn();
        self.wait_ready().await;
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            if !self.log_shown.load(Ordering::Relaxed) {
                eprintln!("{}", self.log_tail());
            }
            if std::env::var(KEEP_VAR).is_ok_and(|v| v == "1") {
                // Replace the temp dir with a throwaway one and keep the original on disk.
                let throwaway = tempfile::tempdir().expect("create temp dir");
                let kept = std::mem::replace(&mut self.root, throwaway).keep();
                eprintln!("{KEEP_VAR}=1: kept {} (log and data dir)", kept.display());
            }
        }
    }
}

fn kind_label(kind: Kind) -> &'static str {
    match kind {
        Kind::Leasehold => "leasehold",
        Kind::Etcd => "etcd",
    }
}

/// A multi-member cluster of real processes on loopback, every member with its own data dir
/// and log; all are killed on drop.
pub struct Cluster {
    pub members: Vec<Server>,
    kind: Kind,
    /// `--initial-cluster` of the bootstrap members.
    pub initial_cluster: String,
    pub token: String,
}

impl Cluster {
    /// Starts `size` members of `kind` with one `--initial-cluster` and waits until every
    /// member serves a linearizable read (so a leader is elected).
    pub async fn start(kind: Kind, size: usize) -> Cluster {
        Cluster::start_with(kind, size, &[]).await
    }

    /// [`Cluster::start`] with more flags for every member.
    pub async fn start_with(kind: Kind, size: usize, extra_args: &[&str]) -> Cluster {
        let mut ports = Vec::new();
        for _ in 0..size {
            ports.push(free_ports::<2>());
        }
        let names: Vec<String> = (1..=size).map(|i| format!("m{i}")).collect();
        let initial_cluster = names
            .iter()
            .zip(&ports)
            .map(|(name, [_, peer])| format!("{name}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!("{}-cluster-{}", kind_label(kind), ports[0][1]);
        let mut members: Vec<Server> = names
            .iter()
            .zip(&ports)
            .map(|(name, ports)| {
                Server::spawn_member(kind, name, *ports, &initial_cluster, &token, extra_args)
            })
            .collect();
        for member in &mut members {
            member.wait_ready().await;
        }
        Cluster {
            members,
            kind,
            initial_cluster,
            token,
        }
    }

    /// Starts a member that joins the running cluster (`--initial-cluster-state existing`),
    /// after a MemberAdd for `peer_port`; returns its index once it serves.
    pub async fn join(&mut self, name: &str, ports: [u16; 2]) -> usize {
        let initial_cluster = format!(
            "{},{name}=http://127.0.0.1:{}",
            self.initial_cluster, ports[1]
        );
        let mut member = Server::spawn_member(
            self.kind,
            name,
            ports,
            &initial_cluster,
            &self.token,
            &["--initial-cluster-state", "existing"],
        );
        member.wait_ready().await;
        self.members.push(member);
        self.members.len() - 1
    }

    /// The index of the member every running member names as leader, polled (bounded by
    /// [`READY_TIMEOUT`]) until they agree.
    pub async fn leader(&self) -> usize {
        let started = Instant::now();
        while started.elapsed() < READY_TIMEOUT {
            let mut seen = Vec::new();
            for member in self.members.iter().filter(|m| m.pid().is_some()) {
                let mut client = member.client().await;
                if let Ok(status) = client.status().await {
                    seen.push((status.leader(), status.header().map(|h| h.member_id())));
                }
            }
            let running = self.members.iter().filter(|m| m.pid().is_some()).count();
            if seen.len() == running
                && let Some((leader, _)) = seen.first()
                && *leader != 0
                && seen.iter().all(|(l, _)| l == leader)
                && let Some(at) = seen.iter().position(|(_, me)| *me == Some(*leader))
            {
                let running: Vec<usize> = (0..self.members.len())
                    .filter(|i| self.members[*i].pid().is_some())
                    .collect();
                return running[at];
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the members did not agree on a leader within {READY_TIMEOUT:?}");
    }

    /// Every client endpoint, for a client that may talk to any member.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Server::endpoint).collect()
    }
}

async fn probe(endpoint: &str) -> Result<(), EtcdError> {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(1))
        .with_timeout(Duration::from_secs(2));
    let mut client = Client::connect([endpoint], Some(options)).await?;
    client.get("leasehold-test-readiness-probe", None).await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// etcdctl
// ---------------------------------------------------------------------------------------------

/// Runs `ETCDCTL_API=3 etcdctl --endpoints=<endpoint> --command-timeout=5s <args>`.
pub async fn etcdctl(endpoint: &str, args: &[&str]) -> Output {
    etcdctl_with_stdin(endpoint, args, "").await
}

/// [`etcdctl`] with `stdin` written to its standard input (for `txn`).
pub async fn etcdctl_with_stdin(endpoint: &str, args: &[&str], stdin: &str) -> Output {
    use tokio::io::AsyncWriteExt as _;
    let mut child = tokio::process::Command::new(etcdctl_binary())
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        .arg("--command-timeout=5s")
        .arg("--dial-timeout=3s")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn etcdctl");
    let mut input = child.stdin.take().expect("stdin piped");
    input
        .write_all(stdin.as_bytes())
        .await
        .expect("write etcdctl stdin");
    drop(input);
    match tokio::time::timeout(ETCDCTL_TIMEOUT, child.wait_with_output()).await {
        Ok(output) => output.expect("wait for etcdctl"),
        Err(_) => panic!("etcdctl {args:?} against {endpoint} ran longer than {ETCDCTL_TIMEOUT:?}"),
    }
}

/// Output as text, for assertion messages.
pub fn describe_output(output: &Output) -> String {
    format!(
        "exit: {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// One `etcdctl` invocation of an etcdctl differential.
#[derive(Clone, Debug)]
pub struct Ctl {
    pub args: Vec<String>,
    pub stdin: String,
}

/// `etcdctl <args>`.
pub fn ctl(args: &[&str]) -> Ctl {
    Ctl {
        args: args.iter().map(|a| a.to_string()).collect(),
        stdin: String::new(),
    }
}

/// `etcdctl <args>` with `stdin` as its input.
pub fn ctl_stdin(args: &[&str], stdin: &str) -> Ctl {
    Ctl {
        stdin: stdin.to_string(),
        ..ctl(args)
    }
}

/// Replaces what legitimately differs between two servers in etcdctl output: endpoints,
/// `cluster_id`/`member_id`/`raft_term` numbers, hex member IDs; and drops the client's own
/// JSON log lines (timestamps, random balancer names), which carry nothing the `Error:` line
/// does not.
pub fn mask_etcdctl_output(text: &str, server: &Server) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        if line.starts_with("{\"level\":") {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    let out = out
        .replace(&server.endpoint(), "<client-url>")
        .replace(&server.peer_url(), "<peer-url>")
        .replace(
            &format!("127.0.0.1:{}", server.client_port),
            "<client-addr>",
        );
    let mut out = mask_json_numbers(&out, &["cluster_id", "member_id", "raft_term"]);
    out = mask_hex_ids(&out);
    out
}

/// `"field":123` / `"field": 123` -> `"field":"<masked>"` for each field.
fn mask_json_numbers(text: &str, fields: &[&str]) -> String {
    let mut text = text.to_string();
    for field in fields {
        let needle = format!("\"{field}\":");
        let mut out = String::with_capacity(text.len());
        let mut rest = text.as_str();
        while let Some(at) = rest.find(&needle) {
            let after = at + needle.len();
            out.push_str(&rest[..after]);
            let tail = &rest[after..];
            let spaces = tail.len() - tail.trim_start().len();
            let tail = &tail[spaces..];
            let digits = tail.chars().take_while(|c| c.is_ascii_digit()).count();
            if digits > 0 {
                out.push_str("\"<masked>\"");
            } else {
                out.push_str(&rest[after..after + spaces]);
            }
            rest = &tail[digits..];
        }
        out.push_str(rest);
        text = out;
    }
    text
}

/// Rewrites every alphanumeric word of `text` with `f`, keeping everything between words.
pub fn map_words(text: &str, mut f: impl FnMut(&str) -> String) -> String {
    let mut out = String::with_capacity(text.len());
    let mut word = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            word.push(c);
        } else {
            if !word.is_empty() {
                out.push_str(&f(&word));
                word.clear();
            }
            out.push(c);
        }
    }
    if !word.is_empty() {
        out.push_str(&f(&word));
    }
    out
}

/// Lowercase hex words of 10 to 16 digits (member IDs as etcdctl prints them) -> `<id>`.
fn mask_hex_ids(text: &str) -> String {
    map_words(text, |word| {
        let is_id = (10..=16).contains(&word.len())
            && word
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
            && word.chars().any(|c| c.is_ascii_digit());
        if is_id {
            "<id>".to_owned()
        } else {
            word.to_owned()
        }
    })
}

/// Runs the same etcdctl invocations, in order, against a fresh etcd and a fresh leasehold and
/// asserts that exit codes and masked stdout/stderr agree.
pub async fn etcdctl_differential(name: &str, steps: &[Ctl]) {
    let (etcd, leasehold) = tokio::join!(Etcd::start(), Leasehold::start());
    let expected = record_etcdctl(&etcd, steps).await;
    let actual = record_etcdctl(&leasehold, steps).await;
    assert_same_recordings(name, &etcd, &expected, &leasehold, &actual);
}

/// Like [`etcdctl_differential`] for scenarios whose later invocations depend on earlier output
/// (for example an ID a command printed): `scenario` runs once against a fresh etcd and once
/// against a fresh leasehold (it gets the server, to run etcdctl or open a client), and both
/// recordings must agree.
pub async fn server_differential<F>(name: &str, scenario: F)
where
    F: for<'a> Fn(&'a Server, &'a mut Recorder) -> ScenarioFuture<'a>,
{
    let (etcd, leasehold) = tokio::join!(Etcd::start(), Leasehold::start());
    let mut recordings = Vec::with_capacity(2);
    for server in [&etcd, &leasehold] {
        let mut recorder = Recorder::default();
        if tokio::time::timeout(SCENARIO_TIMEOUT, scenario(server, &mut recorder))
            .await
            .is_err()
        {
            server.fail(&format!(
                "scenario ran longer than {SCENARIO_TIMEOUT:?} (after {} steps)",
                recorder.steps.len()
            ));
        }
        recordings.push(recorder);
    }
    assert_same_recordings(name, &etcd, &recordings[0], &leasehold, &recordings[1]);
}

async fn record_etcdctl(server: &Server, steps: &[Ctl]) -> Recorder {
    let mut recorder = Recorder::default();
    for step in steps {
        let args: Vec<&str> = step.args.iter().map(String::as_str).collect();
        let output = etcdctl_with_stdin(&server.endpoint(), &args, &step.stdin).await;
        let label = format!("etcdctl {}", step.args.join(" "));
        recorder.note(
            label,
            json!({
                "exit": output.status.code(),
                "stdout": mask_etcdctl_output(&String::from_utf8_lossy(&output.stdout), server),
                "stderr": mask_etcdctl_output(&String::from_utf8_lossy(&output.stderr), server),
            }),
        );
    }
    recorder
}

// ---------------------------------------------------------------------------------------------
// Recording responses as JSON
// ---------------------------------------------------------------------------------------------

/// Bytes as a string when they are short UTF-8, else hex; long values as length + hash.
pub fn bytes_json(bytes: &[u8]) -> Value {
    if bytes.len() > RECORDED_BYTES_LEN_MAX {
        return json!({ "len": bytes.len(), "fnv1a64": format!("{:016x}", fnv1a64(bytes)) });
    }
    match std::str::from_utf8(bytes) {
        Ok(text) => Value::String(text.to_string()),
        Err(_) => json!({ "hex": hex(bytes) }),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The header without what differs between any two clusters: cluster_id, member_id and
/// raft_term are dropped, the revision is kept.
pub fn header_json(header: Option<&ResponseHeader>) -> Value {
    match header {
        Some(h) => json!({ "revision": h.revision() }),
        None => Value::Null,
    }
}

/// Every field of a key-value.
pub fn kv_json(kv: &KeyValue) -> Value {
    json!({
        "key": bytes_json(kv.key()),
        "value": bytes_json(kv.value()),
        "create_revision": kv.create_revision(),
        "mod_revision": kv.mod_revision(),
        "version": kv.version(),
        "lease": kv.lease(),
    })
}

pub fn kvs_json(kvs: &[KeyValue]) -> Value {
    Value::Array(kvs.iter().map(kv_json).collect())
}

/// `{code, message}` of a gRPC status; any other client error as its text.
pub fn error_json(error: &EtcdError) -> Value {
    match error {
        EtcdError::GRpcStatus(status) => json!({
            "error": { "code": format!("{:?}", status.code()), "message": status.message() }
        }),
        other => json!({ "error": { "client": other.to_string() } }),
    }
}

/// A response that can be recorded.
pub trait Record {
    fn to_json(&self) -> Value;
}

impl Record for PutResponse {
    fn to_json(&self) -> Value {
        json!({ "put": {
            "header": header_json(self.header()),
            "prev_kv": self.prev_key().map_or(Value::Null, kv_json),
        }})
    }
}

impl Record for GetResponse {
    fn to_json(&self) -> Value {
        json!({ "range": {
            "header": header_json(self.header()),
            "kvs": kvs_json(self.kvs()),
            "more": self.more(),
            "count": self.count(),
        }})
    }
}

impl Record for DeleteResponse {
    fn to_json(&self) -> Value {
        json!({ "delete_range": {
            "header": header_json(self.header()),
            "deleted": self.deleted(),
            "prev_kvs": kvs_json(self.prev_kvs()),
        }})
    }
}

impl Record for TxnResponse {
    fn to_json(&self) -> Value {
        let responses: Vec<Value> = self
            .op_responses()
            .iter()
            .map(|op| match op {
                TxnOpResponse::Put(r) => r.to_json(),
                TxnOpResponse::Get(r) => r.to_json(),
                TxnOpResponse::Delete(r) => r.to_json(),
                TxnOpResponse::Txn(r) => r.to_json(),
            })
            .collect();
        json!({ "txn": {
            "header": header_json(self.header()),
            "succeeded": self.succeeded(),
            "responses": responses,
        }})
    }
}

impl Record for CompactionResponse {
    fn to_json(&self) -> Value {
        json!({ "compact": { "header": header_json(self.header()) } })
    }
}

impl Record for LeaseGrantResponse {
    fn to_json(&self) -> Value {
        json!({ "lease_grant": {
            "header": header_json(self.header()),
            "id": self.id(),
            "ttl": self.ttl(),
            "error": self.error(),
        }})
    }
}

impl Record for LeaseRevokeResponse {
    fn to_json(&self) -> Value {
        json!({ "lease_revoke": { "header": header_json(self.header()) } })
    }
}

impl Record for LeaseKeepAliveResponse {
    fn to_json(&self) -> Value {
        json!({ "lease_keep_alive": {
            "header": header_json(self.header()),
            "id": self.id(),
            "ttl": self.ttl(),
        }})
    }
}

/// The attached keys of a TimeToLive response, sorted: their order is unspecified (etcd sends
/// them in map order).
pub fn lease_keys_json(response: &LeaseTimeToLiveResponse) -> Value {
    let mut keys: Vec<&Vec<u8>> = response.keys().iter().collect();
    keys.sort();
    Value::Array(keys.into_iter().map(|k| bytes_json(k)).collect())
}

/// Every field as-is (keys sorted). The remaining `ttl` depends on time: record this only where
/// it is deterministic (an unknown lease's -1); otherwise record derived facts.
impl Record for LeaseTimeToLiveResponse {
    fn to_json(&self) -> Value {
        json!({ "lease_time_to_live": {
            "header": header_json(self.header()),
            "id": self.id(),
            "ttl": self.ttl(),
            "granted_ttl": self.granted_ttl(),
            "keys": lease_keys_json(self),
        }})
    }
}

/// The IDs in the server's order (ascending remaining time).
impl Record for LeaseLeasesResponse {
    fn to_json(&self) -> Value {
        let ids: Vec<i64> = self.leases().iter().map(|l| l.id()).collect();
        json!({ "lease_leases": { "header": header_json(self.header()), "ids": ids } })
    }
}

impl Record for LockResponse {
    fn to_json(&self) -> Value {
        json!({ "lock": { "header": header_json(self.header()), "key": bytes_json(self.key()) } })
    }
}

impl Record for UnlockResponse {
    fn to_json(&self) -> Value {
        json!({ "unlock": { "header": header_json(self.header()) } })
    }
}

/// Every field of an election's leader key.
pub fn leader_key_json(leader: &LeaderKey) -> Value {
    json!({
        "name": bytes_json(leader.name()),
        "key": bytes_json(leader.key()),
        "rev": leader.rev(),
        "lease": leader.lease(),
    })
}

impl Record for CampaignResponse {
    fn to_json(&self) -> Value {
        json!({ "campaign": {
            "header": header_json(self.header()),
            "leader": self.leader().map_or(Value::Null, leader_key_json),
        }})
    }
}

impl Record for ProclaimResponse {
    fn to_json(&self) -> Value {
        json!({ "proclaim": { "header": header_json(self.header()) } })
    }
}

impl Record for LeaderResponse {
    fn to_json(&self) -> Value {
        json!({ "leader": {
            "header": header_json(self.header()),
            "kv": self.kv().map_or(Value::Null, kv_json),
        }})
    }
}

impl Record for ResignResponse {
    fn to_json(&self) -> Value {
        json!({ "resign": { "header": header_json(self.header()) } })
    }
}

/// One watch event: its type, every field of its kv and of its prev_kv.
pub fn watch_event_json(event: &etcd_client::Event) -> Value {
    json!({
        "type": format!("{:?}", event.event_type()),
        "kv": event.kv().map_or(Value::Null, kv_json),
        "prev_kv": event.prev_kv().map_or(Value::Null, kv_json),
    })
}

/// Every field etcd-client exposes of a watch response (it has no accessor for `fragment`).
/// The watch ID is recorded as-is: both servers number the watchers of a stream from 0.
impl Record for WatchResponse {
    fn to_json(&self) -> Value {
        let events: Vec<Value> = self.events().iter().map(watch_event_json).collect();
        json!({ "watch": {
            "header": header_json(self.header()),
            "watch_id": self.watch_id(),
            "created": self.created(),
            "canceled": self.canceled(),
            "compact_revision": self.compact_revision(),
            "cancel_reason": self.cancel_reason(),
            "events": events,
        }})
    }
}

/// The next message of a watch stream, waiting at most [`WATCH_MESSAGE_TIMEOUT`]. Anything but
/// a message (time-out, end of stream, error) comes back as a recordable `Err`.
pub async fn next_watch_message(stream: &mut WatchStream) -> Result<WatchResponse, Value> {
    match tokio::time::timeout(WATCH_MESSAGE_TIMEOUT, stream.message()).await {
        Ok(Ok(Some(response))) => Ok(response),
        Ok(Ok(None)) => Err(json!({ "watch stream": "ended" })),
        Ok(Err(error)) => Err(error_json(&error)),
        Err(_) => Err(json!({
            "watch stream": format!("no message within {WATCH_MESSAGE_TIMEOUT:?}")
        })),
    }
}

/// The masked results of one run of a scenario, step by step.
#[derive(Debug, Default)]
pub struct Recorder {
    steps: Vec<(String, Value)>,
}

impl Recorder {
    /// Records the response or the error under `label` and hands the response back, so a
    /// scenario can also use it (for example to read a revision).
    pub fn record<T: Record>(
        &mut self,
        label: impl Into<String>,
        result: Result<T, EtcdError>,
    ) -> Option<T> {
        match result {
            Ok(response) => {
                self.note(label, response.to_json());
                Some(response)
            }
            Err(error) => {
                self.note(label, error_json(&error));
                None
            }
        }
    }

    /// Records an error by its gRPC code only, for errors whose message is the gRPC library's
    /// own text (grpc-go's and tonic's differ and no client matches on them).
    pub fn record_code_only<T: Record>(
        &mut self,
        label: impl Into<String>,
        result: Result<T, EtcdError>,
    ) -> Option<T> {
        match result {
            Ok(response) => {
                self.note(label, response.to_json());
                Some(response)
            }
            Err(EtcdError::GRpcStatus(status)) => {
                self.note(
                    label,
                    json!({ "error": { "code": format!("{:?}", status.code()) } }),
                );
                None
            }
            Err(error) => {
                self.note(label, error_json(&error));
                None
            }
        }
    }

    /// Waits (bounded, [`next_watch_message`]) for the next message of `stream` and records it,
    /// or records why there was none.
    pub async fn record_watch(
        &mut self,
        label: impl Into<String>,
        stream: &mut WatchStream,
    ) -> Option<WatchResponse> {
        match next_watch_message(stream).await {
            Ok(response) => {
                self.note(label, response.to_json());
                Some(response)
            }
            Err(why) => {
                self.note(label, why);
                None
            }
        }
    }

    /// Records a fact the scenario relies on and asserts it, so that a fact false on both
    /// servers fails instead of agreeing.
    #[allow(dead_code)]
    pub fn fact(&mut self, label: impl Into<String>, holds: bool) {
        let label = label.into();
        assert!(holds, "expected to hold: {label}");
        self.note(label, Value::Bool(holds));
    }

    /// Records an arbitrary value.
    pub fn note(&mut self, label: impl Into<String>, value: Value) {
        self.steps.push((label.into(), value));
    }

    pub fn steps(&self) -> &[(String, Value)] {
        &self.steps
    }
}

// ---------------------------------------------------------------------------------------------
// Differential runs
// ---------------------------------------------------------------------------------------------

/// A scenario's future; it borrows the client and the recorder.
pub type ScenarioFuture<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Runs `scenario` against a fresh etcd and a fresh leasehold and asserts that both recorded
/// the same steps. Write a scenario as
/// `|c, r| Box::pin(async move { r.record("put a", c.put("a", "1", None).await); })`.
pub async fn differential<F>(name: &str, scenario: F)
where
    F: for<'a> Fn(&'a mut Client, &'a mut Recorder) -> ScenarioFuture<'a>,
{
    let (etcd, leasehold) = tokio::join!(Etcd::start(), Leasehold::start());
    let expected = run_scenario(&etcd, &scenario).await;
    let actual = run_scenario(&leasehold, &scenario).await;
    assert_same_recordings(name, &etcd, &expected, &leasehold, &actual);
}

/// Runs `scenario` once against `server` and returns what it recorded.
pub async fn run_scenario<F>(server: &Server, scenario: &F) -> Recorder
where
    F: for<'a> Fn(&'a mut Client, &'a mut Recorder) -> ScenarioFuture<'a>,
{
    let mut client = server.client().await;
    let mut recorder = Recorder::default();
    if tokio::time::timeout(SCENARIO_TIMEOUT, scenario(&mut client, &mut recorder))
        .await
        .is_err()
    {
        server.fail(&format!(
            "scenario ran longer than {SCENARIO_TIMEOUT:?} (after {} steps)",
            recorder.steps.len()
        ));
    }
    recorder
}

/// Panics with a step-by-step diff unless both recordings are equal.
///
/// With `LEASEHOLD_DIFF_DUMP=<dir>`, both recordings are also written to
/// `<dir>/<name>.<label>.json`, to read what a scenario actually exercises.
pub fn assert_same_recordings(
    name: &str,
    expected_server: &Server,
    expected: &Recorder,
    actual_server: &Server,
    actual: &Recorder,
) {
    if let Some(dir) = std::env::var_os(DUMP_VAR) {
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir).expect("create dump dir");
        for (server, recorder) in [(expected_server, expected), (actual_server, actual)] {
            let steps: Vec<Value> = recorder
                .steps
                .iter()
                .map(|(label, value)| json!({ "step": label, "result": value }))
                .collect();
            let path = dir.join(format!("{name}.{}.json", server.label()));
            let text = serde_json::to_string_pretty(&steps).expect("serialize");
            std::fs::write(&path, text).expect("write dump");
        }
    }
    let diff = diff_recordings(
        expected_server.label(),
        expected,
        actual_server.label(),
        actual,
    );
    if let Some(diff) = diff {
        panic!("differential `{name}` failed\n{diff}");
    }
}

/// `None` when equal; otherwise a readable report of every differing step.
pub fn diff_recordings(
    expected_name: &str,
    expected: &Recorder,
    actual_name: &str,
    actual: &Recorder,
) -> Option<String> {
    let steps_len = expected.steps.len().max(actual.steps.len());
    let mut report = String::new();
    let mut differing = 0usize;
    for index in 0..steps_len {
        let left = expected.steps.get(index);
        let right = actual.steps.get(index);
        if left == right {
            continue;
        }
        differing += 1;
        let label = left.or(right).map_or("", |(label, _)| label.as_str());
        let _ = writeln!(report, "\n=== step {index} `{label}` ===");
        if let (Some((l, _)), Some((r, _))) = (left, right)
            && l != r
        {
            let _ = writeln!(
                report,
                "labels differ: `{l}` vs `{r}` (scenario not deterministic?)"
            );
        }
        let render = |step: Option<&(String, Value)>| match step {
            Some((_, value)) => serde_json::to_string_pretty(value).expect("serialize"),
            None => String::from("<no such step>"),
        };
        report.push_str(&line_diff(&render(left), &render(right)));
    }
    if differing == 0 {
        return None;
    }
    Some(format!(
        "{differing} of {steps_len} steps differ ({} steps from {expected_name}, {} from \
         {actual_name}); lines: `-` {expected_name} only, `+` {actual_name} only, ` ` both{report}",
        expected.steps.len(),
        actual.steps.len()
    ))
}

/// A line diff by longest common subsequence; inputs are a few hundred lines at most.
fn line_diff(left: &str, right: &str) -> String {
    let a: Vec<&str> = left.lines().collect();
    let b: Vec<&str> = right.lines().collect();
    // lcs[i][j] = length of the LCS of a[i..] and b[j..].
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut out = String::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            let _ = writeln!(out, "  {}", a[i]);
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            let _ = writeln!(out, "- {}", a[i]);
            i += 1;
        } else {
            let _ = writeln!(out, "+ {}", b[j]);
            j += 1;
        }
    }
    out
}
