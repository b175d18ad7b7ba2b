//! Lease keep-alive the way clientv3 does it, and the lease "session" that `lock` and `elect`
//! hold their keys with.
//!
//! clientv3's keep-alive sends a renewal right away and then TTL/3 after each response; it gives
//! up when the server answers TTL <= 0 (the lease is gone) or when no answer came before the
//! lease's deadline (the first deadline is the caller's, later ones are "now + TTL" at each
//! answer). A broken stream is reopened, within that deadline.

use std::time::Duration;

use leasehold_api::etcdserverpb::{
    LeaseGrantRequest, LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseRevokeRequest,
    lease_client::LeaseClient,
};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use super::{CtlError, call};

/// Pause before reopening a broken keep-alive stream (clientv3 waits 500 ms too).
const REOPEN_PAUSE: Duration = Duration::from_millis(500);

/// Renews lease `id` until it is gone or its deadline passes (see the module docs); calls
/// `on_response` with every live response. Returns `Ok` when the keep-alive ended by itself,
/// `Err` when `on_response` failed.
pub async fn keep_alive(
    channel: Channel,
    id: i64,
    first_deadline: Instant,
    mut on_response: impl FnMut(&LeaseKeepAliveResponse) -> Result<(), CtlError>,
) -> Result<(), CtlError> {
    let mut client = LeaseClient::new(channel);
    let mut deadline = first_deadline;
    'reopen: loop {
        if Instant::now() >= deadline {
            return Ok(());
        }
        let (requests, rx) = mpsc::channel(4);
        // Queue the first renewal before opening: grpc-go servers send the response headers,
        // which the call waits for, only with the first response.
        if requests.send(LeaseKeepAliveRequest { id }).await.is_err() {
            return Ok(());
        }
        let opened =
            tokio::time::timeout_at(deadline, client.lease_keep_alive(ReceiverStream::new(rx)))
                .await;
        let mut responses = match opened {
            Ok(Ok(response)) => response.into_inner(),
            Ok(Err(_)) => {
                tokio::time::sleep_until(deadline.min(Instant::now() + REOPEN_PAUSE)).await;
                continue 'reopen;
            }
            Err(_) => return Ok(()),
        };
        loop {
            match tokio::time::timeout_at(deadline, responses.message()).await {
                Err(_) => return Ok(()),
                Ok(Ok(Some(response))) => {
                    if response.ttl <= 0 {
                        return Ok(());
                    }
                    on_response(&response)?;
                    let ttl = Duration::from_secs(response.ttl.unsigned_abs());
                    let now = Instant::now();
                    deadline = now + ttl;
                    tokio::time::sleep_until(now + ttl / 3).await;
                    if requests.send(LeaseKeepAliveRequest { id }).await.is_err() {
                        continue 'reopen;
                    }
                }
                Ok(Ok(None)) | Ok(Err(_)) => {
                    tokio::time::sleep_until(deadline.min(Instant::now() + REOPEN_PAUSE)).await;
                    continue 'reopen;
                }
            }
        }
    }
}

/// A granted lease kept alive in the background (clientv3's `concurrency.Session`).
pub struct Session {
    pub id: i64,
    channel: Channel,
    /// Becomes true when the keep-alive ended: the lease expired or was revoked.
    lost: watch::Receiver<bool>,
    task: JoinHandle<()>,
}

impl Session {
    /// Grants a lease of `ttl` seconds and starts keeping it alive.
    pub async fn start(channel: &Channel, ttl: i64, deadline: Instant) -> Result<Session, String> {
        let granted = call(
            deadline,
            LeaseClient::new(channel.clone()).lease_grant(LeaseGrantRequest { ttl, id: 0 }),
        )
        .await?;
        if !granted.error.is_empty() {
            return Err(granted.error);
        }
        let id = granted.id;
        let (lost_tx, lost) = watch::channel(false);
        let keep_channel = channel.clone();
        let first_deadline = Instant::now() + Duration::from_secs(granted.ttl.unsigned_abs());
        let task = tokio::spawn(async move {
            let _ = keep_alive(keep_channel, id, first_deadline, |_| Ok(())).await;
            let _ = lost_tx.send(true);
        });
        Ok(Session {
            id,
            channel: channel.clone(),
            lost,
            task,
        })
    }

    /// Completes when the lease is lost (never, while it is kept alive).
    pub async fn lost(&mut self) {
        let _ = self.lost.wait_for(|lost| *lost).await;
    }

    /// Stops the keep-alive and revokes the lease (best effort, within `deadline`), which
    /// deletes every key held with it.
    pub async fn close(self, deadline: Instant) {
        self.task.abort();
        let _ = call(
            deadline,
            LeaseClient::new(self.channel).lease_revoke(LeaseRevokeRequest { id: self.id }),
        )
        .await;
    }
}
