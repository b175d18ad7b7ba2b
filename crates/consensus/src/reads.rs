//! Linearizable reads share ReadIndex rounds: every reader that arrives while no round is in
//! flight joins the next one, and one `read_index` call confirms leadership for all of them (as
//! etcd's `linearizableReadLoop` does). A reader that arrives while a round is in flight waits
//! for the round after it: the index of a round that began before the reader arrived could miss
//! a write the reader has already seen acknowledged.
//!
//! raft-rs drops a ReadIndex request without a word when there is no leader, when a new leader
//! has not yet committed in its term, or when the term changes (raft-rs.md §4), so a round that
//! gets no answer within `retry_ticks` is sent again under a new context, and a reader that
//! waited `give_up_ticks` is answered [`ReadError::Timeout`]. Time is ticks, counted by the
//! caller.

use std::collections::VecDeque;

/// Why a reader got no read index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// No leader confirmed a read index in time (an election, a cut-off member).
    #[error("no read index within the time allowed (no leader?)")]
    Timeout,
    /// The member is stopping.
    #[error("the member is stopping")]
    Stopped,
}

/// How a reader is answered: the read index to wait for (serve once applied ≥ it).
pub type ReadWaiter = Box<dyn FnOnce(Result<Confirmed, ReadError>) + Send>;

/// A read index a round confirmed, and what proves the round to a follower the leader reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Confirmed {
    pub index: u64,
    /// `None`: the round carried no heartbeat (a lone voter), or this member no longer led.
    pub proof: Option<ReadProof>,
}

/// A leader's read round reaches every follower the leader's own traffic reaches: its Raft
/// heartbeats of `term` carried the round's `context` once the round began. A follower that has
/// stepped such a heartbeat, or a later round's ([`crate::HeartbeatSeen::proves`]), has heard
/// from the leader since the round began; one the leader cannot reach never does, though the
/// others confirm the round and the follower's own asks still get through. Only leaders start
/// rounds under contexts of this module's form, so those of one leader's term count up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReadProof {
    pub term: u64,
    pub context: u64,
}

struct Reader {
    arrived_tick: u64,
    answer: ReadWaiter,
}

struct Round {
    context: u64,
    sent_tick: u64,
    readers: Vec<Reader>,
}

/// Something that takes ReadIndex requests (the core; a fake in tests).
pub trait ReadIndexTarget {
    fn read_index(&mut self, context: Vec<u8>);
}

impl<F: leasehold_wal::Fs> ReadIndexTarget for crate::Core<F> {
    fn read_index(&mut self, context: Vec<u8>) {
        crate::Core::read_index(self, context);
    }
}

pub struct ReadBatcher {
    /// Contexts are this member's own: 8 bytes, counting up, never reused.
    next_context: u64,
    waiting: VecDeque<Reader>,
    in_flight: Option<Round>,
    now_tick: u64,
    retry_ticks: u64,
    give_up_ticks: u64,
}

impl std::fmt::Debug for ReadBatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadBatcher")
            .field("waiting", &self.waiting.len())
            .field(
                "in_flight",
                &self.in_flight.as_ref().map(|r| r.readers.len()),
            )
            .finish()
    }
}

const CONTEXT_BYTES: usize = 8;

impl ReadBatcher {
    /// `retry_ticks`: a round unanswered that long is sent again (etcd waits 500 ms, five of its
    /// ticks); `give_up_ticks`: a reader waiting that long is refused.
    pub fn new(retry_ticks: u64, give_up_ticks: u64) -> ReadBatcher {
        assert!(retry_ticks > 0 && give_up_ticks >= retry_ticks);
        ReadBatcher {
            next_context: 1,
            waiting: VecDeque::new(),
            in_flight: None,
            now_tick: 0,
            retry_ticks,
            give_up_ticks,
        }
    }

    /// A reader for the next round.
    pub fn add(&mut self, answer: ReadWaiter) {
        self.waiting.push_back(Reader {
            arrived_tick: self.now_tick,
            answer,
        });
    }

