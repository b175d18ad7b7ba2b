//! Group commit's decisions: what a leader does with a write as it arrives, how many queued
//! writes one log entry takes, and where a batch goes.

use std::time::Instant;

use leasehold_lease::LeaseId;

use super::{PROMOTION_WAIT_MAX, StampGate, stamp_gate};
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

/// A member's proposer, batch by batch: where each batch taken off the write queue goes
/// ([`batch_route`]), whether it may be stamped ([`stamp_gate`]), and the one batch a leader
/// that does not time leases yet holds until it does, or for at most [`PROMOTION_WAIT_MAX`].
/// While a batch is held nothing more is taken off the queue, so what was written after it is
/// never stamped before it. `T` is a queued write with whatever waits for it; the replica's
/// proposer task and the simulator's member each keep the queue and carry out the steps.
#[derive(Debug)]
pub struct Proposer<T> {
    held: Option<(Instant, Vec<T>)>,
}

impl<T> Default for Proposer<T> {
    fn default() -> Self {
        Proposer { held: None }
    }
}

/// What becomes of one batch ([`Proposer::batch`]).
#[derive(Debug)]
pub struct BatchStep<T> {
    /// Answered "no leader" at once: a follower's forwarded writes on a member that does not
    /// lead (never forwarded twice), or a whole batch that needs lease time on a member that
    /// does not lead (the callers wait for the next leader).
    pub no_leader: Vec<T>,
    pub go: Go<T>,
}

/// Where the rest of a batch goes.
#[derive(Debug, PartialEq, Eq)]
pub enum Go<T> {
    /// Nowhere: nothing is left.
    Done,
    /// Forwarded to `leader`.
    Forward { leader: u64, batch: Vec<T> },
    /// Stamped ([`crate::steps::stamp`]) and proposed on this member's Raft. A stamp that finds
    /// no lease clock (a hold that ran out) answers each write "no leader".
    Propose(Vec<T>),
    /// Held until this member times leases or `until` passes: ask [`Proposer::release`] then,
    /// and take nothing off the queue meanwhile.
    Hold { until: Instant },
}

impl<T> Proposer<T> {
    /// Until when a batch is held, if one is.
    pub fn holding(&self) -> Option<Instant> {
        self.held.as_ref().map(|(until, _)| *until)
    }

    /// A batch taken off the queue at `now` by member `member_id`, which leads (`is_leader`) or
    /// follows `leader` (0: none known), and times leases (`timing`) or not. `write` and
    /// `from_peer` read a queued write and whether a follower forwarded it here.
    #[allow(clippy::too_many_arguments)]
    pub fn batch(
        &mut self,
        batch: Vec<T>,
        write: impl Fn(&T) -> &Write,
        from_peer: impl Fn(&T) -> bool,
        member_id: u64,
        is_leader: bool,
        leader: u64,
        timing: bool,
        now: Instant,
    ) -> BatchStep<T> {
        debug_assert!(self.held.is_none(), "a batch was taken while one is held");
        let route = batch_route(member_id, is_leader, leader);
        let (own, mut no_leader): (Vec<T>, Vec<T>) = batch
            .into_iter()
            .partition(|queued| route.forwards(from_peer(queued)));
        let go = match route {
            _ if own.is_empty() => Go::Done,
            BatchRoute::Forward { leader } => Go::Forward { leader, batch: own },
            BatchRoute::Propose => match stamp_gate(own.iter().map(write), timing, is_leader) {
                StampGate::Now => Go::Propose(own),
                StampGate::NoLeader => {
                    no_leader.extend(own);
                    Go::Done
                }
                StampGate::AwaitPromotion => {
                    let until = now + PROMOTION_WAIT_MAX;
                    self.held = Some((until, own));
                    Go::Hold { until }
                }
            },
        };
        BatchStep { no_leader, go }
    }

