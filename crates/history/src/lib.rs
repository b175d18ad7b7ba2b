//! A linearizability checker for per-key histories (Wing & Gong's search with memoisation, as
//! in Lowe's "Testing for linearizability" and Porcupine), written for leasehold's history tests.
//!
//! The model is one key: absent, or a value with the lease it is attached to. Operations are
//! what the tests do to a key through the etcd API: put (with or without a lease), get,
//! compare-and-set on the value (a Txn), delete, and a lease revoke (which deletes the key if it
//! is attached to that lease). Each operation has the time it was invoked and, if the client got
//! an answer, the time it completed and the answer. An operation whose outcome is unknown (an
//! error or time-out on a write) may have taken effect at any point after its invocation, or not
//! at all; an unanswered read constrains nothing and is dropped.
//!
//! A history is linearizable if there is an order of the operations, consistent with real time
//! (an operation that completed before another was invoked comes first), in which every answered
//! operation returns what the model returns.

use std::collections::HashSet;
use std::time::{Duration, Instant};

/// The key's state: absent, or (value, lease; 0 for none).
pub type State = Option<(String, i64)>;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Put {
        value: String,
        lease: i64,
    },
    Get,
    /// Sets `new` if the value is `expected` (a missing key has no value).
    Cas {
        expected: String,
        new: String,
    },
    Delete,
    /// Deletes the key if it is attached to `lease`.
    Revoke {
        lease: i64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// A write's acknowledgement.
    Done,
    /// A get's result: the value, or `None` for an absent key.
    Value(Option<String>),
    /// A compare-and-set's `succeeded`.
    Swapped(bool),
}

#[derive(Clone, Debug)]
pub struct Event {
    /// Which client made it (shown when a history fails).
    pub client: usize,
    pub op: Op,
    pub invoked: Instant,
    /// When and what the client heard back; `None` if the outcome is unknown.
    pub completed: Option<(Instant, Answer)>,
}

/// Applies `op` to `state`: the new state and what the model answers.
fn step(state: &State, op: &Op) -> (State, Answer) {
    match op {
        Op::Put { value, lease } => (Some((value.clone(), *lease)), Answer::Done),
        Op::Get => (
            state.clone(),
            Answer::Value(state.as_ref().map(|(v, _)| v.clone())),
        ),
        Op::Cas { expected, new } => match state {
            Some((v, lease)) if v == expected => {
                // etcd's put in the txn carries no lease: the key is detached.
                let _ = lease;
                (Some((new.clone(), 0)), Answer::Swapped(true))
            }
            _ => (state.clone(), Answer::Swapped(false)),
        },
        Op::Delete => (None, Answer::Done),
        Op::Revoke { lease } => match state {
            Some((_, l)) if l == lease => (None, Answer::Done),
            _ => (state.clone(), Answer::Done),
        },
    }
}

/// Largest history the search accepts for one key.
pub const EVENTS_MAX: usize = 128;

/// Whether `events` (one key's history, starting from `initial`) is linearizable. On failure,
/// the longest prefix of a linearization found, for the message.
pub fn check(initial: State, events: &[Event]) -> Result<(), String> {
    let events: Vec<&Event> = events
        .iter()
        .filter(|e| e.completed.is_some() || !matches!(e.op, Op::Get))
        .collect();
    assert!(
        events.len() <= EVENTS_MAX,
        "history of {} events is too long to check",
        events.len()
    );
    let mut search = Search {
        events: &events,
        seen: HashSet::new(),
        best: Vec::new(),
    };
    let mut done = vec![false; events.len()];
    let mut order = Vec::new();
    if search.extend(&initial, &mut done, &mut order) {
        Ok(())
    } else {
        // Times are shown from the history's first invocation, so that a replayed run (whose
        // instants are anchored elsewhere) prints the same message.
        let origin = events.iter().map(|e| e.invoked).min();
        let since =
            |at: Instant| origin.map_or(Duration::ZERO, |o| at.saturating_duration_since(o));
        let shown: Vec<String> = search
            .best
            .iter()
            .map(|i| {
                let e = events[*i];
                let completed = match &e.completed {
                    Some((at, answer)) => format!("at +{:?}: {answer:?}", since(*at)),
                    None => "never answered".to_owned(),
                };
                format!(
                    "client {} {:?}, invoked at +{:?}, {completed}",
                    e.client,
                    e.op,
                    since(e.invoked)
                )
            })
            .collect();
        Err(format!(
            "not linearizable; the longest linearizable prefix found:\n  {}",
            shown.join("\n  ")
        ))
    }
}

struct Search<'a> {
    events: &'a [&'a Event],
    /// (linearized set, state) pairs already explored and found to lead nowhere.
    seen: HashSet<(Vec<bool>, State)>,
    best: Vec<usize>,
}

