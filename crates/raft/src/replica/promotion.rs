//! Promotion and demotion as leadership comes and goes: a new leader starts timing leases from
//! the replicated lease time ([`Promotion`]'s steps), and one that no longer leads stops.

use std::sync::Arc;

use leasehold_lease::{LeaseClock, LeaseTable};

use super::Replica;
use super::error::ReplicaError;
use crate::clock::Clock;
use crate::state_machine;
use crate::steps::{Promotion, PromotionStep};

impl Replica {
    /// Promotes this member when it becomes leader and demotes it as soon as it is not, driving
    /// [`Promotion`]'s steps from the leadership watch.
    pub(super) async fn follow_leadership(replica: std::sync::Weak<Replica>) {
        let (mut status, me) = match replica.upgrade() {
            Some(r) => (r.status.clone(), r.member_id),
            None => return,
        };
        let mut promotion = Promotion::default();
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
            match promotion.leadership(leading, term) {
                PromotionStep::Confirm { term } => {
                    if let Err(e) = r.promote(&mut promotion, term).await {
                        promotion.failed(term);
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
                PromotionStep::Demote => r.demote(),
                PromotionStep::Wait => {}
            }
            drop(r);
            if status.changed().await.is_err() {
                return;
            }
        }
    }

    /// Stops timing leases: another member leads (or nobody does).
    fn demote(&self) {
        self.lease_clock.set(None);
        self.renewals().clear();
        tracing::info!("demoted: no longer timing leases");
    }

    /// Runs `promotion`'s steps for `term` once this member leads: a read index (everything
    /// committed before is then applied, so it inherits the latest deadlines and covers), the
    /// promotion's command on this member's own Raft, then the lease clock. Lease time goes on
    /// from the replicated lease time as the old leader last moved it: the time in which no
    /// leader could take renewals is not counted against any lease (docs/lease.md).
    async fn promote(&self, promotion: &mut Promotion, term: u64) -> Result<(), ReplicaError> {
        self.leader_read_index().await?;
        let lease_now_ms = state_machine::read_leases(&self.shared, LeaseTable::clock_ms);
        let Some(command) = promotion.confirmed(term, lease_now_ms, self.election_timeout) else {
            return Ok(());
        };
        self.commit_here(command).await?;
        if let Some(clock) = promotion.committed(term, self.lease_clock.now()) {
            self.renewals().clear();
            self.lease_clock.set(Some(clock));
            tracing::info!(lease_clock_ms = lease_now_ms, "promoted: timing leases");
        }
        Ok(())
    }

    /// The current lease time, if this member times leases (leads).
    pub fn lease_now_ms(&self) -> Result<u64, ReplicaError> {
        self.lease_clock
            .lease_now_ms()
            .ok_or(ReplicaError::NoLeader)
    }

    /// The leader's lease clock, if this member leads.
    pub fn lease_clock(&self) -> Option<LeaseClock> {
        self.lease_clock.get()
    }

    /// The time source this member reads lease time from ([`crate::clock`]): the expiry driver
    /// takes its now from it and sleeps on it.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        self.lease_clock.time()
    }
}
