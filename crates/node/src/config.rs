//! A member's configuration: etcd's server flags with etcd's names and defaults, and the
//! identity etcd derives from them (member and cluster IDs from peer URLs and the cluster token).
//!
//! Every etcd 3.5 server flag is declared here once, as a clap argument: the flags leasehold
//! implements as fields of [`NodeConfig`], the TLS flags in `tls.rs`, and the flags that have no
//! effect here in `inert.rs`'s table. `sources.rs` maps `ETCD_*` variables and config file keys
//! onto these same arguments.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use leasehold_server::{AutoCompaction, identity};

use crate::inert::InertFlags;
use crate::tls::TlsFlags;
use crate::values::{parse_duration, parse_go_bool, parse_positive_duration};

#[derive(Args, Debug, Clone)]
pub struct NodeConfig {
    /// A YAML file with etcd's configuration keys; when given, every other flag and `ETCD_*`
    /// variable is ignored (as etcd does).
    #[arg(long)]
    pub config_file: Option<PathBuf>,
    /// Human-readable name for this member.
    #[arg(long, default_value = "default")]
    pub name: String,
    /// Path to the data directory (default `<name>.etcd`, as etcd's and as `snapshot restore`
    /// writes it). Read it through [`NodeConfig::data_dir`].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Comma-separated URLs to listen on for client traffic.
    #[arg(long, default_value = "http://127.0.0.1:2379")]
    pub listen_client_urls: String,
    /// Comma-separated client URLs to advertise (defaults to the listen URLs).
    #[arg(long)]
    pub advertise_client_urls: Option<String>,
    /// Comma-separated URLs to listen on for peer traffic (Raft and forwarding between members).
    #[arg(long, default_value = "http://127.0.0.1:2380")]
    pub listen_peer_urls: String,
    /// Comma-separated URLs to listen on for HTTP client traffic only: the JSON gateway
    /// (`/v3/...`), `/health`, `/metrics` and the rest; when given, `--listen-client-urls`
    /// serve gRPC only, as etcd's do.
    #[arg(long, default_value = "")]
    pub listen_client_http_urls: String,
    /// Comma-separated URLs to listen on for etcd's HTTP endpoints only (`/health`, `/livez`,
    /// `/readyz`, `/version`), as etcd's `--listen-metrics-urls`; none by default.
    #[arg(long, default_value = "")]
    pub listen_metrics_urls: String,
    /// `--metrics`: `extensive` adds the gRPC handling-time histograms
    /// (`grpc_server_handling_seconds`); anything else is etcd's `basic`.
    #[arg(long, default_value = "basic")]
    pub metrics: String,
    /// This member's peer URLs to advertise to the rest of the cluster.
    #[arg(long, default_value = INITIAL_ADVERTISE_PEER_URLS_DEFAULT)]
    pub initial_advertise_peer_urls: String,
    /// Initial cluster configuration for bootstrapping, `name=peerURL,...`.
    #[arg(long)]
    pub initial_cluster: Option<String>,
    /// `new` or `existing`.
    #[arg(long, default_value = "new")]
    pub initial_cluster_state: String,
    /// Initial cluster token, mixed into the member and cluster IDs.
    #[arg(long, default_value = INITIAL_CLUSTER_TOKEN_DEFAULT)]
    pub initial_cluster_token: String,
    /// Time (in milliseconds) of a heartbeat interval.
    #[arg(long, default_value_t = 100)]
    pub heartbeat_interval: u64,
    /// Time (in milliseconds) for an election to timeout.
    #[arg(long, default_value_t = 1000)]
    pub election_timeout: u64,
    /// leasehold's own: how far a lease's durable cover reaches beyond the deadline a renewal
    /// through the log gives, e.g. `5s`. The leader answers renewals within the cover from
    /// memory, without a log write; a dead holder's lease outlives its deadline by at most this
    /// much when the leader fails (docs/lease.md). `0s` writes every renewal to the log.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub lease_cover_margin: Duration,
    /// Refuse a membership change that would leave the cluster without a working quorum:
    /// adding a member while too few peers were heard from for 5 s (`etcdserver: unhealthy
    /// cluster`), or removing one that leaves too few started members.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "true", value_parser = parse_go_bool)]
    pub strict_reconfig_check: bool,
    /// Disaster recovery, as etcd's flag: on a data dir that holds a cluster, this member removes
    /// every other member with membership changes it commits alone, and leads a cluster of one
    /// with all the data its log holds. Without a data dir it does nothing.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "false", value_parser = parse_go_bool)]
    pub force_new_cluster: bool,
    /// Serve etcd's JSON gateway (`/v3/...`) on the client URLs, as etcd does by default.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "true", value_parser = parse_go_bool)]
    pub enable_grpc_gateway: bool,
    /// Before serving clients, compare this member's KV hash with every reachable peer's and
    /// refuse to start if one with the same compaction point differs.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "false", value_parser = parse_go_bool)]
    pub experimental_initial_corrupt_check: bool,
    /// How often the leader compares every member's KV hash and raises CORRUPT on a mismatch,
    /// e.g. `1m`; `0` (the default) never.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub experimental_corrupt_check_time: Duration,
    /// How often idle watchers that asked for progress notifications get one, e.g. `10m`, `5s`,
    /// `500ms`.
    #[arg(long, default_value = "10m", value_parser = parse_positive_duration)]
    pub experimental_watch_progress_notify_interval: Duration,
    /// etcd 3.6's name for `--experimental-watch-progress-notify-interval` (the only one etcd
    /// 3.7 takes, and the one kubeadm writes); wins when both are given.
    #[arg(long, value_parser = parse_positive_duration)]
    pub watch_progress_notify_interval: Option<Duration>,
    /// A unary gRPC request that takes longer than this is logged as a warning (`request
    /// stats`, etcd's words); at `--log-level=debug` every one is. Default 300ms.
    #[arg(long, value_parser = parse_duration)]
    pub warning_unary_request_duration: Option<Duration>,
    /// Before serving, defragment the database file if that would free at least this many
    /// MiB (`0`, the default: never), as etcd does at start-up.
    #[arg(long)]
    pub bootstrap_defrag_threshold_megabytes: Option<u64>,
    /// etcd 3.5's name for `--bootstrap-defrag-threshold-megabytes`, which wins when both are
    /// given.
    #[arg(long)]
    pub experimental_bootstrap_defrag_threshold_megabytes: Option<u64>,
    /// The leader compares every member's hash at its latest compaction revisions every
    /// `--compact-hash-check-time`, and raises CORRUPT for a member that differs (etcd 3.5's
    /// flag; the `CompactHashCheck` feature gate wins over it).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "false", value_parser = parse_go_bool)]
    pub experimental_compact_hash_check_enabled: bool,
    /// How often the compaction hash check runs (default 1m).
    #[arg(long, value_parser = parse_duration)]
    pub compact_hash_check_time: Option<Duration>,
    /// etcd 3.5's name for `--compact-hash-check-time`, which wins when both are given.
    #[arg(long, value_parser = parse_duration)]
    pub experimental_compact_hash_check_time: Option<Duration>,
    /// A compaction's rows leave the database file at most this many per durable transaction
    /// (0: etcd's 1,000; negative: all at once).
    #[arg(long, allow_negative_numbers = true)]
    pub compaction_batch_limit: Option<i64>,
    /// etcd 3.5's name for `--compaction-batch-limit`; the newer name wins when both are given.
    #[arg(long, allow_negative_numbers = true)]
    pub experimental_compaction_batch_limit: Option<i64>,
    /// The pause between two batches of a compaction's removals (0: etcd's 10ms).
    #[arg(long, value_parser = parse_duration)]
    pub compaction_sleep_interval: Option<Duration>,
    /// etcd 3.5's name for `--compaction-sleep-interval`; the newer name wins when both are
    /// given.
    #[arg(long, value_parser = parse_duration)]
    pub experimental_compaction_sleep_interval: Option<Duration>,
    /// etcd 3.6's name for `--experimental-corrupt-check-time`; wins when both are given.
    #[arg(long, value_parser = parse_duration)]
    pub corrupt_check_time: Option<Duration>,
    /// etcd 3.6's server feature gates, `Name=bool,...` (kubeadm writes
    /// `InitialCorruptCheck=true`): `InitialCorruptCheck` is
    /// `--experimental-initial-corrupt-check`, and wins over it; etcd's other gates are taken
    /// and have no effect here.
    #[arg(long, value_parser = parse_feature_gates)]
    pub feature_gates: Option<FeatureGates>,
    /// `periodic` (keep `--auto-compaction-retention` of history by time) or `revision` (keep
    /// that many revisions).
    #[arg(long, default_value = "periodic")]
    pub auto_compaction_mode: String,
    /// How much history automatic compaction keeps: an integer counts hours (`periodic`) or
    /// revisions (`revision`), or a duration such as `30m`; `0` turns it off.
    #[arg(long, default_value = "0")]
    pub auto_compaction_retention: String,
    /// Size of the database file past which writes that add data raise the NOSPACE alarm and
    /// are refused; 0 is etcd's default (2 GiB), a negative value turns the quota off.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub quota_backend_bytes: i64,
    /// How auth tokens are made: `simple` (random, held in memory by every member, ended after
    /// `--auth-token-ttl` unused) or `jwt,pub-key=<file>,priv-key=<file>,sign-method=<alg>,ttl=<d>`
    /// (signed; any member verifies them).
    #[arg(long, default_value = "simple")]
    pub auth_token: String,
    /// Seconds a simple auth token lives unused (0 or less: 300, etcd's default).
    #[arg(long, default_value_t = 300, allow_negative_numbers = true)]
    pub auth_token_ttl: i64,
    /// bcrypt cost of stored passwords (outside 4..=31: 10, etcd's default).
    #[arg(long, default_value_t = 10)]
    pub bcrypt_cost: u32,
    /// Raft entries between snapshots of the state machine (etcd's --snapshot-count).
    #[arg(long, default_value_t = leasehold_raft::SNAPSHOT_COUNT_DEFAULT)]
    pub snapshot_count: u64,
    /// Largest client request, in bytes, that may enter the log.
    #[arg(long, default_value_t = leasehold_server::REQUEST_BYTES_MAX_DEFAULT)]
    pub max_request_bytes: usize,
    /// Most operations in one transaction.
    #[arg(long, default_value_t = leasehold_server::TXN_OPS_MAX_DEFAULT)]
    pub max_txn_ops: usize,
    /// Idle time after which the server pings a client connection (0: the default, 2h).
    #[arg(long, default_value = "2h", value_parser = parse_duration)]
    pub grpc_keepalive_interval: Duration,
    /// How long the server waits for a ping's answer before it closes the connection (0: the
    /// default, 20s).
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pub grpc_keepalive_timeout: Duration,
    /// Least severe level logged (`LEASEHOLD_LOG`, a tracing filter, wins when set).
    #[arg(long, value_enum, ignore_case = true, default_value_t = LogLevel::Info)]
    pub log_level: LogLevel,
    /// How each log line is written: `json` (etcd's: one JSON object a line with `level`, `ts`,
    /// `caller` and `msg`, as zap writes it) or `console` (leasehold's lines for people,
    /// coloured on a terminal).
    #[arg(long, default_value = "json", value_parser = parse_log_format)]
    pub log_format: LogFormat,
    /// Only `zap`, etcd 3.5's only logger; accepted for compatibility.
    #[arg(long, default_value = "zap", value_parser = parse_logger)]
    pub logger: String,
    /// Comma-separated log targets: `default` (stderr), `stderr`, `stdout`, `systemd/journal`
    /// (stderr, which systemd passes to the journal) or file paths.
    #[arg(long, value_delimiter = ',', action = clap::ArgAction::Set, default_value = "default")]
    pub log_outputs: Vec<String>,
    #[command(flatten)]
    pub tls: TlsFlags,
    #[command(flatten)]
    pub inert: InertFlags,
}

