//! The leader's expiry driver: sleeps until the earliest lease deadline (or a lease change, or the
//! next tick), then proposes the revocation of every lease due, many per log entry. It never
//! polls on a fixed tick for expiry, and a failed proposal is retried, never dropped: the leases
//! stay due in the table until a revoke is applied.
//!
//! It also proposes a lease-clock tick every `tick` while leases exist, which bounds how much
//! lease time a restart can lose (docs/lease.md).

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_raft::Replica;

use crate::metrics::Metrics;
use tokio::sync::watch;

/// How the driver paces itself.
#[derive(Clone, Copy, Debug)]
pub struct ExpiryConfig {
    /// Lease-clock tick interval: the most lease time a restart can lose.
    pub tick: Duration,
    /// Most leases revoked by one log entry.
    pub revoke_batch_len_max: usize,
    /// Wait before retrying a failed proposal.
    pub retry: Duration,
}

impl Default for ExpiryConfig {
    fn default() -> Self {
        ExpiryConfig {
            tick: Duration::from_millis(500),
            revoke_batch_len_max: 10_000,
            retry: Duration::from_millis(100),
        }
    }
}

/// Runs until `shutdown` turns true.
pub async fn drive_lease_expiry(
    replica: Arc<Replica>,
    metrics: Arc<Metrics>,
    cfg: ExpiryConfig,
    mut shutdown: watch::Receiver<bool>,
) {
    let tick_ms = u64::try_from(cfg.tick.as_millis()).unwrap_or(u64::MAX);
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
        let wake = match step(&replica, &metrics, &cfg, tick_ms).await {
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

/// One pass: revoke what is due, tick the clock if it is time. Returns when to look again
/// (`None`: only a lease change can make work).
async fn step(
    replica: &Replica,
    metrics: &Metrics,
    cfg: &ExpiryConfig,
    tick_ms: u64,
) -> Result<Option<Instant>, leasehold_raft::ReplicaError> {
    let Some(clock) = replica.lease_clock() else {
        // Demoted since the caller looked: it waits for the next promotion.
        return Ok(Some(Instant::now()));
    };
    let now = Instant::now();
    let now_ms = clock.now_ms(now);
    let (due, deadlines, next_deadline, replicated_ms, any) = replica
        .read_leases(false, |t| {
            let due = t.expired(now_ms, cfg.revoke_batch_len_max);
            let deadlines: Vec<u64> = due
                .iter()
                .filter_map(|id| t.record(*id).map(|r| r.deadline_ms))
                .collect();
            (
                due,
                deadlines,
                t.next_deadline_ms(),
                t.clock_ms(),
                !t.is_empty(),
            )
        })
        .await?;
    if !due.is_empty() {
        // Only as leader: a member that was deposed meanwhile must not get its expiries
        // committed by the new leader (etcd#15247).
        replica.expire_leases(due, now_ms).await?;
        let committed_ms = clock.now_ms(Instant::now());
        metrics.leases_expired(
            deadlines
                .iter()
                .map(|d| Duration::from_millis(committed_ms.saturating_sub(*d))),
        );
        return Ok(Some(Instant::now()));
    }
    if any && now_ms >= replicated_ms.saturating_add(tick_ms) {
        replica.tick_lease_clock(now_ms).await?;
    }
    let next_tick = any.then(|| now + Duration::from_millis(tick_ms));
    let next_expiry = next_deadline.map(|d| clock.instant_at(d));
    Ok(match (next_tick, next_expiry) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    })
}
