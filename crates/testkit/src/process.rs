//! Server processes: one member ([`Server`]) or a cluster of them ([`Cluster`]), real leasehold
//! or real etcd, each bounded in every wait and killed on drop.

use std::fs::OpenOptions;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, Error as EtcdError};
use tempfile::TempDir;

use crate::*;

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
    /// The server binary of this kind.
    pub fn binary(self) -> PathBuf {
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

    /// A fresh leasehold (always leasehold: `setup` may use flags etcd 3.4 lacks) on free
    /// ports, configured as `setup` says; returns once it serves.
    pub async fn start_with(setup: Setup) -> Server {
        Server::launch_with(Kind::Leasehold, "leasehold", None, setup).await
    }

    /// [`Leasehold::start_with`] on an existing data dir (which the caller keeps alive).
    pub async fn start_in_with(data_dir: &Path, setup: Setup) -> Server {
        Server::launch_with(Kind::Leasehold, "leasehold", Some(data_dir), setup).await
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

    /// A fresh etcd configured as `setup` says (flags etcd 3.4 takes); returns once it serves.
    pub async fn start_with(setup: Setup) -> Server {
        Server::launch_with(Kind::Etcd, "etcd", None, setup).await
    }
}

/// How a server is handed its settings (the harness's own: name, data dir, URLs, cluster,
/// timing), as an etcd deployment may hand them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ConfigStyle {
    /// etcd's flags on the command line.
    #[default]
    Flags,
    /// `ETCD_*` environment variables only (a systemd `EnvironmentFile`).
    EnvVars,
    /// A YAML `--config-file` only.
    ConfigFile,
}

/// A server start beyond the defaults: how the settings are handed over, and more of each kind.
#[derive(Clone, Debug, Default)]
pub struct Setup {
    pub style: ConfigStyle,
    /// More command-line arguments (after the harness's own, if any).
    pub args: Vec<String>,
    /// More environment variables.
    pub env: Vec<(String, String)>,
    /// More YAML lines for [`ConfigStyle::ConfigFile`].
    pub yaml: String,
    /// Serve clients (and peers, if it says so) over mutual TLS; flags only.
    pub tls: Option<TlsSetup>,
    /// Peers talk over `https://` with `--peer-auto-tls` (self-signed certificates).
    pub peer_auto_tls: bool,
}

/// A server that serves clients over `https://` with client certificates required, and
/// optionally peers too; tests reach it with the client certificate.
#[derive(Clone, Debug)]
pub struct TlsSetup {
    /// The CA that signed every certificate below; trusted by servers and clients.
    pub ca: PathBuf,
    /// The server's (and a member's peer) certificate.
    pub server: crate::certs::Pair,
    /// What tests present as clients.
    pub client: crate::certs::Pair,
    /// Peers talk over `https://` too, with peer client certificates required.
    pub peers: bool,
    /// `--client-cert-auth` (and its peer twin) given; without it the trusted CA alone is
    /// given, which requires client certificates all the same (etcd's rule).
    pub client_cert_auth: bool,
}

impl TlsSetup {
    /// Mutual TLS for clients (and peers if `peers`) with `certs`.
    pub fn from(certs: &crate::certs::Certs, peers: bool) -> TlsSetup {
        TlsSetup {
            ca: certs.ca.clone(),
            server: certs.server.clone(),
            client: certs.client.clone(),
            peers,
            client_cert_auth: true,
        }
    }

    /// The server's flags.
    fn server_flags(&self) -> Vec<String> {
        let path = |p: &Path| p.display().to_string();
        let mut flags = vec![
            format!("--cert-file={}", path(&self.server.cert)),
            format!("--key-file={}", path(&self.server.key)),
            format!("--trusted-ca-file={}", path(&self.ca)),
        ];
        if self.client_cert_auth {
            flags.push("--client-cert-auth=true".to_owned());
        }
        if self.peers {
            flags.extend([
                format!("--peer-cert-file={}", path(&self.server.cert)),
                format!("--peer-key-file={}", path(&self.server.key)),
                format!("--peer-trusted-ca-file={}", path(&self.ca)),
            ]);
            if self.client_cert_auth {
                flags.push("--peer-client-cert-auth=true".to_owned());
            }
        }
        flags
    }

