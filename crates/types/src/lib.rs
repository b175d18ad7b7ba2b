//! The vocabulary shared by leasehold's layers, servers and clients: identifiers, limits and
//! etcd's key-range rule that several crates name. Nothing here has behaviour beyond conversion;
//! it must never depend on another leasehold crate.

use serde::{Deserialize, Serialize};

/// A lease identifier. Zero is never a valid id: "no lease" is `None` in the core and `0` only on
/// the wire. Negative ids are valid (clients may choose them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct LeaseId(i64);

impl LeaseId {
    /// Converts the wire value; `0` means "no lease".
    pub fn from_wire(id: i64) -> Option<LeaseId> {
        (id != 0).then_some(LeaseId(id))
    }

    /// The raw, non-zero value.
    pub fn get(self) -> i64 {
        self.0
    }

    /// The wire value of an optional lease: `0` for none.
    pub fn to_wire(id: Option<LeaseId>) -> i64 {
        id.map_or(0, |l| l.0)
    }
}

/// etcd's largest lease TTL, in seconds (inclusive).
pub const LEASE_TTL_SECS_MAX: i64 = 9_000_000_000;

/// The range end that makes `prefix` a prefix range (clientv3's `GetPrefixRangeEnd`): the
/// prefix with its last byte below 0xff incremented and the rest cut; `[0]` (every key) if
/// there is none.
pub fn prefix_range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}
