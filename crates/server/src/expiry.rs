//! The leader's expiry driver on tokio: runs `leasehold_raft::steps::expiry_pass` (through
//! `Replica::expiry_pass`, which keeps it apart from renewals answered from memory) (what is due,
//! when to tick the lease clock, when to look again), commits what it asks, and sleeps until the
//! pass's wake, a lease change or the next promotion. A failed proposal is retried after
//! `ExpiryConfig::retry`, never dropped. Its now, and its sleep, are the replica's clock
//! (`leasehold_raft::Clock`): a test moves it by hand.

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
                Some(replica.clock().now() + cfg.retry)
            }
        };
        let sleep = async {
            match wake {
                Some(at) => replica.clock().sleep_until(at).await,
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
        return Ok(Some(replica.clock().now()));
    };
    let now = replica.clock().now();
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
            let committed_ms = clock.now_ms(replica.clock().now());
            metrics.leases_expired(
                deadlines
                    .iter()
                    .map(|d| Duration::from_millis(committed_ms.saturating_sub(*d))),
            );
            // More may be due: look again at once.
            Ok(Some(replica.clock().now()))
        }
        Some(ExpiryWork::Tick { now_ms }) => {
            replica.tick_lease_clock(now_ms).await?;
            Ok(pass.wake)
        }
        None => Ok(pass.wake),
    }
}

