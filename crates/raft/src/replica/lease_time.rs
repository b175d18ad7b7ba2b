//! The leader's lease time: the clock a member times leases with while it leads, the stamp it
//! puts on grants and renewals, and promotion and demotion as leadership comes and goes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_lease::LeaseClock;
use tokio::sync::watch;

use super::Replica;
use super::error::ReplicaError;
use crate::command::{Command, Proposal, Write};
use crate::state_machine;

/// How long lease grants and renewals wait for a newly elected leader to start timing leases.
pub(super) const PROMOTION_WAIT_MAX: Duration = Duration::from_secs(2);

/// The lease clock a leader times leases with, shared by the replica and its proposer; a watch
/// channel, so that whoever waits for this member to start (or stop) timing leases is woken
/// rather than polling.
#[derive(Clone)]
pub(super) struct SharedClock(Arc<watch::Sender<Option<LeaseClock>>>);

impl SharedClock {
    pub(super) fn new() -> SharedClock {
        SharedClock(Arc::new(watch::Sender::new(None)))
    }

    pub(super) fn get(&self) -> Option<LeaseClock> {
        *self.0.borrow()
    }

    fn set(&self, clock: Option<LeaseClock>) {
        self.0.send_replace(clock);
    }

    pub(super) fn subscribe(&self) -> watch::Receiver<Option<LeaseClock>> {
        self.0.subscribe()
    }

    /// Waits (at most `bound`) until this member times leases; whether it does.
    pub(super) async fn wait_timing(&self, bound: Duration) -> bool {
        let mut clock = self.subscribe();
        let timing = clock.wait_for(Option::is_some);
        matches!(tokio::time::timeout(bound, timing).await, Ok(Ok(_)))
    }
}

/// Turns a batch of writes into a log entry, giving every grant and renewal the leader's lease
/// time, rounded up so that a deadline never falls before its TTL has run
/// (`LeaseClock::now_ms_ceil`). Writes are stamped here, by the member that commits them, so a
/// follower's forwarded grants and renewals count from the leader's clock too.
pub(super) fn stamp_lease_times(
    clock: &SharedClock,
    writes: Vec<Write>,
) -> Result<Proposal, ReplicaError> {
    let now_ms = if writes.iter().any(Write::is_lease_timed) {
        let clock = clock.get().ok_or(ReplicaError::NoLeader)?;
        clock.now_ms_ceil(Instant::now())
    } else {
        // Nothing in this batch reads it.
        0
    };
    Ok(Proposal {
        commands: writes.into_iter().map(|w| w.stamp(now_ms)).collect(),
    })
}

/// Promotes this member when it becomes leader (once it has applied everything committed
/// before, so it inherits the latest lease deadlines) and demotes it as soon as it is not.
pub(super) async fn follow_leadership(replica: std::sync::Weak<Replica>) {
    let (mut status, me) = match replica.upgrade() {
        Some(r) => (r.status.clone(), r.member_id),
        None => return,
    };
    let mut promoted_term: Option<u64> = None;
    loop {
        let (leading, term, stopped) = {
            let s = status.borrow_and_update();
            (s.leader == Some(me) && s.is_leader, s.term, s.stopped)
        };
        if stopped {
            // The Raft core has stopped (shutdown, or a fatal storage error that
            // `Replica::failed` reports): nothing to promote any more.
            return;
        }
        let Some(r) = replica.upgrade() else {
            return;
        };
        if leading && promoted_term != Some(term) {
            let promoted = match r.leader_read_index().await {
                Ok(_) => r.promote().await,
                Err(e) => Err(e),
            };
            match promoted {
                Ok(()) => promoted_term = Some(term),
                Err(e) => {
                    if status.borrow().stopped {
                        continue;
                    }
                    tracing::warn!("promotion at term {term} failed: {e}; retrying");
                    // Again once Raft's state here moves (a failed promotion failed because of
                    // it: a new term, a transfer, a lost quorum), or after an election timeout,
                    // within which raft-rs settles what does not show in that state.
                    let bound = r.election_timeout();
                    drop(r);
                    if let Ok(Err(_)) = tokio::time::timeout(bound, status.changed()).await {
                        return;
                    }
                    continue;
                }
            }
        } else if !leading && (promoted_term.is_some() || r.lease_clock().is_some()) {
            r.demote();
            promoted_term = None;
        }
        drop(r);
        if status.changed().await.is_err() {
            return;
        }
    }
}

impl Replica {
    /// Stops timing leases: another member leads (or nobody does).
    fn demote(&self) {
        self.lease_clock.set(None);
        tracing::info!("demoted: no longer timing leases");
    }

    /// Starts timing leases: proposes the extension of every inherited lease by the election
    /// timeout, then runs the lease clock on from the replicated value. Called once everything
    /// committed is applied.
    async fn promote(&self) -> Result<(), ReplicaError> {
        // The old leader's last lease time, plus what this member has seen pass since it
        // applied it: the election gap counts, as it does for the clients.
        let replicated_ms = state_machine::lease_time_now(&self.shared);
        let extend_ms = u64::try_from(self.election_timeout.as_millis()).unwrap_or(u64::MAX);
        // Straight to this member's Raft, never forwarded: only a leader promotes itself.
        self.commit_here(Command::LeasePromote {
            now_ms: replicated_ms,
            extend_ms,
        })
        .await?;
        let clock = LeaseClock::promote(replicated_ms, Instant::now());
        self.lease_clock.set(Some(clock));
        tracing::info!(lease_clock_ms = replicated_ms, "promoted: timing leases");
        Ok(())
    }

    /// The current lease time, if this member times leases (leads).
    pub fn lease_now_ms(&self) -> Result<u64, ReplicaError> {
        self.lease_clock()
            .map(|c| c.now_ms(Instant::now()))
            .ok_or(ReplicaError::NoLeader)
    }

    /// The leader's lease clock, if this member leads.
    pub fn lease_clock(&self) -> Option<LeaseClock> {
        self.lease_clock.get()
    }
}
