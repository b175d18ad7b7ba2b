//! What crosses each peer's links, for etcd's `etcd_network_*` metrics: bytes of Raft messages
//! sent to and received from each peer, the messages that could not be sent, and when each peer
//! was last heard from (a peer heard from lately is an active peer). Atomics, one set per peer,
//! looked up once per stream.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A peer heard from within this long is active.
const ACTIVE_WITHIN: Duration = Duration::from_secs(3);

#[derive(Debug)]
pub struct Traffic {
    since: Instant,
    peers: Mutex<BTreeMap<u64, Arc<PeerCounts>>>,
}

impl Default for Traffic {
    fn default() -> Traffic {
        Traffic {
            since: Instant::now(),
            peers: Mutex::default(),
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct PeerCounts {
    sent_bytes: AtomicU64,
    sent_failures: AtomicU64,
    received_bytes: AtomicU64,
    /// When the peer was last heard from, in ms since [`Traffic::since`] plus one (0: never).
    heard_at: AtomicU64,
}

/// One peer's traffic, as read for the metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerReading {
    pub id: u64,
    pub sent_bytes: u64,
    pub received_bytes: u64,
    pub sent_failures: u64,
    /// Heard from within the last few seconds.
    pub active: bool,
}

impl Traffic {
    pub(crate) fn of(&self, peer: u64) -> Arc<PeerCounts> {
        self.peers
            .lock()
            .expect("traffic lock poisoned")
            .entry(peer)
            .or_default()
            .clone()
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }

    pub(crate) fn sent(&self, counts: &PeerCounts, bytes: usize) {
        counts.sent_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub(crate) fn not_sent(&self, counts: &PeerCounts) {
        counts.sent_failures.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn received(&self, counts: &PeerCounts, bytes: usize) {
        counts
            .received_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
        counts.heard_at.store(self.now_ms() + 1, Ordering::Relaxed);
    }

    /// Every peer that has had traffic, by ID.
    pub fn readings(&self) -> Vec<PeerReading> {
        let now = self.now_ms();
        let active_ms = ACTIVE_WITHIN.as_millis() as u64;
        self.peers
            .lock()
            .expect("traffic lock poisoned")
            .iter()
            .map(|(id, c)| {
                let heard_at = c.heard_at.load(Ordering::Relaxed);
                PeerReading {
                    id: *id,
                    sent_bytes: c.sent_bytes.load(Ordering::Relaxed),
                    received_bytes: c.received_bytes.load(Ordering::Relaxed),
                    sent_failures: c.sent_failures.load(Ordering::Relaxed),
                    active: heard_at != 0 && now + 1 - heard_at <= active_ms,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_peer_is_counted_apart_and_heard_from_peers_are_active() {
        let traffic = Traffic::default();
        let a = traffic.of(1);
        traffic.sent(&a, 10);
        traffic.sent(&traffic.of(1), 5);
        traffic.not_sent(&a);
        let b = traffic.of(2);
        traffic.received(&b, 7);
        assert_eq!(
            traffic.readings(),
            vec![
                PeerReading {
                    id: 1,
                    sent_bytes: 15,
                    received_bytes: 0,
                    sent_failures: 1,
                    active: false
                },
                PeerReading {
                    id: 2,
                    sent_bytes: 0,
                    received_bytes: 7,
                    sent_failures: 0,
                    active: true
                },
            ]
        );
    }
}
