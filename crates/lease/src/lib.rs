//! The lease core of leasehold: every lease, the keys attached to it, and its deadline, kept on a
//! *replicated lease clock*. It is a synchronous, deterministic state machine: every method takes
//! the lease time it acts at (`now_ms`) as an argument and it never reads a clock itself.
//!
//! How time works (see docs/lease.md):
//! - Deadlines are points on the lease clock, in milliseconds. The clock only moves when the
//!   leader proposes a lease time (with a grant, a renewal, an expiry or a tick), so every member
//!   holds the same deadlines and the same clock.
//! - Only the leader maps real time onto the lease clock, with a [`LeaseClock`] it starts when it
//!   is promoted: lease time continues from the replicated clock. On promotion it proposes an
//!   extension of every inherited lease by the election timeout ([`LeaseTable::extend_all`]). A
//!   new leader or a restarted member therefore never hands a lease a fresh TTL: the lease keeps
//!   what it had left at the last replicated clock value, plus that extension.
//!
//! ```text
//!   leader: Instant ─► LeaseClock::now_ms ─► proposes Grant/Renew/Expire/Tick { now_ms }
//!   every member: apply ─► LeaseTable::{grant, renew, revoke, advance} (deterministic)
//!   leader: LeaseTable::expired(now_ms) ─► "revoke these" ─► proposes Expire
//! ```

mod clock;
mod table;

pub use clock::LeaseClock;
pub use leasehold_types::{Key, LEASE_TTL_SECS_MAX, LeaseId};
pub use table::{
    Counters, EndedLease, LeaseEnd, LeaseError, LeaseRecord, LeaseTable, LeaseView, MemoryRenewal,
    PROMOTION_EXPIRIES_PER_SEC_MAX, RECENT_ENDS_LEN_MAX, Renewal, TimeToLive,
};

#[cfg(test)]
mod tests;