    /// Readers waiting or in a round.
    pub fn pending(&self) -> usize {
        self.waiting.len() + self.in_flight.as_ref().map_or(0, |r| r.readers.len())
    }

    /// Starts a round for the waiting readers if none is in flight. Call after adding readers
    /// and after each tick.
    pub fn send(&mut self, target: &mut impl ReadIndexTarget) {
        if self.in_flight.is_some() || self.waiting.is_empty() {
            return;
        }
        let context = self.next_context;
        self.next_context += 1;
        target.read_index(context.to_be_bytes().to_vec());
        self.in_flight = Some(Round {
            context,
            sent_tick: self.now_tick,
            readers: self.waiting.drain(..).collect(),
        });
    }

    /// ReadStates the core confirmed: the round they answer releases its readers with the index
    /// and, when the core leads with other voters in `proof_term` ([`crate::Core::read_proof`]),
    /// the proof. Others (a round given up on and sent again) are ignored.
    pub fn confirmed(&mut self, states: &[raft::ReadState], proof_term: Option<u64>) {
        for state in states {
            let Ok(bytes) = <[u8; CONTEXT_BYTES]>::try_from(state.request_ctx.as_slice()) else {
                continue;
            };
            let context = u64::from_be_bytes(bytes);
            if self
                .in_flight
                .as_ref()
                .is_some_and(|r| r.context == context)
            {
                let round = self.in_flight.take().expect("checked");
                let confirmed = Confirmed {
                    index: state.index,
                    proof: proof_term.map(|term| ReadProof { term, context }),
                };
                for reader in round.readers {
                    (reader.answer)(Ok(confirmed));
                }
            }
        }
    }

    /// One tick passed: readers past their time are refused, and a round unanswered for
    /// `retry_ticks` is sent again under a new context (its readers first in line).
    pub fn tick(&mut self, target: &mut impl ReadIndexTarget) {
        self.now_tick += 1;
        let now = self.now_tick;
        let give_up = self.give_up_ticks;
        let expired = |r: &Reader| now.saturating_sub(r.arrived_tick) >= give_up;
        if let Some(round) = &self.in_flight
            && now.saturating_sub(round.sent_tick) >= self.retry_ticks
        {
            let round = self.in_flight.take().expect("checked");
            for reader in round.readers.into_iter().rev() {
                self.waiting.push_front(reader);
            }
        }
        let mut kept = VecDeque::with_capacity(self.waiting.len());
        for reader in self.waiting.drain(..) {
            if expired(&reader) {
                (reader.answer)(Err(ReadError::Timeout));
            } else {
                kept.push_back(reader);
            }
        }
        self.waiting = kept;
        if let Some(round) = &mut self.in_flight {
            let (gone, stay): (Vec<Reader>, Vec<Reader>) =
                round.readers.drain(..).partition(|r| expired(r));
            round.readers = stay;
            for reader in gone {
                (reader.answer)(Err(ReadError::Timeout));
            }
            if round.readers.is_empty() {
                self.in_flight = None;
            }
        }
        self.send(target);
    }

    /// The member stops: every reader is answered `Stopped`.
    pub fn stop(&mut self) {
        let round = self.in_flight.take().map(|r| r.readers).unwrap_or_default();
        for reader in round.into_iter().chain(self.waiting.drain(..)) {
            (reader.answer)(Err(ReadError::Stopped));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Default)]
    struct Sent(Vec<u64>);

    impl ReadIndexTarget for Sent {
        fn read_index(&mut self, context: Vec<u8>) {
            self.0
                .push(u64::from_be_bytes(context.try_into().expect("8 bytes")));
        }
    }

    type Answers = Arc<Mutex<Vec<(usize, Result<u64, ReadError>)>>>;