/// `--log-level`: zap's levels, as etcd takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
    Dpanic,
    Panic,
    Fatal,
}

impl LogLevel {
    /// The `tracing` level that logs what zap logs at this level (zap's panic and fatal levels
    /// log only errors that end the process, which are errors here).
    pub fn tracing_level(self) -> &'static str {
        match self {
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error | LogLevel::Dpanic | LogLevel::Panic | LogLevel::Fatal => "error",
        }
    }
}

/// `--log-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// etcd's default: zap's JSON encoder with etcd's settings.
    Json,
    /// Human-readable lines.
    Console,
}

fn parse_log_format(s: &str) -> Result<LogFormat, String> {
    match s {
        "json" | "" => Ok(LogFormat::Json),
        "console" => Ok(LogFormat::Console),
        // etcd's words.
        _ => Err(format!(
            "unknown log format: {s}, supported values json, console"
        )),
    }
}

/// Where the log goes, one `--log-outputs` entry each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogTarget {
    Stderr,
    Stdout,
    /// Appended to.
    File(PathBuf),
}

fn parse_logger(s: &str) -> Result<String, String> {
    match s {
        "zap" => Ok(s.to_owned()),
        "capnslog" => Err("--logger=capnslog is removed in v3.5".to_owned()),
        _ => Err(format!("unknown logger option {s:?}")),
    }
}

