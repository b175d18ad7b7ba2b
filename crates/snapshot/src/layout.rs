//! etcd's backend layout, as its snapshot files hold it (protocol facts: bucket and key names,
//! encodings): every bucket leasehold writes or reads, in the byte order bbolt keeps them.

use leasehold_mvcc::Revision;

/// Alarms raised: the key is an `etcdserverpb.AlarmMember`, the value empty.
pub const ALARM: &[u8] = b"alarm";
/// `authEnabled` (one byte, 1 or 0) and `authRevision` (u64, big-endian).
pub const AUTH: &[u8] = b"auth";
/// Roles by name: `authpb.Role`.
pub const AUTH_ROLES: &[u8] = b"authRoles";
/// Users by name: `authpb.User`.
pub const AUTH_USERS: &[u8] = b"authUsers";
/// Every stored version by revision: `mvccpb.KeyValue`.
pub const KEY: &[u8] = b"key";
/// Leases by id (i64 as u64, big-endian): `leasepb.Lease`.
pub const LEASE: &[u8] = b"lease";
/// Members by id (lower-case hex): JSON, as etcd's membership store writes it.
pub const MEMBERS: &[u8] = b"members";
/// `consistent_index`, `term`, `finishedCompactRev`, `scheduledCompactRev`, `storageVersion`.
pub const META: &[u8] = b"meta";

pub const AUTH_ENABLED: &[u8] = b"authEnabled";
pub const AUTH_REVISION: &[u8] = b"authRevision";
pub const CONSISTENT_INDEX: &[u8] = b"consistent_index";
pub const TERM: &[u8] = b"term";
pub const FINISHED_COMPACT_REV: &[u8] = b"finishedCompactRev";
pub const SCHEDULED_COMPACT_REV: &[u8] = b"scheduledCompactRev";
/// The storage schema the file is in, as text: etcd 3.6+ writes it, and `etcdutl snapshot status`
/// reports it as the snapshot's version.
pub const STORAGE_VERSION: &[u8] = b"storageVersion";

/// The storage schema version leasehold's snapshots are written in: etcd 3.7's (whose schema adds
/// nothing to 3.6's, the first with `storageVersion`). Snapshot messages carry it too.
pub const STORAGE_SCHEMA: &str = "3.7.0";

/// A version's key in the `key` bucket: `main` and `sub` big-endian around a `_`, then a `t`
/// for a tombstone. Byte order is revision order.
pub fn revision_key(rev: Revision, tombstone: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(18);
    out.extend_from_slice(&rev.main.to_be_bytes());
    out.push(b'_');
    out.extend_from_slice(&rev.sub.to_be_bytes());
    if tombstone {
        out.push(b't');
    }
    out
}

/// The revision a `key` bucket key names, and whether it is a tombstone; `None` if the key does
/// not have that shape.
pub fn parse_revision_key(key: &[u8]) -> Option<(Revision, bool)> {
    let tombstone = match key.len() {
        17 => false,
        18 if key[17] == b't' => true,
        _ => return None,
    };
    if key[8] != b'_' {
        return None;
    }
    let main = i64::from_be_bytes(key[..8].try_into().ok()?);
    let sub = i64::from_be_bytes(key[9..17].try_into().ok()?);
    Some((Revision { main, sub }, tombstone))
}

/// A member's row in the `members` bucket, as etcd marshals its `Member` (raft attributes and
/// attributes inlined; `isLearner` only when true).
#[derive(Debug, serde::Serialize)]
pub struct MemberRow<'a> {
    pub id: u64,
    #[serde(rename = "peerURLs")]
    pub peer_urls: Vec<&'a str>,
    #[serde(rename = "isLearner", skip_serializing_if = "std::ops::Not::not")]
    pub is_learner: bool,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub name: &'a str,
    #[serde(rename = "clientURLs", skip_serializing_if = "Option::is_none")]
    pub client_urls: Option<&'a [String]>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revision_keys_round_trip_and_sort_in_revision_order() {
        let a = Revision { main: 2, sub: 0 };
        let b = Revision { main: 2, sub: 1 };
        let c = Revision { main: 300, sub: 0 };
        assert_eq!(
            parse_revision_key(&revision_key(a, false)),
            Some((a, false))
        );
        assert_eq!(parse_revision_key(&revision_key(b, true)), Some((b, true)));
        assert!(revision_key(a, true) < revision_key(b, false));
        assert!(revision_key(b, true) < revision_key(c, false));
        assert_eq!(parse_revision_key(b"short"), None);
        let mut bad = revision_key(a, false);
        bad[8] = b'-';
        assert_eq!(parse_revision_key(&bad), None);
        let mut bad = revision_key(a, true);
        bad[17] = b'x';
        assert_eq!(parse_revision_key(&bad), None);
    }
}
