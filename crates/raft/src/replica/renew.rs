//! Keepalives (docs/lease.md, "Renewals"). On the leader a renewal whose new deadline the lease's
//! cover already reaches is answered from memory, at once; one past the cover is written to the
//! log as a `LeaseCover`, which extends the cover a margin beyond the new deadline; one past the
//! deadline its holder was told ends the lease. A follower forwards renewals to the leader, which
//! decides the same way (`Replica::leader_commit`). The decisions are
//! `steps::LeaderRenewals::renew`'s, under the one lock the expiry driver's passes take too.

use leasehold_lease::LeaseId;
use tokio::sync::oneshot;

use super::Replica;
use super::batch::Pending;
use super::error::ReplicaError;
use super::forward::leader_elsewhere;
use crate::command::{Applied, Command, LeaseRenew};
use crate::state_machine;
use crate::steps::{self, AfterEnd, LeaderRenewals, RenewStep};

/// Where a leader's renewal stands after its decision.
pub(super) enum Step {
    /// Answered: the TTL (`None`: no live lease), and the log index a follower that forwarded
    /// it applies up to before answering a `None` (a revoke it may have made).
    Answered(Option<i64>, u64),
    /// Committing the end of a lease whose told deadline passed, at `now_ms`.
    Expire { cover_ms: u64, now_ms: u64 },
    /// Waiting for a `LeaseCover` through the log.
    ThroughLog,
}

impl Replica {
    /// A keepalive of lease `id`: the TTL renewed for, `None` if the lease is gone (or was
    /// past its deadline, and is now revoked). On the leader it is decided here; elsewhere it is
    /// forwarded to the leader with this member's other writes. `NoLeader` while no leader
    /// takes it (the caller waits for the next one and asks again).
    pub async fn renew_lease(&self, id: LeaseId) -> Result<Option<i64>, ReplicaError> {
        if self.lease_clock().is_some() && leader_elsewhere(&self.status, self.member_id).is_none()
        {
            match self.renew_as_leader(id, None).await {
                Err(ReplicaError::NoLeader) => {}
                other => return other.map(|(ttl, _)| ttl),
            }
        }
        self.propose(LeaseRenew { id }).await
    }

    /// A renewal decided on this member, which must time leases (lead), from its first
    /// decision if that was already made (`first`): a follower's forwarded renewal, decided as
    /// it arrived. An end that revoked nothing is decided again ([`steps::after_end`]), for the
    /// leader's own clients and followers' alike.
    pub(super) async fn renew_as_leader(
        &self,
        id: LeaseId,
        mut first: Option<Step>,
    ) -> Result<(Option<i64>, u64), ReplicaError> {
        for decisions in 1.. {
            let step = match first.take() {
                Some(step) => step,
                None => self.renew_step(id)?,
            };
            let ends = matches!(step, Step::Expire { .. });
            let (ttl, index) = self.finish_renewal(id, step).await?;
            if !ends {
                return Ok((ttl, index));
            }
            let exists = state_machine::read_leases(&self.shared, |t| t.contains(id));
            match steps::after_end(exists, decisions) {
                AfterEnd::Gone => return Ok((None, index)),
                AfterEnd::DecideAgain => {}
                AfterEnd::GiveUp => break,
            }
        }
        Err(ReplicaError::NoLeader)
    }

    /// The renewal's decision now: answered from memory, or what it waits for.
    pub(super) fn renew_step(&self, id: LeaseId) -> Result<Step, ReplicaError> {
        let clock = self.lease_clock().ok_or(ReplicaError::NoLeader)?;
        let now_ms = clock.now_ms_ceil(self.lease_clock.now());
        let step = state_machine::read_leases(&self.shared, |table| {
            self.renewals()
                .renew(table, id, now_ms, self.cover_margin_ms)
        });
        Ok(match step {
            RenewStep::Answer { ttl_secs, cover } => {
                self.memory_renewals
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if cover {
                    self.cover_in_background(id);
                }
                Step::Answered(Some(ttl_secs), self.applied_index())
            }
            RenewStep::NotFound => Step::Answered(None, self.applied_index()),
            RenewStep::Expire { cover_ms } => Step::Expire { cover_ms, now_ms },
            RenewStep::ThroughLog => Step::ThroughLog,
        })
    }

    /// Waits for what a renewal's decision asked: the end of its lease, or its renewal through
    /// the log. An expiry that revoked nothing (a renewal through the log moved the cover
    /// first) answers `None` with the lease still there; [`Replica::renew_as_leader`] then
    /// decides again.
    async fn finish_renewal(
        &self,
        id: LeaseId,
        step: Step,
    ) -> Result<(Option<i64>, u64), ReplicaError> {
        match step {
            Step::Answered(ttl, index) => Ok((ttl, index)),
            Step::Expire { cover_ms, now_ms } => {
                let done = self
                    .propose_as_leader(Command::LeaseExpireTold {
                        leases: vec![(id, cover_ms)],
                        now_ms,
                    })
                    .await;
                self.renewals().ended([id]);
                match done? {
                    Applied::LeaseExpire(_) => Ok((None, self.applied_index())),
                    other => Err(ReplicaError::WrongReply(format!("{other:?}"))),
                }
            }
            Step::ThroughLog => {
                let committed = self.enqueue(LeaseRenew { id }.into(), true).await?;
                let committed = committed.await.map_err(|_| ReplicaError::Stopped)??;
                match committed.applied {
                    Applied::LeaseRenew(ttl) => Ok((ttl, committed.log_index)),
                    other => Err(ReplicaError::WrongReply(format!("{other:?}"))),
                }
            }
        }
    }

    /// Extends `id`'s cover through the log without anyone waiting for it: a renewal answered
    /// from memory found less than half a margin of cover left.
    fn cover_in_background(&self, id: LeaseId) {
        let proposals = self.proposals.clone();
        let renewals = self.renewals.clone();
        tokio::spawn(async move {
            let (reply, done) = oneshot::channel();
            let pending = Pending {
                write: LeaseRenew { id }.into(),
                // Never forwarded: a member that no longer leads drops it.
                from_peer: true,
                reply,
            };
            if proposals.send(pending).await.is_ok() {
                let _ = done.await;
            }
            renewals.lock().expect("renewals lock poisoned").covered(id);
        });
    }

    pub(super) fn renewals(&self) -> std::sync::MutexGuard<'_, LeaderRenewals> {
        self.renewals.lock().expect("renewals lock poisoned")
    }

    fn applied_index(&self) -> u64 {
        self.status.borrow().applied_index
    }
}