/// `--initial-advertise-peer-urls` when not given. `snapshot restore` takes the same default, so
/// a member restored and then started with neither flag has the same identity.
pub const INITIAL_ADVERTISE_PEER_URLS_DEFAULT: &str = "http://127.0.0.1:2380";

/// `--initial-cluster-token` when not given (etcd's).
pub const INITIAL_CLUSTER_TOKEN_DEFAULT: &str = "etcd-cluster";

/// The member's identity: etcd's bootstrap flags, and the member's and the cluster's IDs (derived
/// from them as etcd derives them, or as the data dir or the joined cluster holds them).
#[derive(Debug, PartialEq, Eq)]
pub struct Identity {
    pub member_id: u64,
    pub cluster_id: u64,
    pub peer_urls: Vec<String>,
    /// The other members of the initial cluster: id → first peer URL.
    pub peers: std::collections::BTreeMap<u64, String>,
    /// Every member of the initial cluster: id → name.
    pub names: std::collections::BTreeMap<u64, String>,
    /// `--initial-cluster` as given: name → peer URLs (sorted).
    pub initial: Vec<(String, Vec<String>)>,
}

pub(crate) fn split_urls(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect()
}

impl NodeConfig {
    /// How often idle watchers that asked for progress get one: etcd 3.6's flag, else 3.5's.
    pub fn watch_progress_interval(&self) -> Duration {
        self.watch_progress_notify_interval
            .unwrap_or(self.experimental_watch_progress_notify_interval)
    }

    /// How often the leader compares every member's KV hash (zero: never): etcd 3.6's flag,
    /// else 3.5's.
    pub fn corrupt_check_period(&self) -> Duration {
        self.corrupt_check_time
            .unwrap_or(self.experimental_corrupt_check_time)
    }

    /// How often the compaction hash check runs; `None` when it is off (the `CompactHashCheck`
    /// feature gate if given, else `--experimental-compact-hash-check-enabled`).
    pub fn compact_hash_check_period(&self) -> Option<Duration> {
        let on = self
            .feature_gates
            .as_ref()
            .and_then(|g| g.get("CompactHashCheck"))
            .unwrap_or(self.experimental_compact_hash_check_enabled);
        on.then(|| {
            self.compact_hash_check_time
                .or(self.experimental_compact_hash_check_time)
                .unwrap_or(Duration::from_secs(60))
        })
        .filter(|d| !d.is_zero())
    }

    /// `--warning-unary-request-duration`, default 300ms.
    pub fn warning_unary_request_duration(&self) -> Duration {
        self.warning_unary_request_duration
            .unwrap_or(Duration::from_millis(300))
    }

    /// How a compaction's rows leave the file: `--compaction-batch-limit` and
    /// `--compaction-sleep-interval` (else etcd 3.5's names), etcd's defaults for 0.
    pub fn compaction_pace(&self) -> leasehold_raft::CompactionPace {
        let etcd = leasehold_raft::CompactionPace::default();
        let batch_limit = match self
            .compaction_batch_limit
            .or(self.experimental_compaction_batch_limit)
        {
            None | Some(0) => etcd.batch_limit,
            Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        };
        let pause = self
            .compaction_sleep_interval
            .or(self.experimental_compaction_sleep_interval)
            .filter(|d| !d.is_zero())
            .unwrap_or(etcd.pause);
        leasehold_raft::CompactionPace { batch_limit, pause }
    }

    /// `--bootstrap-defrag-threshold-megabytes` in bytes; `None` when off.
    pub fn bootstrap_defrag_threshold(&self) -> Option<u64> {
        self.bootstrap_defrag_threshold_megabytes
            .or(self.experimental_bootstrap_defrag_threshold_megabytes)
            .filter(|&mb| mb > 0)
            .map(|mb| mb.saturating_mul(1 << 20))
    }

    /// Whether the initial corruption check runs: the `InitialCorruptCheck` feature gate if
    /// given, else `--experimental-initial-corrupt-check`.
    pub fn initial_corrupt_check(&self) -> bool {
        self.feature_gates
            .as_ref()
            .and_then(|g| g.get("InitialCorruptCheck"))
            .unwrap_or(self.experimental_initial_corrupt_check)
    }

    pub fn identity(&self) -> anyhow::Result<Identity> {
        self.identity_with(Ids::Etcd)
    }

    pub(crate) fn identity_with(&self, ids: Ids) -> anyhow::Result<Identity> {
        Identity::derive_with(
            ids,
            &self.name,
            self.initial_cluster.as_deref(),
            &self.initial_advertise_peer_urls,
            &self.initial_cluster_token,
        )
    }
}

/// How a member's and a cluster's IDs are derived from the flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ids {
    /// etcd's derivation (`leasehold_server::identity`).
    Etcd,
    /// Earlier builds' derivation, kept by the data dirs they made (`identity::legacy`).
    Legacy,
}

impl Identity {
    /// A member's identity from etcd's bootstrap flags: `--name`, `--initial-cluster` (when not
    /// given: this member alone, at `--initial-advertise-peer-urls`) and
    /// `--initial-cluster-token`. Serving and `snapshot restore` both derive it here.
    pub fn derive(
        name: &str,
        initial_cluster: Option<&str>,
        initial_advertise_peer_urls: &str,
        token: &str,
    ) -> anyhow::Result<Identity> {
        Identity::derive_with(
            Ids::Etcd,
            name,
            initial_cluster,
            initial_advertise_peer_urls,
            token,
        )
    }

