//! The members as processes: starting and restarting them, membership changes, and which
//! member leads.

use leasehold_raft::steps;
use leasehold_wal::MemFs;

use super::{Ev, MS, SEC, World};
use crate::Variant;
use crate::disk::SimFs;
use crate::member::{Clock, Member, TICK_US};

impl World {
    pub(super) fn start_member(&mut self, m: usize) {
        match self.members[m].start() {
            Ok(()) => self.note(format!("m{} started", m + 1)),
            Err(e) => {
                self.note(format!("m{} refuses to start: {e}", m + 1));
                self.members[m].refused = Some(e);
            }
        }
    }

    pub(super) fn restart(&mut self, m: usize) {
        if self.members[m].is_up() || self.members[m].refused.is_some() || self.members[m].removed {
            return;
        }
        // At most one member ever gets a rotten log, and only where no member is ever removed,
        // so a quorum always has intact ones.
        if self.faults.bit_flips
            && !self.healed()
            && self.faults.membership_every.is_none()
            && self.members.iter().all(|mm| mm.refused.is_none())
            && m == 0
            && self.rng.chance(0.5)
        {
            self.flip_bit(m);
        }
        self.start_member(m);
    }

    pub(super) fn leader(&self) -> Option<usize> {
        self.members.iter().find_map(|mm| {
            mm.status()
                .filter(|s| s.is_leader)
                .map(|s| (s.id - 1) as usize)
        })
    }

    pub(super) fn longest_election_timeout(&self) -> u64 {
        self.members
            .iter()
            .map(|m| m.election_timeout_ms())
            .max()
            .unwrap_or(0)
            * MS
    }

    /// The leader removes a voter that is neither itself nor down: docs/testing.md.
    pub(super) fn remove_member(&mut self) {
        let every = self.faults.membership_every.expect("scheduled");
        if self.healed() {
            return;
        }
        if self.removing.is_none()
            && self.adding.is_none()
            && let Some(l) = self.leader()
        {
            let voters = self.members[l].machine.voters();
            let candidates: Vec<usize> = voters
                .iter()
                .map(|id| (*id - 1) as usize)
                .filter(|m| *m != l && self.members[*m].is_up())
                .collect();
            // Only with every voter up (as an operator would): removing one while another is
            // down can leave no quorum once the down one is lost for good.
            let all_up = voters
                .iter()
                .all(|id| self.members[(*id - 1) as usize].is_up());
            if voters.len() >= 3 && all_up && !candidates.is_empty() {
                let gone = candidates[self.rng.below(candidates.len() as u64) as usize];
                let mut out = Vec::new();
                let kind = leasehold_consensus::eraftpb::ConfChangeType::RemoveNode;
                if self.members[l].change_membership(self.now, kind, gone as u64 + 1, &mut out) {
                    self.note(format!("m{} proposes to remove m{}", l + 1, gone + 1));
                    self.removing = Some((gone, self.now));
                    self.after(200 * MS, Ev::MembershipStep);
                }
                self.deliver(l, out);
            }
        }
        let next = self.rng.range(SEC, every * SEC);
        self.after(next, Ev::Membership);
    }

    pub(super) fn membership_step(&mut self) {
        let Some((gone, since)) = self.removing else {
            return;
        };
        let applied = self.members.iter().filter(|m| m.is_up()).any(|m| {
            m.status().is_some_and(|s| s.is_leader)
                && !m.machine.voters().contains(&(gone as u64 + 1))
        });
        if applied {
            // The removed member stops for good; its disk goes with it.
            self.members[gone].crash();
            self.members[gone].removed = true;
            self.removing = None;
            self.note(format!("m{} is removed", gone + 1));
            let after = self.rng.range(SEC / 2, 2 * SEC);
            self.after(after, Ev::AddMember);
        } else if self.now.saturating_sub(since) > 10 * SEC {
            // Never committed (a leader change dropped it): no longer waited for.
            self.note(format!("the removal of m{} did not happen", gone + 1));
            self.removing = None;
        } else {
            self.after(200 * MS, Ev::MembershipStep);
        }
    }

