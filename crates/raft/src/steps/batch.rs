//! Group commit's decisions: what a leader does with a write as it arrives, how many queued
//! writes one log entry takes, and where a batch goes.

use leasehold_lease::LeaseId;

use crate::command::{LeaseRenew, Write};

/// What a leader does with a write as it reaches it ([`leader_arrival`]), before its write
/// queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// Answered NOSPACE at once: it adds data and this member's disk is full.
    NoSpace,
    /// A renewal, decided now ([`crate::steps::LeaderRenewals::renew`]): answered from memory,
    /// the lease's end proposed, or queued through the log.
    Renew(LeaseId),
    /// Into the write queue, to be batched, stamped and proposed.
    Queue,
}

/// What a leader that times leases (`timing_leases`) or not yet does with `write` as it
/// arrives: from one of its own clients, or in a batch a follower forwarded. A renewal is
/// decided on arrival, never after a batching window, so that one answered from memory waits
/// for nothing; while the leader does not time leases yet it queues, and the stamp gate holds
/// it until the promotion. A follower's own admission could not see this member's disk, so its
/// rule applies here to what adds data.
pub fn leader_arrival(write: &Write, timing_leases: bool, disk_full: bool) -> Arrival {
    match write {
        _ if disk_full && write.adds_data() => Arrival::NoSpace,
        Write::LeaseRenew(LeaseRenew { id }) if timing_leases => Arrival::Renew(*id),
        _ => Arrival::Queue,
    }
}

/// Most writes in one log entry (a renewal is about 15 bytes of it, a 256-byte put about 280).
pub const BATCH_LEN_MAX: usize = 4096;

/// Soft bound on one log entry's size: a batch closes once it holds this much.
pub const BATCH_BYTES_MAX: usize = 4 * 1024 * 1024;

/// A batch being filled from the front of a queue: it takes the first write whatever its size,
/// then more while it holds fewer than [`BATCH_LEN_MAX`] writes and [`BATCH_BYTES_MAX`] bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct BatchFill {
    len: usize,
    bytes: usize,
}

impl BatchFill {
    /// Whether the batch takes another write.
    pub fn open(&self) -> bool {
        self.len == 0 || (self.len < BATCH_LEN_MAX && self.bytes < BATCH_BYTES_MAX)
    }

    /// Counts `write` in.
    pub fn add(&mut self, write: &Write) {
        self.len += 1;
        self.bytes += write.approx_bytes();
    }

    /// Takes the next batch off the front of `queue`.
    pub fn take<T>(
        queue: &mut std::collections::VecDeque<T>,
        write: impl Fn(&T) -> &Write,
    ) -> Vec<T> {
        let mut fill = BatchFill::default();
        let mut batch = Vec::new();
        while fill.open() {
            let Some(next) = queue.pop_front() else { break };
            fill.add(write(&next));
            batch.push(next);
        }
        batch
    }
}

/// Where a batch goes ([`batch_route`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchRoute {
    /// Proposed on this member's Raft: it leads, or knows no other leader (then its core drops
    /// the proposal, or the stamp gate refuses it, and the callers answer "no leader").
    Propose,
    /// Forwarded to `leader`, the writes of this member's own clients only: what a follower
    /// forwarded here answers "no leader" instead ([`BatchRoute::forwards`]).
    Forward { leader: u64 },
}

/// Where a batch goes on member `member_id`, which leads (`is_leader`) or not, and knows `leader`
/// as the leader (0: none).
pub fn batch_route(member_id: u64, is_leader: bool, leader: u64) -> BatchRoute {
    if is_leader || leader == 0 || leader == member_id {
        BatchRoute::Propose
    } else {
        BatchRoute::Forward { leader }
    }
}

impl BatchRoute {
    /// Whether a write that came `from_peer` (forwarded here by a follower) goes on with this
    /// route. A forwarded write is never forwarded again: a member that no longer leads answers
    /// it "no leader", and the follower retries with the new leader (two members each believing
    /// the other leads would pass it back and forth).
    pub fn forwards(self, from_peer: bool) -> bool {
        match self {
            BatchRoute::Propose => true,
            BatchRoute::Forward { .. } => !from_peer,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use leasehold_lease::LeaseId;

    use super::{
        Arrival, BATCH_BYTES_MAX, BATCH_LEN_MAX, BatchFill, BatchRoute, batch_route, leader_arrival,
    };
    use crate::command::{LeaseRenew, Write};

    fn renew() -> Write {
        Write::LeaseRenew(LeaseRenew {
            id: LeaseId::from_wire(1).expect("not zero"),
        })
    }

    fn put(value_len: usize) -> Write {
        Write::Put(leasehold_mvcc::PutRequest {
            key: b"k".to_vec(),
            value: vec![0; value_len],
            ..Default::default()
        })
    }

    #[test]
    fn a_batch_closes_at_its_count_or_its_bytes_and_always_takes_one() {
        let mut queue: VecDeque<Write> = (0..BATCH_LEN_MAX + 10).map(|_| renew()).collect();
        assert_eq!(BatchFill::take(&mut queue, |w| w).len(), BATCH_LEN_MAX);
        assert_eq!(BatchFill::take(&mut queue, |w| w).len(), 10);
        assert!(BatchFill::take(&mut queue, |w| w).is_empty());

        // Three stay under the bound (with their keys and framing); the fourth passes it.
        let big = BATCH_BYTES_MAX / 3 - 64;
        let mut queue: VecDeque<Write> = (0..5).map(|_| put(big)).collect();
        assert_eq!(
            BatchFill::take(&mut queue, |w| w).len(),
            4,
            "the write that passes the bound is the last one in"
        );
        let mut queue = VecDeque::from([put(2 * BATCH_BYTES_MAX), renew()]);
        assert_eq!(
            BatchFill::take(&mut queue, |w| w).len(),
            1,
            "a write larger than the bound goes alone"
        );
        assert_eq!(queue.len(), 1);
    }

    #[test]
    fn a_batch_is_proposed_by_its_leader_and_forwarded_once_by_a_follower() {
        assert_eq!(batch_route(1, true, 1), BatchRoute::Propose);
        assert_eq!(batch_route(1, false, 2), BatchRoute::Forward { leader: 2 });
        assert_eq!(
            batch_route(1, false, 0),
            BatchRoute::Propose,
            "no leader known: the core refuses it"
        );
        let forward = BatchRoute::Forward { leader: 2 };
        assert!(forward.forwards(false));
        assert!(!forward.forwards(true), "never forwarded twice");
        assert!(BatchRoute::Propose.forwards(true));
    }

    #[test]
    fn a_leader_decides_a_renewal_on_arrival_and_refuses_new_data_on_a_full_disk() {
        let id = LeaseId::from_wire(1).expect("not zero");
        assert_eq!(leader_arrival(&renew(), true, false), Arrival::Renew(id));
        assert_eq!(
            leader_arrival(&renew(), false, false),
            Arrival::Queue,
            "not timing leases yet: the stamp gate holds it"
        );
        assert_eq!(
            leader_arrival(&renew(), true, true),
            Arrival::Renew(id),
            "a renewal adds no data"
        );
        assert_eq!(leader_arrival(&put(8), true, false), Arrival::Queue);
        assert_eq!(leader_arrival(&put(8), true, true), Arrival::NoSpace);
        let delete = Write::DeleteRange(leasehold_mvcc::DeleteRangeRequest {
            key: b"k".to_vec(),
            ..Default::default()
        });
        assert_eq!(leader_arrival(&delete, true, true), Arrival::Queue);
    }
}