    pub fn derive_with(
        ids: Ids,
        name: &str,
        initial_cluster: Option<&str>,
        initial_advertise_peer_urls: &str,
        token: &str,
    ) -> anyhow::Result<Identity> {
        let advertised = split_urls(initial_advertise_peer_urls);
        let initial = initial_cluster
            .map(str::to_owned)
            .unwrap_or_else(|| format!("{name}={}", advertised.join(&format!(",{name}="))));
        let mut members: Vec<(String, String)> = Vec::new();
        for entry in split_urls(&initial) {
            let Some((member, url)) = entry.split_once('=') else {
                bail!("--initial-cluster: expected name=url, got {entry:?}");
            };
            members.push((member.to_owned(), url.to_owned()));
        }
        let mut by_name: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
        for (member, url) in &members {
            by_name
                .entry(member.as_str())
                .or_default()
                .push(url.clone());
        }
        for urls in by_name.values_mut() {
            urls.sort();
        }
        let Some(mine) = by_name.get(name).cloned() else {
            bail!("couldn't find local name {name:?} in the initial cluster configuration");
        };
        let id_of = |urls: &[String]| match ids {
            Ids::Etcd => identity::member_id(urls, token, None),
            Ids::Legacy => identity::legacy::member_id(urls, token),
        };
        let member_id = id_of(&mine);
        let mut peers = std::collections::BTreeMap::new();
        let mut names = std::collections::BTreeMap::new();
        for (other, urls) in &by_name {
            let id = id_of(urls);
            names.insert(id, (*other).to_owned());
            if *other != name {
                peers.insert(id, urls[0].clone());
            }
        }
        if peers.contains_key(&member_id) {
            bail!("--initial-cluster: two members share the peer URLs {mine:?}");
        }
        let cluster_id = match ids {
            Ids::Etcd => identity::cluster_id(&names.keys().copied().collect::<Vec<_>>()),
            Ids::Legacy => identity::legacy::cluster_id(token),
        };
        Ok(Identity {
            member_id,
            cluster_id,
            peer_urls: mine,
            peers,
            names,
            initial: by_name
                .into_iter()
                .map(|(name, urls)| (name.to_owned(), urls))
                .collect(),
        })
    }

    /// This identity with the IDs a data dir holds (or a joined cluster gave): the member's and
    /// the cluster's, and the other members it started with. Names come from
    /// `--initial-cluster`, matched by peer URL.
    pub fn with_ids(self, member_id: u64, cluster_id: u64, peers: &[(u64, String)]) -> Identity {
        let name_of = |url: &str| {
            self.initial
                .iter()
                .find(|(_, urls)| urls.iter().any(|u| u == url))
                .map(|(name, _)| name.clone())
        };
        let mut names = std::collections::BTreeMap::new();
        let mut others = std::collections::BTreeMap::new();
        for (id, url) in peers {
            if let Some(name) = name_of(url) {
                names.insert(*id, name);
            }
            if *id != member_id {
                others.insert(*id, url.clone());
            }
        }
        if let Some(name) = self.peer_urls.first().and_then(|u| name_of(u)) {
            names.insert(member_id, name);
        }
        Identity {
            member_id,
            cluster_id,
            peers: others,
            names,
            ..self
        }
    }
}

impl NodeConfig {
    /// `--log-outputs` as targets, refused as etcd refuses them: `default` only alone, and
    /// `systemd/journal` only alone. The journal is written through stderr (systemd passes a
    /// unit's stderr to the journal).
    pub fn log_targets(&self) -> anyhow::Result<Vec<LogTarget>> {
        let outputs: Vec<&str> = self
            .log_outputs
            .iter()
            .map(String::as_str)
            .filter(|o| !o.is_empty())
            .collect();
        if outputs.len() > 1 && outputs.contains(&"default") {
            bail!("multi logoutput for \"default\" is not supported yet");
        }
        if outputs.len() > 1 && outputs.contains(&"systemd/journal") {
            bail!(
                "running with systemd/journal but other '--log-outputs' values ({outputs:?}) are \
                 configured; override them with one target"
            );
        }
        let mut targets = Vec::new();
        for output in outputs {
            let target = match output {
                "default" | "stderr" | "systemd/journal" => LogTarget::Stderr,
                "stdout" => LogTarget::Stdout,
                path => LogTarget::File(PathBuf::from(path)),
            };
            if !targets.contains(&target) {
                targets.push(target);
            }
        }
        if targets.is_empty() {
            targets.push(LogTarget::Stderr);
        }
        Ok(targets)
    }

    /// `--max-request-bytes` and `--max-txn-ops`.
    pub fn limits(&self) -> leasehold_server::Limits {
        leasehold_server::Limits {
            request_bytes_max: self.max_request_bytes,
            txn_ops_max: self.max_txn_ops,
        }
    }

    /// `--grpc-keepalive-interval` and `--grpc-keepalive-timeout`.
    pub fn keepalive(&self) -> leasehold_server::GrpcKeepalive {
        leasehold_server::GrpcKeepalive {
            interval: self.grpc_keepalive_interval,
            timeout: self.grpc_keepalive_timeout,
        }
    }