    /// A new member, with an empty disk and no membership, is started and added: as a voter, or
    /// as a learner first and promoted once in sync (`steps::learner_in_sync`, the rule
    /// MemberPromote applies).
    pub(super) fn add_member(&mut self) {
        let (new, as_learner) = match self.adding {
            Some((m, _, as_learner)) => (m, as_learner),
            None => {
                let id = self.members.len() as u64 + 1;
                let disk = if self.options.variant == Variant::AckBeforeFsync {
                    SimFs::Lying(MemFs::new())
                } else {
                    SimFs::Honest(MemFs::new())
                };
                let clock = Clock {
                    rate_ppm: 0,
                    offset_us: self.rng.range(0, 1000 * SEC),
                };
                let election_tick = self.rng.range(10, 15) as usize;
                let member = Member::new(
                    id,
                    &[],
                    disk,
                    clock,
                    election_tick,
                    self.options.variant,
                    self.base,
                );
                self.members.push(member);
                let m = self.members.len() - 1;
                self.members[m].batch_window_us = self.batch_window_us;
                self.members[m].cover_margin_ms = self.cover_margin_ms;
                self.start_member(m);
                let first = self.rng.range(0, TICK_US);
                self.after(first, Ev::Tick(m));
                let as_learner = self.rng.chance(0.5);
                self.adding = Some((m, self.now, as_learner));
                (m, as_learner)
            }
        };
        let id = new as u64 + 1;
        if let Some(l) = self.leader() {
            if self.members[l].machine.voters().contains(&id) {
                self.note(format!("m{id} is added"));
                self.adding = None;
                return;
            }
            use leasehold_consensus::eraftpb::ConfChangeType;
            let (kind, what) = if self.members[l].machine.learners().contains(&id) {
                let core = self.members[l].core.as_ref();
                let leader_match = core.and_then(|c| c.matched(l as u64 + 1));
                let learner_match = core.and_then(|c| c.matched(id));
                match leader_match {
                    Some(leader) if steps::learner_in_sync(leader, learner_match) => {
                        (Some(ConfChangeType::AddNode), "promote")
                    }
                    _ => (None, ""),
                }
            } else if as_learner {
                (Some(ConfChangeType::AddLearnerNode), "add as a learner")
            } else {
                (Some(ConfChangeType::AddNode), "add")
            };
            if let Some(kind) = kind {
                let mut out = Vec::new();
                if self.members[l].change_membership(self.now, kind, id, &mut out) {
                    self.note(format!("m{} proposes to {what} m{id}", l + 1));
                }
                self.deliver(l, out);
            }
        }
        self.after(500 * MS, Ev::AddMember);
    }

    /// The members that are up and in the membership a leader has applied (all that are up if
    /// none leads): a member removed by a change that committed after the world stopped waiting
    /// for it is still up, but no longer gets entries.
    pub(super) fn up_members(&self) -> Vec<usize> {
        let members = self.leader().map(|l| {
            let machine = &self.members[l].machine;
            let mut ids = machine.voters();
            ids.extend(machine.learners());
            ids
        });
        (0..self.members.len())
            .filter(|m| {
                let m = &self.members[*m];
                m.is_up() && members.as_ref().is_none_or(|ids| ids.contains(&m.id))
            })
            .collect()
    }

    pub(super) fn settled(&self) -> bool {
        let up: Vec<&Member> = self
            .up_members()
            .into_iter()
            .map(|m| &self.members[m])
            .collect();
        let Some(leader) = up.iter().find_map(|m| m.status().filter(|s| s.is_leader)) else {
            return false;
        };
        up.iter().all(|m| {
            m.machine.applied().0 >= leader.commit
                && m.status().is_some_and(|s| s.applied == leader.commit)
        })
    }
}
