//! What the crate's unit tests share.

use std::sync::Arc;
use std::time::Duration;

use leasehold_raft::{Clock, ReplicaConfig};

/// A one-member cluster in `dir` with quick timing, reading lease time from `clock`.
pub(crate) fn one_member_config(dir: &std::path::Path, clock: Arc<dyn Clock>) -> ReplicaConfig {
    ReplicaConfig {
        member_id: 1,
        peer_url: "http://127.0.0.1:1".into(),
        initial_peers: Default::default(),
        bootstrap: true,
        data_dir: dir.to_path_buf(),
        heartbeat_interval_ms: 50,
        election_timeout_ms: 200,
        snapshot_log_entries_max: 10_000,
        quota_bytes: None,
        auth_token_ttl: Duration::from_secs(300),
        lease_cover_margin_ms: leasehold_raft::LEASE_COVER_MARGIN_DEFAULT_MS,
        strict_reconfig_check: true,
        force_new_cluster: false,
        compaction_pace: Default::default(),
        clock,
    }
}