    /// Checks the flags that a member needs to start, without touching the network; reads the
    /// TLS files, so a bad one is reported before anything starts.
    /// The data directory: `--data-dir`, else `<name>.etcd` in the working directory, as etcd
    /// defaults it.
    pub fn data_dir(&self) -> PathBuf {
        self.data_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("{}.etcd", self.name)))
    }

    /// Logs the configuration under etcd's names, as etcd logs its own when it starts, so that
    /// what reads etcd's log finds the same keys. A flag without effect here is reported as
    /// given (or at etcd's default), `v2-deprecation` at the only stage etcd 3.7 enforces.
    pub fn log_as_etcd(&self) {
        let catchup = [
            "snapshot-catchup-entries",
            "experimental-snapshot-catchup-entries",
        ]
        .into_iter()
        .find_map(|flag| self.inert.given(flag))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(5000);
        tracing::info!(
            "name" = %self.name,
            "data-dir" = %self.data_dir().display(),
            "heartbeat-interval" = %format!("{}ms", self.heartbeat_interval),
            "election-timeout" = %format!("{}ms", self.election_timeout),
            "snapshot-count" = self.snapshot_count,
            "snapshot-catchup-entries" = catchup,
            "initial-advertise-peer-urls" = %self.initial_advertise_peer_urls,
            "listen-peer-urls" = %self.listen_peer_urls,
            "advertise-client-urls" = %self.advertise_client_urls.as_deref().unwrap_or_default(),
            "listen-client-urls" = %self.listen_client_urls,
            "listen-metrics-urls" = %self.listen_metrics_urls,
            "initial-cluster" = %self.initial_cluster.as_deref().unwrap_or_default(),
            "initial-cluster-state" = %self.initial_cluster_state,
            "initial-cluster-token" = %self.initial_cluster_token,
            "quota-backend-bytes" = self.quota_backend_bytes,
            "max-request-bytes" = self.max_request_bytes,
            "strict-reconfig-check" = self.strict_reconfig_check,
            "force-new-cluster" = self.force_new_cluster,
            "auto-compaction-mode" = %self.auto_compaction_mode,
            "auto-compaction-retention" = %self.auto_compaction_retention,
            "auth-token" = %self.auth_token.split(',').next().unwrap_or_default(),
            "v2-deprecation" = "write-only",
            "configuration, in etcd's names"
        );
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        self.inert.check()?;
        self.log_targets()?;
        self.identity()?;
        self.client_urls()?;
        self.peer_urls()?;
        self.metrics_urls()?;
        self.client_tls()?;
        self.peer_tls()?;
        self.peer_client_tls()?;
        self.auto_compaction()?;
        self.token_mode()?;
        if self.initial_cluster_state != "new" && self.initial_cluster_state != "existing" {
            bail!("--initial-cluster-state must be 'new' or 'existing'");
        }
        Ok(())
    }

    /// `--auto-compaction-mode` and `--auto-compaction-retention`, read as etcd reads them: an
    /// unknown mode is refused; a retention that is a non-negative integer counts hours
    /// (periodic) or revisions (revision), anything else must be a Go duration (a revision
    /// retention then counts its nanoseconds, as etcd's does). Zero, etcd's default, turns
    /// compaction off (`None`).
    pub fn auto_compaction(&self) -> anyhow::Result<Option<AutoCompaction>> {
        let periodic = match self.auto_compaction_mode.as_str() {
            "periodic" | "" => true,
            "revision" => false,
            other => bail!("unknown auto-compaction-mode {other:?}"),
        };
        let retention = self.auto_compaction_retention.as_str();
        let parsed = match retention.parse::<i64>() {
            Ok(n) if n >= 0 => {
                let n = n.unsigned_abs();
                if periodic {
                    Duration::from_secs(n.saturating_mul(3600))
                } else {
                    Duration::from_nanos(n)
                }
            }
            _ => parse_duration(retention)
                .map_err(|e| anyhow::anyhow!("error parsing CompactionRetention: {e}"))?,
        };
        Ok((!parsed.is_zero()).then(|| {
            if periodic {
                AutoCompaction::Periodic(parsed)
            } else {
                AutoCompaction::Revision(i64::try_from(parsed.as_nanos()).unwrap_or(i64::MAX))
            }
        }))
    }

    /// `--quota-backend-bytes` as etcd reads it: 0 means the default, 2 GiB; negative, none.
    pub fn quota_bytes(&self) -> Option<u64> {
        const DEFAULT: u64 = 2 * 1024 * 1024 * 1024;
        match self.quota_backend_bytes {
            0 => Some(DEFAULT),
            n => u64::try_from(n).ok(),
        }
    }

    /// `--auth-token`: `simple`, or `jwt,pub-key=<file>,priv-key=<file>,sign-method=<alg>[,ttl=<d>]`
    /// (etcd's options; the key files are read here).
    pub fn token_mode(&self) -> anyhow::Result<leasehold_server::jwt::TokenMode> {
        leasehold_server::jwt::TokenMode::parse(&self.auth_token, parse_duration)
            .map_err(|e| anyhow::anyhow!("--auth-token: {e}"))
    }

    /// `--auth-token-ttl`, as etcd reads it.
    pub fn auth_token_ttl(&self) -> Duration {
        match u64::try_from(self.auth_token_ttl) {
            Ok(secs) if secs > 0 => Duration::from_secs(secs),
            _ => Duration::from_secs(300),
        }
    }

    /// `--bcrypt-cost`, as etcd reads it.
    pub fn bcrypt_cost(&self) -> u32 {
        if (4..=31).contains(&self.bcrypt_cost) {
            self.bcrypt_cost
        } else {
            10
        }
    }

    /// `--listen-client-urls`, in order: TCP, or Unix sockets (`unix://`, `unixs://`).
    pub fn client_urls(&self) -> anyhow::Result<Vec<ListenUrl>> {
        let urls = listen_urls("--listen-client-urls", &self.listen_client_urls, true)?;
        Ok(one_listener_per_port(urls))
    }

    /// `--listen-peer-urls`, in order.
    pub fn peer_urls(&self) -> anyhow::Result<Vec<ListenUrl>> {
        listen_urls("--listen-peer-urls", &self.listen_peer_urls, true)
    }

    /// `--listen-client-http-urls`, in order (none when the flag is empty). An `https://` one
    /// serves with the client side's TLS.
    pub fn client_http_urls(&self) -> anyhow::Result<Vec<ListenUrl>> {
        listen_urls(
            "--listen-client-http-urls",
            &self.listen_client_http_urls,
            false,
        )
    }

    /// `--listen-metrics-urls`, in order (none when the flag is empty). An `https://` one
    /// serves with the client side's TLS, as etcd's does.
    pub fn metrics_urls(&self) -> anyhow::Result<Vec<ListenUrl>> {
        listen_urls("--listen-metrics-urls", &self.listen_metrics_urls, false)
    }

    /// The TCP addresses of `--listen-client-urls` (its Unix sockets left out).
    pub fn client_addrs(&self) -> anyhow::Result<Vec<SocketAddr>> {
        Ok(self
            .client_urls()?
            .iter()
            .filter_map(|u| u.addr.tcp())
            .collect())
    }

    /// The TLS configuration of the `https://` client and metrics listeners; `None` when there
    /// are none.
    pub(crate) fn client_tls(&self) -> anyhow::Result<Option<Arc<rustls::ServerConfig>>> {
        let (clients, metrics) = (self.client_urls()?, self.metrics_urls()?);
        let side = self.tls.client.side();
        if metrics.iter().any(|u| u.tls)
            && !clients.iter().any(|u| u.tls)
            && side.cert_file.is_none()
            && side.key_file.is_none()
            && !side.auto_tls
        {
            // etcd's refusal, word for word (its end-to-end suite waits for it).
            bail!(
                "client TLS key/cert (--cert-file, --key-file) must be provided for metrics \
                 secure url"
            );
        }
        let urls = [clients, metrics, self.client_http_urls()?].concat();
        server_tls(&self.tls, self.tls.client.side(), &urls)
    }

    /// The TLS configuration of the `https://` peer listeners; `None` when there are none.
    pub(crate) fn peer_tls(&self) -> anyhow::Result<Option<Arc<rustls::ServerConfig>>> {
        server_tls(&self.tls, self.tls.peer.side(), &self.peer_urls()?)
    }

    /// As etcd warns: certificate flags given for a side none of whose URLs is `https://` are
    /// not used (that side serves plain HTTP).
    pub(crate) fn tls_without_https(&self) -> Vec<String> {
        let unused = |side: crate::tls::Side<'_>, urls: anyhow::Result<Vec<ListenUrl>>| {
            let given = side.cert_file.is_some()
                || side.key_file.is_some()
                || side.trusted_ca_file.is_some()
                || side.client_cert_auth
                || side.auto_tls;
            let https = urls.is_ok_and(|urls| urls.iter().any(|u| u.tls));
            (given && !https).then(|| {
                format!(
                    "--{p}cert-file, --{p}key-file, --{p}trusted-ca-file, --{p}client-cert-auth or --{p}auto-tls given, but no --listen-{side}-urls is https://: serving plain HTTP there",
                    p = side.prefix,
                    side = if side.prefix.is_empty() { "client" } else { "peer" },
                )
            })
        };
        let client_urls = [self.client_urls(), self.metrics_urls()]
            .into_iter()
            .collect::<anyhow::Result<Vec<_>>>()
            .map(|lists| lists.concat());
        [
            unused(self.tls.client.side(), client_urls),
            unused(self.tls.peer.side(), self.peer_urls()),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// How this member reaches `https://` peers; `None` when no peer URL of the initial cluster
    /// or of this member is `https://`.
    pub(crate) fn peer_client_tls(&self) -> anyhow::Result<Option<leasehold_peer::PeerTls>> {
        let identity = self.identity()?;
        let any_https = identity
            .peers
            .values()
            .chain(identity.peer_urls.iter())
            .any(|u| u.starts_with("https://"))
            || self.peer_urls()?.iter().any(|u| u.tls);
        if !any_https {
            return Ok(None);
        }
        self.tls.peer_client_config().map(Some)
    }
}

