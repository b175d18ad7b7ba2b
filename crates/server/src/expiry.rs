//! The leader's expiry driver on tokio: runs `leasehold_raft::steps::expiry_pass` (through
//! `Replica::expiry_pass`, which keeps it apart from renewals answered from memory) (what is due,
//! when to tick the lease clock, when to look again), commits what it asks, and sleeps until the
//! pass's wake, a lease change or the next promotion. A failed proposal is retried after
//! `ExpiryConfig::retry`, never dropped.

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_raft::Replica;
pub use leasehold_raft::steps::ExpiryConfig;
use leasehold_raft::steps::ExpiryWork;

use crate::metrics::Metrics;
use tokio::sync::watch;

/// Runs until `shutdown` turns true.
pub async fn drive_lease_expiry(
    replica: Arc<Replica>,
    metrics: Arc<Metrics>,
    cfg: ExpiryConfig,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut lease_clock = replica.subscribe_lease_clock();
    loop {
        if *shutdown.borrow() {
            return;
        }
        if lease_clock.borrow_and_update().is_none() {
            // Not leading: nothing to time until this member is promoted.
            tokio::select! {
                changed = lease_clock.changed() => if changed.is_err() { return; },
                _ = shutdown.changed() => {}
            }
            continue;
        }
        let wake = match step(&replica, &metrics, &cfg).await {
            Ok(wake) => wake,
            Err(e) => {
                tracing::warn!("lease expiry: {e}; retrying");
                Some(Instant::now() + cfg.retry)
            }
        };
        let sleep = async {
            match wake {
                Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = sleep => {}
            _ = replica.leases_changed() => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// One pass, and the commit of what it asks. Returns when to look again.
async fn step(
    replica: &Replica,
    metrics: &Metrics,
    cfg: &ExpiryConfig,
) -> Result<Option<Instant>, leasehold_raft::ReplicaError> {
    let Some(clock) = replica.lease_clock() else {
        // Demoted since the caller looked: it waits for the next promotion.
        return Ok(Some(Instant::now()));
    };
    let now = Instant::now();
    let pass = replica.expiry_pass(&clock, now, cfg);
    match pass.work {
        Some(ExpiryWork::Expire {
            leases,
            now_ms,
            deadlines,
        }) => {
            // Only as leader: a member that was deposed meanwhile must not get its expiries
            // committed by the new leader (etcd#15247).
            replica.expire_leases(leases, now_ms).await?;
            let committed_ms = clock.now_ms(Instant::now());
            metrics.leases_expired(
                deadlines
                    .iter()
                    .map(|d| Duration::from_millis(committed_ms.saturating_sub(*d))),
            );
            // More may be due: look again at once.
            Ok(Some(Instant::now()))
        }
        Some(ExpiryWork::Tick { now_ms }) => {
            replica.tick_lease_clock(now_ms).await?;
            Ok(pass.wake)
        }
        None => Ok(pass.wake),
    }
}
