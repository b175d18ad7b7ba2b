use std::time::{Duration, Instant};

/// The leader's mapping from its monotonic clock to lease time. Created at promotion; dropped at
/// demotion (a member that does not lead has none and times nothing).
#[derive(Clone, Copy, Debug)]
pub struct LeaseClock {
    /// The replicated lease time at promotion.
    base_ms: u64,
    /// When this member was promoted.
    promoted: Instant,
}

impl LeaseClock {
    /// Lease time continues from the replicated clock. (The leases inherited at promotion get
    /// their extension from [`crate::LeaseTable::extend_all`], proposed through the log.)
    pub fn promote(replicated_ms: u64, now: Instant) -> LeaseClock {
        LeaseClock {
            base_ms: replicated_ms,
            promoted: now,
        }
    }

    /// Lease time at `now`. Never below the replicated time at promotion.
    pub fn now_ms(&self, now: Instant) -> u64 {
        let running = now.saturating_duration_since(self.promoted);
        self.base_ms + u64::try_from(running.as_millis()).unwrap_or(u64::MAX / 2)
    }

    /// Lease time at `now`, rounded up to the next whole millisecond: what deadlines are counted
    /// from, so that a lease never ends before its TTL has fully passed in real time (`now_ms`
    /// rounds down, so expiry checks never run ahead either).
    pub fn now_ms_ceil(&self, now: Instant) -> u64 {
        let running = now.saturating_duration_since(self.promoted);
        let ms = running.as_nanos().div_ceil(1_000_000);
        self.base_ms + u64::try_from(ms).unwrap_or(u64::MAX / 2)
    }

    /// The instant at which lease time reaches `lease_ms` (what a driver sleeps until).
    pub fn instant_at(&self, lease_ms: u64) -> Instant {
        self.promoted + Duration::from_millis(lease_ms.saturating_sub(self.base_ms))
    }
}