fn server_tls(
    flags: &TlsFlags,
    side: crate::tls::Side<'_>,
    urls: &[ListenUrl],
) -> anyhow::Result<Option<Arc<rustls::ServerConfig>>> {
    if !urls.iter().any(|u| u.tls) {
        return Ok(None);
    }
    let hosts: Vec<String> = urls
        .iter()
        .map(|u| match &u.addr {
            ListenAddr::Tcp(addr) => addr.ip().to_string(),
            ListenAddr::Unix(_) => "localhost".to_owned(),
        })
        .collect();
    flags.server_config(side, &hosts).map(Some)
}

/// A URL to listen on: where, and whether it serves TLS (`https://`, `unixs://`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenUrl {
    pub addr: ListenAddr,
    pub tls: bool,
    /// TLS and plain on this one port: `--listen-client-urls` named it with `http://` and
    /// `https://` both, which etcd serves on one socket, telling them apart by the first byte.
    pub plain_too: bool,
}

/// Where a listener listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    Tcp(SocketAddr),
    /// A Unix socket's path: what follows `unix://` (etcd's `unix://localhost:2379` is the file
    /// `localhost:2379` in the working directory).
    Unix(std::path::PathBuf),
}

impl ListenAddr {
    pub fn tcp(&self) -> Option<SocketAddr> {
        match self {
            ListenAddr::Tcp(addr) => Some(*addr),
            ListenAddr::Unix(_) => None,
        }
    }
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Tcp(addr) => addr.fmt(f),
            ListenAddr::Unix(path) => path.display().fmt(f),
        }
    }
}

/// `http://` and `https://` URLs of one TCP address become one listener that serves both, as
/// etcd's do; the first of them keeps its place.
fn one_listener_per_port(urls: Vec<ListenUrl>) -> Vec<ListenUrl> {
    let mut merged: Vec<ListenUrl> = Vec::with_capacity(urls.len());
    for url in urls {
        let same_port = merged.iter_mut().find(|m| {
            matches!(m.addr, ListenAddr::Tcp(_)) && m.addr == url.addr && m.tls != url.tls
        });
        match same_port {
            Some(m) => {
                m.tls = true;
                m.plain_too = true;
            }
            None => merged.push(url),
        }
    }
    merged
}

fn listen_urls(flag: &str, urls: &str, unix: bool) -> anyhow::Result<Vec<ListenUrl>> {
    split_urls(urls)
        .iter()
        .map(|u| parse_listen_url(u, unix).with_context(|| format!("{flag} {u:?}")))
        .collect()
}

