//! Lease ids the server chooses when a grant names none.

use std::sync::atomic::{AtomicU64, Ordering};

use leasehold_raft::LeaseId;

/// Server-chosen lease ids, laid out as etcd lays them out: the member id's low 16 bits, then the
/// start time in milliseconds (40 bits), then a counter (8 bits, carrying into the time). Ids are
/// positive, non-zero, and do not repeat across restarts (the start time differs).
#[derive(Debug)]
pub struct LeaseIdGenerator {
    next: AtomicU64,
}

impl LeaseIdGenerator {
    pub fn new(member_id: u64, start_unix_ms: u64) -> LeaseIdGenerator {
        let prefix = (member_id & 0xffff) << 48;
        let time = (start_unix_ms & 0xff_ffff_ffff) << 8;
        LeaseIdGenerator {
            next: AtomicU64::new(prefix | time),
        }
    }

    pub fn next_id(&self) -> LeaseId {
        loop {
            let raw = self.next.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
            // Clear the sign bit: server-chosen ids are positive.
            if let Some(id) = LeaseId::from_wire((raw & (i64::MAX as u64)) as i64) {
                return id;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_carry_the_member_prefix_and_are_positive_and_distinct() {
        let g = LeaseIdGenerator::new(0x2e12_59d4_15f2_a040, 0x0123_4567_89ab);
        let a = g.next_id().get();
        let b = g.next_id().get();
        assert!(a > 0 && b > 0 && a != b);
        assert_eq!(
            a >> 48,
            0x2040,
            "low 16 bits of the member id, sign bit cleared"
        );
        let restarted = LeaseIdGenerator::new(0x2e12_59d4_15f2_a040, 0x0123_4567_89ac);
        assert_ne!(
            restarted.next_id().get(),
            a,
            "a restart changes the time bits"
        );
    }
}
