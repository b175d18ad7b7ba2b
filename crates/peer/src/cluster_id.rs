//! Every peer request names its sender's cluster (`leasehold-cluster-id` metadata: the cluster
//! ID in hex), and a member refuses requests from another cluster, as etcd's peer transport
//! checks `X-Etcd-Cluster-ID`. So a member never takes another cluster's log entries, votes or
//! snapshots when that cluster's configuration names its peer URL by mistake (a reused port, a
//! member restored with another token). A request without the name (from a member of an older
//! build) passes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::{Request, Status};

const HEADER: &str = "leasehold-cluster-id";

/// How often a refusal is logged at most (a stray member retries many times a second).
const LOG_EVERY_MS: u64 = 10_000;

/// Stamps outgoing requests with this member's cluster ID (none: unstamped).
#[derive(Clone, Debug, Default)]
pub(crate) struct Stamp(Option<MetadataValue<Ascii>>);

impl Stamp {
    pub(crate) fn new(cluster_id: Option<u64>) -> Stamp {
        Stamp(cluster_id.map(|id| {
            MetadataValue::try_from(format!("{id:x}")).expect("hex digits are valid metadata")
        }))
    }
}

impl Interceptor for Stamp {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(id) = &self.0 {
            request.metadata_mut().insert(HEADER, id.clone());
        }
        Ok(request)
    }
}

/// Refuses incoming requests stamped with another cluster's ID.
#[derive(Clone)]
pub(crate) struct Check {
    local: String,
    since: Instant,
    /// When a refusal was last logged, in ms since `since` (`u64::MAX`: never).
    logged_ms: Arc<AtomicU64>,
}

impl Check {
    pub(crate) fn new(cluster_id: u64) -> Check {
        Check {
            local: format!("{cluster_id:x}"),
            since: Instant::now(),
            logged_ms: Arc::new(AtomicU64::new(u64::MAX)),
        }
    }

    fn log_now(&self) -> bool {
        let now = u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        let last = self.logged_ms.load(Ordering::Relaxed);
        (last == u64::MAX || now.saturating_sub(last) >= LOG_EVERY_MS)
            && self
                .logged_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

impl Interceptor for Check {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(remote) = request.metadata().get(HEADER) else {
            return Ok(request);
        };
        if remote.as_bytes() == self.local.as_bytes() {
            return Ok(request);
        }
        let remote = String::from_utf8_lossy(remote.as_bytes()).into_owned();
        if self.log_now() {
            tracing::warn!(
                local = %self.local,
                remote = %remote,
                "refused a peer request from another cluster (request cluster ID mismatch)"
            );
        }
        Err(Status::failed_precondition(format!(
            "request cluster ID mismatch (local {}, remote {remote})",
            self.local
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamped(cluster_id: Option<u64>) -> Request<()> {
        Stamp::new(cluster_id)
            .call(Request::new(()))
            .expect("stamping never fails")
    }

    #[test]
    fn only_requests_from_another_cluster_are_refused() {
        let mut check = Check::new(0xabc);
        assert!(check.call(stamped(Some(0xabc))).is_ok());
        assert!(check.call(stamped(None)).is_ok(), "an older member");
        let refused = check
            .call(stamped(Some(0xdef)))
            .expect_err("another cluster");
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
        assert!(
            refused.message().contains("cluster ID mismatch"),
            "{refused:?}"
        );
        // Logged once, not once a request.
        assert!(!check.log_now());
    }
}