/// `http://host:port` or `https://host:port` to where to listen and whether with TLS; with
/// `unix`, also `unix://path` and `unixs://path` (TLS), as etcd takes for client URLs.
pub(crate) fn parse_listen_url(url: &str, unix: bool) -> anyhow::Result<ListenUrl> {
    let unix_socket = |tls: bool, path: &str| {
        let path = path.trim_end_matches('/');
        if path.is_empty() {
            bail!("a unix socket URL needs a path");
        }
        Ok(ListenUrl {
            addr: ListenAddr::Unix(path.into()),
            tls,
            plain_too: false,
        })
    };
    let (rest, tls) = if let Some(rest) = url.strip_prefix("http://") {
        (rest, false)
    } else if let Some(rest) = url.strip_prefix("https://") {
        (rest, true)
    } else if let (true, Some(path)) = (unix, url.strip_prefix("unix://")) {
        return unix_socket(false, path);
    } else if let (true, Some(path)) = (unix, url.strip_prefix("unixs://")) {
        return unix_socket(true, path);
    } else if unix {
        bail!("only http://, https://, unix:// and unixs:// URLs are supported");
    } else {
        bail!("only http:// and https:// URLs are supported");
    };
    let hostport = rest.trim_end_matches('/');
    let hostport = hostport.replace("localhost:", "127.0.0.1:");
    let addr = hostport
        .parse()
        .with_context(|| format!("not host:port: {hostport:?}"))?;
    Ok(ListenUrl {
        addr: ListenAddr::Tcp(addr),
        tls,
        plain_too: false,
    })
}

/// Go's `strconv.ParseBool`, as Go's flag package parses a bool flag's value (and words its
/// refusal).
/// etcd's server feature gates (`server/features/etcd_features.go`, 3.7), and the two every
/// Kubernetes-style gate set knows.
const FEATURE_GATES: &[&str] = &[
    "StopGRPCServiceOnDefrag",
    "TxnModeWriteWithSharedBuffer",
    "InitialCorruptCheck",
    "CompactHashCheck",
    "LeaseCheckpoint",
    "LeaseCheckpointPersist",
    "SetMemberLocalAddr",
    "FastLeaseKeepAlive",
    "PriorityRequest",
    "AllAlpha",
    "AllBeta",
];

/// `--feature-gates` as given: each gate named with its value, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FeatureGates(pub Vec<(&'static str, bool)>);

impl FeatureGates {
    /// The value given last for `gate`, if it was given.
    pub fn get(&self, gate: &str) -> Option<bool> {
        self.0
            .iter()
            .rev()
            .find(|(g, _)| *g == gate)
            .map(|(_, v)| *v)
    }

    /// The gates given that change nothing here (all but `InitialCorruptCheck`).
    pub fn without_effect(&self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = self
            .0
            .iter()
            .map(|(g, _)| *g)
            .filter(|g| *g != "InitialCorruptCheck" && *g != "CompactHashCheck")
            .collect();
        names.dedup();
        names
    }
}

/// `Name=bool,...`, as Kubernetes' feature-gate flag reads it (and with its error texts): an
/// unknown gate or a value that is not a Go bool is refused.
pub(crate) fn parse_feature_gates(s: &str) -> Result<FeatureGates, String> {
    let mut gates = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((name, value)) = part.split_once('=') else {
            return Err(format!("missing bool value for {part}"));
        };
        let (name, value) = (name.trim(), value.trim());
        let Some(gate) = FEATURE_GATES.iter().find(|g| **g == name) else {
            return Err(format!("unrecognized feature gate: {name}"));
        };
        let on = leasehold_types::go::parse_bool(value)
            .map_err(|_| format!("invalid value of {name}={value}, err: strconv.ParseBool: parsing {value:?}: invalid syntax"))?;
        gates.push((*gate, on));
    }
    Ok(FeatureGates(gates))
}

