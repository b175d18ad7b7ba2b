//! The leader's lease time: the clock a member times leases with while it leads, and the stamp
//! it puts on grants and renewals. Promotion and demotion, which set the clock, are
//! `promotion.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_lease::LeaseClock;
use tokio::sync::watch;

use super::error::ReplicaError;
use crate::clock::Clock;
use crate::command::{Proposal, Write};
use crate::steps;

/// The lease clock a leader times leases with, shared by the replica and its proposer; a watch
/// channel, so that whoever waits for this member to start (or stop) timing leases is woken
/// rather than polling. Beside it, the time source ([`Clock`]) every lease-time reading of the
/// replica takes its now from.
#[derive(Clone)]
pub(super) struct SharedClock {
    lease: Arc<watch::Sender<Option<LeaseClock>>>,
    time: Arc<dyn Clock>,
}

impl SharedClock {
    pub(super) fn new(time: Arc<dyn Clock>) -> SharedClock {
        SharedClock {
            lease: Arc::new(watch::Sender::new(None)),
            time,
        }
    }

    pub(super) fn get(&self) -> Option<LeaseClock> {
        *self.lease.borrow()
    }

    pub(super) fn set(&self, clock: Option<LeaseClock>) {
        self.lease.send_replace(clock);
    }

    pub(super) fn subscribe(&self) -> watch::Receiver<Option<LeaseClock>> {
        self.lease.subscribe()
    }

    /// Now, on the replica's time source.
    pub(super) fn now(&self) -> Instant {
        self.time.now()
    }

    pub(super) fn time(&self) -> &Arc<dyn Clock> {
        &self.time
    }

    /// The lease time now, if this member times leases.
    pub(super) fn lease_now_ms(&self) -> Option<u64> {
        self.get().map(|c| c.now_ms(self.now()))
    }

    /// Waits (at most `bound`) until this member times leases; whether it does.
    pub(super) async fn wait_timing(&self, bound: Duration) -> bool {
        let mut clock = self.subscribe();
        let timing = clock.wait_for(Option::is_some);
        matches!(tokio::time::timeout(bound, timing).await, Ok(Ok(_)))
    }
}

/// Turns a batch of writes into a log entry stamped with this member's lease time now
/// ([`steps::stamp`]), renewals covering `cover_margin_ms` beyond their deadlines.
pub(super) fn stamp_lease_times(
    clock: &SharedClock,
    cover_margin_ms: u64,
    writes: Vec<Write>,
) -> Result<Proposal, ReplicaError> {
    Ok(steps::stamp(
        clock.get(),
        clock.now(),
        cover_margin_ms,
        writes,
    )?)
}
