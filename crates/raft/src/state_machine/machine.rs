//! The state machine on its own: no file, no lock, no thread and no signals. It applies committed
//! entries with the same function the replica applies them with ([`super::apply::apply_entry`]),
//! so a simulator that drives the consensus core itself runs leasehold's real MVCC, lease and
//! auth semantics. Durability is the caller's: [`Machine::to_bytes`] is the whole state as a
//! leader's snapshot carries it, and [`Machine::from_bytes`] loads such bytes.

use leasehold_lease::LeaseTable;
use leasehold_mvcc::Store;

use super::SmState;
use super::apply::{Applying, Effects, apply_entry};
use super::snapshot::SnapshotPayload;
use crate::command::{Applied, Proposal};
use crate::position::{LogPosition, Member, Members};
use crate::storage::{StorageError, decode, encode};

/// One member's replicated state, applied in memory.
#[derive(Debug)]
pub struct Machine {
    state: SmState,
}

impl Machine {
    /// A new cluster's empty state with `voters` as its members.
    pub fn new(voters: &[u64]) -> Machine {
        let mut machine = Machine {
            state: SmState::default(),
        };
        machine.state.membership = members(voters, &[]);
        machine
    }

    /// Applies a normal committed entry (`data` as [`encode_proposal`] made it; empty: a new
    /// leader's blank entry): one reply per command.
    pub fn apply_normal(
        &mut self,
        term: u64,
        index: u64,
        data: &[u8],
    ) -> Result<Vec<Applied>, StorageError> {
        let payload = if data.is_empty() {
            Applying::Blank
        } else {
            Applying::Normal(decode::<Proposal>("a log entry", data)?)
        };
        Ok(self.apply(term, index, payload))
    }

    /// Applies a committed membership change: the voters and learners after it.
    pub fn apply_membership(&mut self, term: u64, index: u64, voters: &[u64], learners: &[u64]) {
        self.apply(term, index, Applying::Membership(members(voters, learners)));
    }

    fn apply(&mut self, term: u64, index: u64, payload: Applying) -> Vec<Applied> {
        // What changed is for a file to stage; nothing here keeps it.
        let mut fx = Effects::default();
        let position = LogPosition { term, index };
        apply_entry(&mut self.state, position, payload, &mut fx)
    }

    /// The last applied entry's (index, term); (0, 0) before any.
    pub fn applied(&self) -> (u64, u64) {
        self.state
            .last_applied
            .map_or((0, 0), |p| (p.index, p.term))
    }

    pub fn store(&self) -> &Store {
        &self.state.store
    }

    pub fn leases(&self) -> &LeaseTable {
        &self.state.leases
    }

    pub fn auth(&self) -> &leasehold_auth::AuthState {
        &self.state.auth
    }

    /// The voters of the applied membership.
    pub fn voters(&self) -> Vec<u64> {
        let membership = &self.state.membership;
        membership
            .iter()
            .filter(|(_, m)| !m.learner)
            .map(|(id, _)| *id)
            .collect()
    }

    /// The learners of the applied membership.
    pub fn learners(&self) -> Vec<u64> {
        let membership = &self.state.membership;
        membership
            .iter()
            .filter(|(_, m)| m.learner)
            .map(|(id, _)| *id)
            .collect()
    }

    /// The whole state, encoded as a leader's snapshot carries it.
    pub fn to_bytes(&self) -> Vec<u8> {
        encode(&SnapshotPayload::from_state(&self.state))
    }

    /// A state from [`Machine::to_bytes`]'s bytes (or a snapshot's), with keys bound to their
    /// leases as a restart binds them.
    pub fn from_bytes(bytes: &[u8]) -> Result<Machine, StorageError> {
        let payload: SnapshotPayload = decode("a snapshot", bytes)?;
        Ok(Machine {
            state: payload.into_state(None),
        })
    }

    /// Replaces the state with a snapshot's bytes, as a member installs a leader's snapshot.
    pub fn install(&mut self, bytes: &[u8]) -> Result<(), StorageError> {
        let payload: SnapshotPayload = decode("a snapshot", bytes)?;
        self.state = payload.into_state(None);
        Ok(())
    }

    /// Checks the store's and the lease table's invariants and that key bindings match the
    /// store (panics otherwise); linear in the state.
    pub fn validate(&self) {
        self.state.store.validate();
        self.state.leases.validate();
        self.state.validate_bindings();
    }
}

/// A log entry's data as a proposal, if it is one.
pub fn decode_proposal(data: &[u8]) -> Option<Proposal> {
    decode("a log entry", data).ok()
}

/// A proposal as a log entry's data.
pub fn encode_proposal(proposal: &Proposal) -> Vec<u8> {
    encode(proposal)
}

fn members(voters: &[u64], learners: &[u64]) -> Members {
    let member = |learner| Member {
        peer_url: String::new(),
        learner,
    };
    voters
        .iter()
        .map(|id| (*id, member(false)))
        .chain(learners.iter().map(|id| (*id, member(true))))
        .collect()
}