#[cfg(test)]
pub(crate) mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct P {
        #[command(flatten)]
        a: NodeConfig,
    }

    pub(crate) fn parse(args: &[&str]) -> NodeConfig {
        P::try_parse_from(std::iter::once("leasehold").chain(args.iter().copied()))
            .unwrap()
            .a
    }

    #[test]
    fn an_https_metrics_url_without_client_certificates_gets_etcds_refusal() {
        let refused = parse(&["--listen-metrics-urls=https://127.0.0.1:0"])
            .client_tls()
            .unwrap_err()
            .to_string();
        assert_eq!(
            refused,
            "client TLS key/cert (--cert-file, --key-file) must be provided for metrics secure url"
        );
        // With auto TLS there is a certificate to serve it with.
        let auto = parse(&["--listen-metrics-urls=https://127.0.0.1:0", "--auto-tls"]);
        assert!(auto.client_tls().unwrap().is_some());
    }

    #[test]
    fn auto_compaction_flags_are_read_as_etcd_reads_them() {
        use AutoCompaction::{Periodic, Revision};
        let read = |mode: &str, retention: &str| {
            parse(&[
                &format!("--auto-compaction-mode={mode}"),
                &format!("--auto-compaction-retention={retention}"),
            ])
            .auto_compaction()
            .map_err(|e| e.to_string())
        };
        let hour = Duration::from_secs(3600);
        assert_eq!(
            parse(&[]).auto_compaction().unwrap(),
            None,
            "off by default"
        );
        assert_eq!(read("periodic", "1"), Ok(Some(Periodic(hour))));
        assert_eq!(read("periodic", "72"), Ok(Some(Periodic(72 * hour))));
        assert_eq!(read("periodic", "30m"), Ok(Some(Periodic(hour / 2))));
        assert_eq!(read("periodic", "0"), Ok(None));
        assert_eq!(read("revision", "1000"), Ok(Some(Revision(1000))));
        assert_eq!(read("revision", "1us"), Ok(Some(Revision(1000))));
        assert_eq!(read("revision", "0"), Ok(None));
        assert_eq!(
            read("hourly", "1"),
            Err("unknown auto-compaction-mode \"hourly\"".to_owned())
        );
        for bad in ["-1", "soon"] {
            let e = read("periodic", bad).unwrap_err();
            assert!(e.starts_with("error parsing CompactionRetention: "), "{e}");
        }
    }

    #[test]
    fn the_space_quota_is_read_as_etcd_reads_it() {
        let two_gib = 2 * 1024 * 1024 * 1024;
        assert_eq!(parse(&[]).quota_bytes(), Some(two_gib), "etcd's default");
        assert_eq!(
            parse(&["--quota-backend-bytes=0"]).quota_bytes(),
            Some(two_gib)
        );
        assert_eq!(
            parse(&["--quota-backend-bytes=4096"]).quota_bytes(),
            Some(4096)
        );
        assert_eq!(
            parse(&["--quota-backend-bytes=-1"]).quota_bytes(),
            None,
            "off"
        );
    }

    #[test]
    fn etcd_flags_parse_with_etcd_names() {
        let a = parse(&[
            "--name",
            "n1",
            "--data-dir",
            "/tmp/x",
            "--listen-client-urls",
            "http://127.0.0.1:1,http://127.0.0.1:2",
            "--advertise-client-urls",
            "http://127.0.0.1:1",
            "--listen-peer-urls",
            "http://127.0.0.1:3",
            "--initial-advertise-peer-urls",
            "http://127.0.0.1:3",
            "--initial-cluster",
            "n1=http://127.0.0.1:3",
            "--initial-cluster-state",
            "new",
            "--initial-cluster-token",
            "t",
            "--heartbeat-interval",
            "50",
            "--election-timeout",
            "500",
        ]);
        assert_eq!(a.client_addrs().unwrap().len(), 2);
        assert_eq!((a.heartbeat_interval, a.election_timeout), (50, 500));
        assert_eq!(
            a.identity().unwrap().peer_urls,
            vec!["http://127.0.0.1:3".to_string()]
        );
    }

    #[test]
    fn identity_is_stable_and_depends_on_urls_and_token() {
        let a = parse(&["--initial-cluster-token", "a"]).identity().unwrap();
        assert_eq!(
            a,
            parse(&["--initial-cluster-token", "a"]).identity().unwrap()
        );
        assert_ne!(
            a.member_id,
            parse(&["--initial-cluster-token", "b"])
                .identity()
                .unwrap()
                .member_id
        );
        assert_ne!(a.member_id, 0);
    }

    #[test]
    fn durations_parse_like_gos() {
        let ok = |s: &str, d: Duration| assert_eq!(parse_duration(s), Ok(d), "{s}");
        ok("10m", Duration::from_secs(600));
        ok("500ms", Duration::from_millis(500));
        ok("1m30s", Duration::from_secs(90));
        ok("1.5h", Duration::from_secs(5400));
        ok("0", Duration::ZERO);
        ok("0s", Duration::ZERO);
        ok("5000000000ns", Duration::from_secs(5));
        ok("2us", Duration::from_micros(2));
        ok(".5s", Duration::from_millis(500));
        for bad in ["5", "", "s", "-1s", "1x", "1.s5", "9999999999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            parse_duration("1"),
            Err(r#"time: missing unit in duration "1""#.to_string()),
            "Go's own error text"
        );
        assert_eq!(
            parse_duration("-1s"),
            Err(r#"a negative duration is not allowed here: "-1s""#.to_string())
        );
        assert_eq!(parse_go_bool("T"), Ok(true));
        assert!(parse_go_bool("yes").is_err());
        assert!(parse_positive_duration("0s").is_err());
        assert_eq!(parse_positive_duration("5s"), Ok(Duration::from_secs(5)));
    }

    #[test]
    fn every_member_derives_the_same_ids() {
        let cluster = "a=http://127.0.0.1:1,b=http://127.0.0.1:2,c=http://127.0.0.1:3";
        let ids: Vec<Identity> = ["a", "b", "c"]
            .iter()
            .map(|n| {
                parse(&["--name", n, "--initial-cluster", cluster])
                    .identity()
                    .unwrap()
            })
            .collect();
        for id in &ids {
            assert_eq!(id.cluster_id, ids[0].cluster_id);
            assert_eq!(id.peers.len(), 2);
            assert!(!id.peers.contains_key(&id.member_id));
        }
        // a's view of b is b's own id.
        assert_eq!(ids[0].peers[&ids[1].member_id], "http://127.0.0.1:2");
        assert_ne!(ids[0].member_id, ids[1].member_id);
    }

    #[test]
    fn bad_cluster_configs_are_refused() {
        assert!(
            parse(&["--name", "x", "--initial-cluster", "y=http://127.0.0.1:1"])
                .identity()
                .is_err()
        );
        assert!(
            parse(&[
                "--initial-cluster",
                "default=http://127.0.0.1:1,b=http://127.0.0.1:1"
            ])
            .identity()
            .is_err(),
            "two members with the same peer URL"
        );
        let no_cert = parse(&["--listen-client-urls", "https://127.0.0.1:1"]).validate();
        let why = format!("{:#}", no_cert.expect_err("https:// without a certificate"));
        assert!(why.contains("--cert-file and --key-file"), "{why}");
        let unix = parse(&["--listen-client-urls", "unix://x:1,unixs://y"])
            .client_urls()
            .unwrap();
        assert_eq!(
            unix,
            [
                ListenUrl {
                    addr: ListenAddr::Unix("x:1".into()),
                    tls: false,
                    plain_too: false,
                },
                ListenUrl {
                    addr: ListenAddr::Unix("y".into()),
                    tls: true,
                    plain_too: false,
                }
            ]
        );
        // http:// and https:// on one port: one listener that serves both.
        let both = parse(&[
            "--listen-client-urls",
            "http://127.0.0.1:5,https://127.0.0.1:5,http://127.0.0.1:6",
        ])
        .client_urls()
        .unwrap();
        let tcp = |port: u16| ListenAddr::Tcp(([127, 0, 0, 1], port).into());
        assert_eq!(
            both,
            [
                ListenUrl {
                    addr: tcp(5),
                    tls: true,
                    plain_too: true,
                },
                ListenUrl {
                    addr: tcp(6),
                    tls: false,
                    plain_too: false,
                }
            ]
        );
        // Peers listen on Unix sockets too, as etcd's may.
        assert_eq!(
            parse(&["--listen-peer-urls", "unix://x:1"])
                .peer_urls()
                .unwrap(),
            [ListenUrl {
                addr: ListenAddr::Unix("x:1".into()),
                tls: false,
                plain_too: false,
            }]
        );
        assert!(
            parse(&["--listen-peer-urls", "ftp://x:1"])
                .peer_urls()
                .is_err()
        );
        let urls = parse(&[
            "--listen-client-urls",
            "http://127.0.0.1:1,https://127.0.0.1:2",
        ])
        .client_urls()
        .unwrap();
        assert_eq!(
            urls.iter().map(|u| u.tls).collect::<Vec<_>>(),
            [false, true]
        );
    }
}
