//! A deterministic simulator for leasehold (docs/testing.md): 3 or 5 members of the real
//! consensus core, write-ahead log and state machine in one thread, on a seeded network, disk
//! and clocks, with simulated clients whose every answer is checked against leasehold's promises.
//! One seed is one run; the same seed gives the same trace, byte for byte.

mod check;
pub mod disk;
mod member;
pub mod rng;
mod world;

pub use world::{Outcome, run};

/// Where each member's log lives on its simulated disk.
pub const WAL_DIR: &str = "/member/wal";

/// A known-bad build of the member, for the simulator's own tests: each is injected through the
/// seam it breaks (the disk, the expiry driver's clock, promotion, the read path), never by a
/// switch in production code.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Variant {
    #[default]
    Correct,
    /// The expiry driver reads its clock 1 ms ahead: leases are revoked 1 ms early.
    EarlyExpiry,
    /// The disk acknowledges `fdatasync` without syncing.
    AckBeforeFsync,
    /// A new leader gives every inherited lease a fresh TTL (etcd's behaviour).
    FreshTtl,
    /// A follower answers linearizable reads as soon as the leader's read index arrives, without
    /// first applying that far.
    StaleFollowerRead,
}

impl std::str::FromStr for Variant {
    type Err = String;
    fn from_str(s: &str) -> Result<Variant, String> {
        Ok(match s {
            "correct" => Variant::Correct,
            "early-expiry" => Variant::EarlyExpiry,
            "ack-before-fsync" => Variant::AckBeforeFsync,
            "fresh-ttl" => Variant::FreshTtl,
            "stale-follower-read" => Variant::StaleFollowerRead,
            other => return Err(format!("unknown variant {other:?}")),
        })
    }
}

/// How one run is set up besides its seed.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    pub variant: Variant,
    /// Simulated seconds of faults, then as long again healed.
    pub chaos_secs: u64,
    /// Keep the whole trace (for `--trace`); otherwise only its last lines.
    pub full_trace: bool,
    /// Kill churn's period once healed, in longest election timeouts (plus 0.2 to 2 s): 3, the
    /// fastest churn docs/lease.md bounds a dead client's lease under. Faster churn is for
    /// regressions that need it.
    pub kill_churn_timeouts: u64,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            variant: Variant::Correct,
            chaos_secs: 20,
            full_trace: false,
            kill_churn_timeouts: 3,
        }
    }
}