    fn reader(answers: &Answers, id: usize) -> ReadWaiter {
        let answers = answers.clone();
        Box::new(move |r| answers.lock().unwrap().push((id, r.map(|c| c.index))))
    }

    fn state(context: u64, index: u64) -> raft::ReadState {
        raft::ReadState {
            index,
            request_ctx: context.to_be_bytes().to_vec(),
        }
    }

    #[test]
    fn readers_that_arrive_together_share_one_round_and_later_ones_wait_for_the_next() {
        let answers = Answers::default();
        let mut sent = Sent::default();
        let mut reads = ReadBatcher::new(5, 50);
        reads.add(reader(&answers, 1));
        reads.add(reader(&answers, 2));
        reads.send(&mut sent);
        reads.add(reader(&answers, 3));
        reads.send(&mut sent);
        assert_eq!(sent.0, vec![1], "one round in flight at a time");
        reads.confirmed(&[state(1, 40)], None);
        assert_eq!(*answers.lock().unwrap(), vec![(1, Ok(40)), (2, Ok(40))]);
        reads.send(&mut sent);
        assert_eq!(sent.0, vec![1, 2], "the late reader's own round");
        reads.confirmed(&[state(2, 41)], None);
        assert_eq!(answers.lock().unwrap()[2], (3, Ok(41)));
        assert_eq!(reads.pending(), 0);
    }

    #[test]
    fn a_dropped_round_is_sent_again_and_a_reader_gives_up_in_time() {
        let answers = Answers::default();
        let mut sent = Sent::default();
        let mut reads = ReadBatcher::new(3, 7);
        reads.add(reader(&answers, 1));
        reads.send(&mut sent);
        for _ in 0..3 {
            reads.tick(&mut sent);
        }
        assert_eq!(
            sent.0,
            vec![1, 2],
            "resent under a new context after 3 ticks"
        );
        // The first round's late answer releases nobody: its readers moved to the second.
        reads.confirmed(&[state(1, 10)], None);
        assert!(answers.lock().unwrap().is_empty());
        for _ in 0..4 {
            reads.tick(&mut sent);
        }
        assert_eq!(*answers.lock().unwrap(), vec![(1, Err(ReadError::Timeout))]);
        assert_eq!(reads.pending(), 0);
    }

    /// A round confirmed on a leader with other voters carries its own context and term, the
    /// resent one's after a retry.
    #[test]
    fn a_round_is_confirmed_with_its_proof() {
        let got = Arc::new(Mutex::new(Vec::new()));
        let mut sent = Sent::default();
        let mut reads = ReadBatcher::new(3, 7);
        let answer = |got: &Arc<Mutex<Vec<Result<Confirmed, ReadError>>>>| -> ReadWaiter {
            let got = got.clone();
            Box::new(move |r| got.lock().unwrap().push(r))
        };
        reads.add(answer(&got));
        reads.send(&mut sent);
        for _ in 0..3 {
            reads.tick(&mut sent);
        }
        reads.confirmed(&[state(2, 12)], Some(5));
        let proof = Some(ReadProof {
            term: 5,
            context: 2,
        });
        assert_eq!(
            *got.lock().unwrap(),
            vec![Ok(Confirmed { index: 12, proof })]
        );
        reads.add(answer(&got));
        reads.send(&mut sent);
        reads.confirmed(&[state(3, 13)], None);
        assert_eq!(
            got.lock().unwrap()[1],
            Ok(Confirmed {
                index: 13,
                proof: None
            })
        );
    }

    #[test]
    fn stopping_answers_every_reader() {
        let answers = Answers::default();
        let mut sent = Sent::default();
        let mut reads = ReadBatcher::new(3, 7);
        reads.add(reader(&answers, 1));
        reads.send(&mut sent);
        reads.add(reader(&answers, 2));
        reads.stop();
        assert_eq!(
            *answers.lock().unwrap(),
            vec![(1, Err(ReadError::Stopped)), (2, Err(ReadError::Stopped))]
        );
    }
}
