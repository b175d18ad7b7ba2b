//! How to start a member.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use crate::clock::Clock;

/// How to start a member.
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    pub member_id: u64,
    pub peer_url: String,
    /// The other members of the initial cluster (id → peer URL), to bootstrap a new cluster
    /// with; empty for a one-member cluster. Ignored once the data dir holds a cluster.
    pub initial_peers: BTreeMap<u64, String>,
    /// Whether a fresh data dir bootstraps a new cluster (etcd's `--initial-cluster-state new`)
    /// or waits to be added to a running one (`existing`: the leader sends it the state).
    pub bootstrap: bool,
    pub data_dir: PathBuf,
    pub heartbeat_interval_ms: u64,
    pub election_timeout_ms: u64,
    /// Log entries kept behind the checkpoint for followers that lag a little (at most 5,000;
    /// one further behind gets a snapshot): etcd's `--snapshot-count`. Of the entries every
    /// follower holds, only 4 MiB are kept, unless this is above [`SNAPSHOT_COUNT_DEFAULT`]. Only
    /// the newest 1 MiB of their data stays in memory; the rest is read from the write-ahead log.
    pub snapshot_log_entries_max: u64,
    /// etcd's `--quota-backend-bytes`, resolved: past this file size, writes that add data
    /// raise NOSPACE and are refused. `None`: no quota.
    pub quota_bytes: Option<u64>,
    /// How long a simple auth token lives unused (etcd's `--auth-token-ttl`).
    pub auth_token_ttl: std::time::Duration,
    /// How far beyond the deadline a renewal through the log gives, the lease's cover reaches
    /// (`--lease-cover-margin`): the leader answers later renewals within it from memory, and a
    /// dead holder's lease lives at most this much past its deadline after a failover
    /// (docs/lease.md).
    pub lease_cover_margin_ms: u64,
    /// etcd's `--strict-reconfig-check`: the leader refuses membership changes that would
    /// leave the cluster without a working quorum (`steps::reconfig`).
    pub strict_reconfig_check: bool,
    /// etcd's `--force-new-cluster`: on a data dir that holds a cluster, every other member is
    /// removed at start (`CoreConfig::force_new_cluster`); ignored on a new data dir, as etcd
    /// ignores it without a log.
    pub force_new_cluster: bool,
    /// How a compaction's rows leave the file (etcd's `--compaction-batch-limit` and
    /// `--compaction-sleep-interval`).
    pub compaction_pace: CompactionPace,
    /// What lease time is read from ([`crate::clock`]): [`crate::system_clock`] in production.
    pub clock: Arc<dyn Clock>,
}

/// How a compaction's rows leave the file: at most `batch_limit` per durable transaction, with
/// `pause` between transactions (`storage/removals.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompactionPace {
    pub batch_limit: usize,
    pub pause: std::time::Duration,
}

impl Default for CompactionPace {
    /// etcd's defaults: 1,000 rows, 10 ms.
    fn default() -> Self {
        CompactionPace {
            batch_limit: 1000,
            pause: std::time::Duration::from_millis(10),
        }
    }
}

/// `--lease-cover-margin`'s default.
pub const LEASE_COVER_MARGIN_DEFAULT_MS: u64 = 5_000;

/// etcd's default `--snapshot-count` (3.6 and later). A larger
/// [`ReplicaConfig::snapshot_log_entries_max`] keeps the retained log's whole entry count, with
/// no bound on its bytes.
pub const SNAPSHOT_COUNT_DEFAULT: u64 = 10_000;