    /// etcdctl's flags to present the client certificate and trust the CA.
    pub fn etcdctl_flags(&self) -> Vec<String> {
        vec![
            format!("--cacert={}", self.ca.display()),
            format!("--cert={}", self.client.cert.display()),
            format!("--key={}", self.client.key.display()),
        ]
    }

    /// The etcd-client crate's TLS options for the same.
    pub fn client_options(&self) -> etcd_client::TlsOptions {
        let read = |p: &Path| std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(read(&self.ca)))
            .identity(etcd_client::Identity::from_pem(
                read(&self.client.cert),
                read(&self.client.key),
            ))
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
    pub(crate) client_port: u16,
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
    /// How the settings are handed over, and more environment variables and YAML.
    setup: Setup,
}

impl Server {
    async fn launch(kind: Kind, label: &str, data_dir: Option<&Path>) -> Server {
        Server::launch_with(kind, label, data_dir, Setup::default()).await
    }

    async fn launch_with(kind: Kind, label: &str, data_dir: Option<&Path>, setup: Setup) -> Server {
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
            extra_args: setup.args.clone(),
            setup,
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
        ports: [u16; 2],
        initial_cluster: &str,
        token: &str,
        extra_args: &[&str],
    ) -> Server {
        let setup = Setup {
            args: extra_args.iter().map(|a| a.to_string()).collect(),
            ..Setup::default()
        };
        Server::spawn_member_with(kind, name, ports, initial_cluster, token, setup)
    }

    /// [`Server::spawn_member`] with a [`Setup`].
    pub fn spawn_member_with(
        kind: Kind,
        name: &str,
        ports: [u16; 2],
        initial_cluster: &str,
        token: &str,
        setup: Setup,
    ) -> Server {
        Server::spawn_member_on(kind, name, ports, initial_cluster, token, setup, |_| {})
    }

    /// [`Server::spawn_member_with`] on a data dir that `make` creates first, given its path
    /// (which does not exist yet): `snapshot restore` for the member that then starts with
    /// exactly that name, cluster and token.
    pub fn spawn_member_on(
        kind: Kind,
        name: &str,
        [client_port, peer_port]: [u16; 2],
        initial_cluster: &str,
        token: &str,
        setup: Setup,
        make: impl FnOnce(&Path),
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
            extra_args: setup.args.clone(),
            setup,
        };
        make(&server.data_dir);
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
        let mut settings = vec![
            ("name", self.member_name.clone()),
            ("data-dir", self.data_dir.display().to_string()),
            ("listen-client-urls", client_url.clone()),
            ("advertise-client-urls", client_url),
            ("listen-peer-urls", peer_url.clone()),
            ("initial-advertise-peer-urls", peer_url),
            ("initial-cluster", initial_cluster),
        ];
        if !self
            .extra_args
            .iter()
            .any(|a| a == "--initial-cluster-state")
        {
            settings.push(("initial-cluster-state", "new".to_owned()));
        }
        settings.push(("initial-cluster-token", token));
        settings.push(("heartbeat-interval", "100".to_owned()));
        settings.push(("election-timeout", "1000".to_owned()));
        let mut command = Command::new(self.kind.binary());
        match self.setup.style {
            ConfigStyle::Flags => {
                for (flag, value) in &settings {
                    command.arg(format!("--{flag}")).arg(value);
                }
            }
            ConfigStyle::EnvVars => {
                for (flag, value) in &settings {
                    let var = format!("ETCD_{}", flag.to_uppercase().replace('-', "_"));
                    command.env(var, value);
                }
            }
            ConfigStyle::ConfigFile => {
                let path = self.root.path().join("etcd.conf.yml");
                let mut yaml: String = settings
                    .iter()
                    .map(|(key, value)| match value.parse::<u64>() {
                        Ok(number) => format!("{key}: {number}\n"),
                        Err(_) => format!("{key}: '{value}'\n"),
                    })
                    .collect();
                yaml.push_str(&self.setup.yaml);
                std::fs::write(&path, yaml).expect("write config file");
                command.arg("--config-file").arg(path);
            }
        }
        if let Some(tls) = &self.setup.tls {
            assert_eq!(
                self.setup.style,
                ConfigStyle::Flags,
                "TLS is set up with flags"
            );
            command.args(tls.server_flags());
        }
        if self.setup.peer_auto_tls {
            command.arg("--peer-auto-tls");
        }
        let child = command
            .args(&self.extra_args)
            .envs(self.setup.env.iter().map(|(k, v)| (k, v)))
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
            let endpoint = self.endpoint();
            let probed = probe(&endpoint, self.setup.tls.as_ref());
            match tokio::time::timeout(Duration::from_secs(3), probed).await {
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
        let scheme = if self.setup.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    pub fn peer_url(&self) -> String {
        let tls = self.setup.tls.as_ref().is_some_and(|t| t.peers) || self.setup.peer_auto_tls;
        let scheme = if tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.peer_port)
    }

