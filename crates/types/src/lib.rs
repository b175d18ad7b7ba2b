//! The vocabulary shared by leasehold's layers, servers and clients: identifiers, limits and
//! etcd's key-range rule that several crates name, and ([`go`]) the pieces of Go's standard
//! library whose answers etcd's flags and etcdctl show. Nothing here has behaviour beyond
//! conversion; it must never depend on another leasehold crate.

pub mod go;

use std::num::NonZeroI64;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A lease identifier. Zero is never a valid id: "no lease" is `None` in the core and `0` only on
/// the wire. Negative ids are valid (clients may choose them). Being non-zero, an
/// `Option<LeaseId>` takes no more room than the id (it is stored with every key version), and
/// it is encoded as the plain `i64`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct LeaseId(NonZeroI64);

impl LeaseId {
    /// Converts the wire value; `0` means "no lease".
    pub fn from_wire(id: i64) -> Option<LeaseId> {
        NonZeroI64::new(id).map(LeaseId)
    }

    /// The raw, non-zero value.
    pub fn get(self) -> i64 {
        self.0.get()
    }

    /// The wire value of an optional lease: `0` for none.
    pub fn to_wire(id: Option<LeaseId>) -> i64 {
        id.map_or(0, LeaseId::get)
    }
}

/// A key's bytes as the state holds them: one allocation, shared by the key map, the revision
/// index and the lease that the key is attached to.
pub type Key = Arc<[u8]>;

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