impl Search<'_> {
    fn extend(&mut self, state: &State, done: &mut Vec<bool>, order: &mut Vec<usize>) -> bool {
        // Done when every answered operation is placed (unanswered writes may never happen).
        if self
            .events
            .iter()
            .enumerate()
            .all(|(i, e)| done[i] || e.completed.is_none())
        {
            return true;
        }
        if !self.seen.insert((done.clone(), state.clone())) {
            return false;
        }
        if order.len() > self.best.len() {
            self.best = order.clone();
        }
        // An operation can go next only if no pending operation completed before it was invoked.
        let earliest_completion = self
            .events
            .iter()
            .enumerate()
            .filter(|(i, _)| !done[*i])
            .filter_map(|(_, e)| e.completed.as_ref().map(|(at, _)| *at))
            .min();
        for i in 0..self.events.len() {
            if done[i] {
                continue;
            }
            let e = self.events[i];
            if earliest_completion.is_some_and(|at| at < e.invoked) {
                continue;
            }
            let (next, answer) = step(state, &e.op);
            if let Some((_, expected)) = &e.completed
                && *expected != answer
            {
                continue;
            }
            done[i] = true;
            order.push(i);
            if self.extend(&next, done, order) {
                return true;
            }
            order.pop();
            done[i] = false;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// An event from `from` to `to` milliseconds after a common origin.
    fn ev(origin: Instant, client: usize, op: Op, from: u64, to: Option<(u64, Answer)>) -> Event {
        Event {
            client,
            op,
            invoked: origin + Duration::from_millis(from),
            completed: to.map(|(t, a)| (origin + Duration::from_millis(t), a)),
        }
    }

    fn put(v: &str) -> Op {
        Op::Put {
            value: v.into(),
            lease: 0,
        }
    }

    fn got(v: Option<&str>) -> Answer {
        Answer::Value(v.map(str::to_owned))
    }

    #[test]
    fn known_linearizable_histories_pass() {
        let o = Instant::now();
        // Overlapping put and get: the get may see either value.
        let h = vec![
            ev(o, 0, put("a"), 0, Some((10, Answer::Done))),
            ev(o, 1, put("b"), 20, Some((40, Answer::Done))),
            ev(o, 2, Op::Get, 25, Some((30, got(Some("a"))))),
            ev(o, 2, Op::Get, 50, Some((60, got(Some("b"))))),
        ];
        assert_eq!(check(None, &h), Ok(()));
        // A write with an unknown outcome that did happen, and one that did not.
        let h = vec![
            ev(o, 0, put("a"), 0, None),
            ev(o, 1, Op::Get, 10, Some((20, got(Some("a"))))),
            ev(o, 0, put("z"), 30, None),
            ev(o, 1, Op::Get, 40, Some((50, got(Some("a"))))),
        ];
        assert_eq!(check(None, &h), Ok(()));
        // Compare-and-set and a revoke of the lease the key is attached to.
        let h = vec![
            ev(
                o,
                0,
                Op::Put {
                    value: "a".into(),
                    lease: 7,
                },
                0,
                Some((10, Answer::Done)),
            ),
            ev(
                o,
                1,
                Op::Cas {
                    expected: "x".into(),
                    new: "y".into(),
                },
                20,
                Some((30, Answer::Swapped(false))),
            ),
            ev(o, 2, Op::Revoke { lease: 7 }, 40, Some((50, Answer::Done))),
            ev(o, 1, Op::Get, 60, Some((70, got(None)))),
        ];
        assert_eq!(check(None, &h), Ok(()));
    }

    #[test]
    fn known_non_linearizable_histories_fail() {
        let o = Instant::now();
        // A stale read: the put completed before the get began, yet the get misses it.
        let h = vec![
            ev(o, 0, put("a"), 0, Some((10, Answer::Done))),
            ev(o, 1, Op::Get, 20, Some((30, got(None)))),
        ];
        assert!(check(None, &h).is_err());
        // Reads going back in time: b then a, with a written before b.
        let h = vec![
            ev(o, 0, put("a"), 0, Some((10, Answer::Done))),
            ev(o, 0, put("b"), 20, Some((30, Answer::Done))),
            ev(o, 1, Op::Get, 40, Some((50, got(Some("b"))))),
            ev(o, 2, Op::Get, 60, Some((70, got(Some("a"))))),
        ];
        assert!(check(None, &h).is_err());
        // Two compare-and-sets from the same value both succeeding.
        let cas = |new: &str| Op::Cas {
            expected: "a".into(),
            new: new.into(),
        };
        let h = vec![
            ev(o, 0, put("a"), 0, Some((10, Answer::Done))),
            ev(o, 1, cas("b"), 20, Some((40, Answer::Swapped(true)))),
            ev(o, 2, cas("c"), 25, Some((45, Answer::Swapped(true)))),
        ];
        assert!(check(None, &h).is_err());
        // A revoke of another lease deleting the key.
        let h = vec![
            ev(
                o,
                0,
                Op::Put {
                    value: "a".into(),
                    lease: 7,
                },
                0,
                Some((10, Answer::Done)),
            ),
            ev(o, 1, Op::Revoke { lease: 8 }, 20, Some((30, Answer::Done))),
            ev(o, 1, Op::Get, 40, Some((50, got(None)))),
        ];
        assert!(check(None, &h).is_err());
    }
}