/// Lease safety in-process on a clock moved by hand: the expiry driver's passes, renewals and a
/// restart, with no sleeping (`leasehold_raft::ManualClock`).
#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use leasehold_mvcc::{PutRequest, RangeRequest};
    use leasehold_raft::{LeaseGrant, LeaseId, ManualClock, Replica};

    use super::{ExpiryConfig, step};
    use crate::metrics::Metrics;
    use crate::test_support::one_member_config;

    const HELD: &[u8] = b"held";

    struct Member {
        replica: Arc<Replica>,
        metrics: Arc<Metrics>,
    }

    impl Member {
        async fn start(dir: &std::path::Path, clock: &Arc<ManualClock>) -> Member {
            let config = one_member_config(dir, clock.clone());
            let replica = Replica::start(config).await.unwrap();
            let metrics = Arc::new(Metrics::new(replica.clone(), false));
            Member { replica, metrics }
        }

        /// The driver's passes at the clock's now, as many as it asks for at once (after an
        /// expiry it looks again), committing what each asks.
        async fn passes(&self) {
            let cfg = ExpiryConfig::default();
            for _ in 0..100 {
                let wake = step(&self.replica, &self.metrics, &cfg).await.unwrap();
                if wake.is_none_or(|at| at > self.replica.clock().now()) {
                    return;
                }
            }
            panic!("the expiry driver asked for 100 passes at one instant");
        }

        async fn grant_with_key(&self, id: LeaseId, ttl_secs: i64) {
            self.replica
                .propose(LeaseGrant { id, ttl_secs })
                .await
                .unwrap()
                .unwrap();
            self.replica
                .propose(PutRequest {
                    key: HELD.into(),
                    value: b"v".to_vec(),
                    lease: Some(id),
                    ..Default::default()
                })
                .await
                .unwrap()
                .unwrap();
        }

        /// The lease's time left as the leader tells it (ms), `None` once it is gone.
        async fn left_ms(&self, id: LeaseId) -> Option<u64> {
            self.replica
                .read_at_lease_time(|_, leases, at| {
                    at.deadline_ms(leases, id)
                        .map(|deadline| deadline.saturating_sub(at.now_ms))
                })
                .await
                .unwrap()
        }

        /// Asserts that lease `id` ends when `clock` has moved `ms` more, and not a
        /// millisecond before: 1 ms earlier its key is held and it has 1 ms left.
        async fn ends_after(&self, clock: &ManualClock, id: LeaseId, ms: u64) {
            clock.advance(Duration::from_millis(ms - 1));
            self.passes().await;
            assert!(self.key_held().await, "1 ms before its deadline");
            assert_eq!(self.left_ms(id).await, Some(1));
            clock.advance(Duration::from_millis(1));
            self.passes().await;
            assert!(!self.key_held().await, "its key goes with it");
            assert_eq!(self.left_ms(id).await, None);
        }

        async fn key_held(&self) -> bool {
            let range = RangeRequest {
                key: HELD.to_vec(),
                ..Default::default()
            };
            let got = self.replica.read(true, |s| s.range(&range)).await;
            !got.unwrap().unwrap().kvs.is_empty()
        }
    }

    fn lease(id: i64) -> LeaseId {
        LeaseId::from_wire(id).unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_ends_when_the_clock_reaches_its_ttl_and_not_a_millisecond_before() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new();
        let member = Member::start(dir.path(), &clock).await;
        member.grant_with_key(lease(1), 5).await;
        member.ends_after(&clock, lease(1), 5_000).await;
        member.replica.shutdown().await;
    }

    /// The first renewal goes through the log (it gives the lease its cover); the next, inside
    /// the cover, is answered from the leader's memory at the clock's now, writing nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_renewal_gives_a_whole_ttl_from_the_moment_it_is_answered() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new();
        let member = Member::start(dir.path(), &clock).await;
        member.grant_with_key(lease(2), 5).await;
        clock.advance(Duration::from_secs(4));
        member.passes().await;
        assert_eq!(member.replica.renew_lease(lease(2)).await.unwrap(), Some(5));
        clock.advance(Duration::from_secs(2));
        member.passes().await;
        let logged = member.replica.status().last_log_index;
        assert_eq!(member.replica.renew_lease(lease(2)).await.unwrap(), Some(5));
        assert_eq!(
            member.replica.status().last_log_index,
            logged,
            "answered from memory"
        );
        // Past both earlier deadlines (5 s and 9 s): it ends at the last one (11 s).
        member.ends_after(&clock, lease(2), 5_000).await;
        // Renewing a lease that ended answers no TTL (0 on the wire), as etcd's.
        assert_eq!(member.replica.renew_lease(lease(2)).await.unwrap(), None);
        member.replica.shutdown().await;
    }

    /// etcd 3.7 gives every lease a whole TTL again after a restart; here the lease time the
    /// driver ticked into the log goes on, so a restart costs no holder its deadline and gives
    /// none a fresh one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_restart_gives_no_fresh_ttl() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new();
        let member = Member::start(dir.path(), &clock).await;
        member.grant_with_key(lease(3), 10).await;
        clock.advance(Duration::from_secs(6));
        member.passes().await;
        member.replica.shutdown().await;
        drop(member);

        let member = Member::start(dir.path(), &clock).await;
        assert_eq!(member.left_ms(lease(3)).await, Some(4_000));
        member.ends_after(&clock, lease(3), 4_000).await;
        member.replica.shutdown().await;
    }

    /// The driver itself sleeps on the replica's clock: moving the clock past a deadline wakes
    /// it, with no real time passing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_driver_wakes_when_the_clock_passes_a_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new();
        let member = Member::start(dir.path(), &clock).await;
        member.grant_with_key(lease(4), 1).await;
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let driver = tokio::spawn(super::drive_lease_expiry(
            member.replica.clone(),
            member.metrics.clone(),
            ExpiryConfig::default(),
            stopped,
        ));
        let mut revisions = member.replica.subscribe_revisions();
        let before = *revisions.borrow_and_update();
        clock.advance(Duration::from_secs(1));
        // A bound on the wait, not a timing assertion: the delete comes as soon as the driver
        // is scheduled.
        tokio::time::timeout(Duration::from_secs(30), revisions.wait_for(|r| *r > before))
            .await
            .expect("the driver woke and expired the lease")
            .unwrap();
        assert!(!member.key_held().await);
        stop.send_replace(true);
        driver.await.unwrap();
        member.replica.shutdown().await;
    }
}