    /// The TLS this server serves with, if any.
    pub fn tls(&self) -> Option<&TlsSetup> {
        self.setup.tls.as_ref()
    }

    /// What etcdctl needs to reach this server: its TLS flags, if any.
    pub fn etcdctl_flags(&self) -> Vec<String> {
        self.tls().map(TlsSetup::etcdctl_flags).unwrap_or_default()
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

    /// The server's own temporary directory (its log, its config file, ...), removed on drop.
    pub fn root_dir(&self) -> &Path {
        self.root.path()
    }

    /// The process's stdout and stderr so far, every start's.
    pub fn log(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.log_path).unwrap_or_default()).into_owned()
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
        let mut options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(REQUEST_TIMEOUT);
        if let Some(tls) = self.tls() {
            options = options.with_tls(tls.client_options());
        }
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

    /// Adds flags for the next start (`spawn`, `restart`).
    pub fn add_args(&mut self, args: &[&str]) {
        self.extra_args.extend(args.iter().map(|a| a.to_string()));
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

pub(crate) fn kind_label(kind: Kind) -> &'static str {
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
        let setup = Setup {
            args: extra_args.iter().map(|a| a.to_string()).collect(),
            ..Setup::default()
        };
        Cluster::start_with_setup(kind, size, setup).await
    }

    /// [`Cluster::start`] with a [`Setup`] for every member (flags style).
    pub async fn start_with_setup(kind: Kind, size: usize, setup: Setup) -> Cluster {
        let peer_scheme = if setup.tls.as_ref().is_some_and(|t| t.peers) || setup.peer_auto_tls {
            "https"
        } else {
            "http"
        };
        let mut ports = Vec::new();
        for _ in 0..size {
            ports.push(free_ports::<2>());
        }
        let names: Vec<String> = (1..=size).map(|i| format!("m{i}")).collect();
        let initial_cluster = names
            .iter()
            .zip(&ports)
            .map(|(name, [_, peer])| format!("{name}={peer_scheme}://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!("{}-cluster-{}", kind_label(kind), ports[0][1]);
        let mut members: Vec<Server> = names
            .iter()
            .zip(&ports)
            .map(|(name, ports)| {
                let setup = setup.clone();
                Server::spawn_member_with(kind, name, *ports, &initial_cluster, &token, setup)
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
    /// after a MemberAdd for `peer_port`; returns its index once it serves. Its
    /// `--initial-cluster` is every member started or joined so far and itself, as `etcdctl
    /// member add` prints it while none has been removed.
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
        self.initial_cluster = initial_cluster;
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

pub(crate) async fn probe(endpoint: &str, tls: Option<&TlsSetup>) -> Result<(), EtcdError> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(1))
        .with_timeout(Duration::from_secs(2));
    if let Some(tls) = tls {
        options = options.with_tls(tls.client_options());
    }
    let mut client = Client::connect([endpoint], Some(options)).await?;
    client.get("leasehold-test-readiness-probe", None).await?;
    Ok(())
}