    /// The held batch, to be stamped and proposed, once this member times leases or at `now`
    /// its wait has run out; `None` while it waits on (or nothing is held).
    pub fn release(&mut self, timing: bool, now: Instant) -> Option<Vec<T>> {
        match self.held {
            Some((until, _)) if timing || now >= until => self.held.take().map(|(_, b)| b),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use leasehold_lease::LeaseId;

    use super::{
        Arrival, BATCH_BYTES_MAX, BATCH_LEN_MAX, BatchFill, BatchRoute, Go, Proposer, batch_route,
        leader_arrival,
    };
    use crate::command::{LeaseRenew, Write};
    use crate::steps::PROMOTION_WAIT_MAX;

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

    /// A queued write as the tests keep it: its name, the write, and whether a follower
    /// forwarded it.
    type Queued = (&'static str, Write, bool);

    fn step(
        proposer: &mut Proposer<Queued>,
        batch: Vec<Queued>,
        is_leader: bool,
        leader: u64,
        timing: bool,
        now: std::time::Instant,
    ) -> (Vec<&'static str>, Go<Vec<&'static str>>) {
        let step = proposer.batch(batch, |q| &q.1, |q| q.2, 1, is_leader, leader, timing, now);
        let names = |batch: Vec<Queued>| batch.into_iter().map(|q| q.0).collect::<Vec<_>>();
        let go = match step.go {
            Go::Done => Go::Done,
            Go::Forward { leader, batch } => Go::Forward {
                leader,
                batch: vec![names(batch)],
            },
            Go::Propose(batch) => Go::Propose(vec![names(batch)]),
            Go::Hold { until } => Go::Hold { until },
        };
        (names(step.no_leader), go)
    }

    #[test]
    fn a_new_leader_holds_a_batch_needing_lease_time_until_it_times_leases_or_the_bound() {
        let now = std::time::Instant::now();
        let mut proposer = Proposer::default();
        let until = now + PROMOTION_WAIT_MAX;
        let batch = vec![("renew", renew(), false), ("put", put(1), true)];
        assert_eq!(
            step(&mut proposer, batch, true, 1, false, now),
            (vec![], Go::Hold { until })
        );
        assert_eq!(proposer.holding(), Some(until));
        assert!(
            proposer
                .release(false, until - std::time::Duration::from_millis(1))
                .is_none()
        );
        let released = proposer
            .release(true, now)
            .expect("timing leases: released");
        assert_eq!(released.len(), 2);
        assert_eq!(proposer.holding(), None);

        // Never promoted: released at the bound, to be answered "no leader" by its stamp.
        let batch = vec![("grant", renew(), false)];
        step(&mut proposer, batch, true, 1, false, now);
        assert!(proposer.release(false, until).is_some());

        // Nothing in it needs lease time: proposed at once.
        let batch = vec![("put", put(1), false)];
        assert_eq!(
            step(&mut proposer, batch, true, 1, false, now),
            (vec![], Go::Propose(vec![vec!["put"]]))
        );
    }

    #[test]
    fn a_follower_forwards_its_own_writes_and_refuses_what_was_forwarded_to_it() {
        let now = std::time::Instant::now();
        let mut proposer = Proposer::default();
        let batch = vec![
            ("own", put(1), false),
            ("theirs", put(1), true),
            ("own renewal", renew(), false),
        ];
        assert_eq!(
            step(&mut proposer, batch, false, 2, false, now),
            (
                vec!["theirs"],
                Go::Forward {
                    leader: 2,
                    batch: vec![vec!["own", "own renewal"]]
                }
            )
        );
        // No leader known: what needs lease time answers "no leader", and so does the rest of
        // its batch; a batch without lease writes goes to the core (which refuses it).
        let batch = vec![("put", put(1), false), ("renew", renew(), false)];
        assert_eq!(
            step(&mut proposer, batch, false, 0, false, now),
            (vec!["put", "renew"], Go::Done)
        );
        let batch = vec![("put", put(1), false)];
        assert_eq!(
            step(&mut proposer, batch, false, 0, false, now),
            (vec![], Go::Propose(vec![vec!["put"]]))
        );
        assert_eq!(proposer.holding(), None, "only a leader holds");
    }
}
