//! The one clock a replica reads lease time from, and that its server's expiry driver sleeps
//! on: the system's monotonic clock in production, or a [`ManualClock`] that a test moves by
//! hand, so that lease expiry, renewal and promotion can be tested in-process on paused time.
//!
//! What reads it: the leader's lease clock (promotion, the stamps on grants and renewals,
//! renewals answered from memory, the lease time a read index carries), the dates of appended
//! entries that a new leader promotes its lease time from, the lease time a member shows when
//! it does not lead, and the expiry driver. What does not: Raft's own ticks (elections and
//! heartbeats run on the Raft thread's real time), timeouts that bound how long a caller
//! waits, the idle lifetime of simple auth tokens, and the durations the telemetry records.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::BoxFuture;

/// Monotonic time for lease timing.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Now.
    fn now(&self) -> Instant;

    /// Resolves once [`Clock::now`] has reached `at` (at once if it has).
    fn sleep_until(&self, at: Instant) -> BoxFuture<()>;
}

/// The system's monotonic clock, slept on with tokio's timer.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep_until(&self, at: Instant) -> BoxFuture<()> {
        Box::pin(tokio::time::sleep_until(tokio::time::Instant::from_std(at)))
    }
}

/// The clock production runs on.
pub fn system_clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

/// A clock that stands still until [`ManualClock::advance`] moves it. Sleepers wake when it
/// passes their instant, in whatever task awaits them.
#[derive(Debug)]
pub struct ManualClock {
    now: watch::Sender<Instant>,
}

impl ManualClock {
    /// A clock standing at the system's now.
    pub fn new() -> Arc<ManualClock> {
        Arc::new(ManualClock {
            now: watch::Sender::new(Instant::now()),
        })
    }

    /// Moves the clock `by` forward, waking the sleepers it passes.
    pub fn advance(&self, by: Duration) {
        self.now.send_modify(|now| *now += by);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        *self.now.borrow()
    }

    fn sleep_until(&self, at: Instant) -> BoxFuture<()> {
        let mut now = self.now.subscribe();
        Box::pin(async move {
            // The sender lives as long as the clock; a sleeper outliving it never wakes, as
            // time that no longer moves never reaches it.
            if now.wait_for(|now| *now >= at).await.is_err() {
                std::future::pending::<()>().await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_sleeper_wakes_when_the_clock_passes_its_instant_and_not_before() {
        let clock = ManualClock::new();
        let at = clock.now() + Duration::from_secs(5);
        let sleeper = tokio::spawn(clock.sleep_until(at));
        clock.advance(Duration::from_millis(4_999));
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!sleeper.is_finished(), "1 ms before its instant");
        clock.advance(Duration::from_millis(1));
        tokio::time::timeout(Duration::from_secs(10), sleeper)
            .await
            .expect("woken once the clock reached its instant")
            .unwrap();
        // One whose instant has passed resolves at once.
        clock.sleep_until(at).await;
    }
}
