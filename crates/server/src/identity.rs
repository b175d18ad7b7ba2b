//! Member and cluster IDs, derived as etcd derives them, so that a cluster bootstrapped with
//! etcd's flags gets the IDs etcd would give it:
//! - a member's ID is the first 8 bytes (big-endian) of the SHA-1 of its peer URLs, sorted and
//!   joined with nothing between them, then the cluster token, then, for a member added at run
//!   time, the Unix second of the addition;
//! - the cluster's ID is the first 8 bytes of the SHA-1 of its initial members' IDs, sorted,
//!   8 bytes big-endian each.
//!
//! A member that joins later learns both from the cluster (`leasehold-node`), and every member
//! keeps its own in its data dir, so neither is derived again after the first start.
//!
//! Data dirs made before this derivation keep the IDs they were made with ([`legacy`]).

use sha1::{Digest, Sha1};

fn first_8_bytes(digest: &[u8]) -> u64 {
    let mut id = [0u8; 8];
    id.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(id)
}

/// A member's ID: its peer URLs (in any order), the cluster token and, for a member added at run
/// time, when it was added (Unix seconds), so that a member removed and added again at the same
/// URLs is a new member to Raft.
pub fn member_id(peer_urls: &[String], token: &str, added_at_unix_secs: Option<i64>) -> u64 {
    let mut urls: Vec<&str> = peer_urls.iter().map(String::as_str).collect();
    urls.sort_unstable();
    let mut hash = Sha1::new();
    for url in urls {
        hash.update(url.as_bytes());
    }
    hash.update(token.as_bytes());
    if let Some(at) = added_at_unix_secs {
        hash.update(at.to_string().as_bytes());
    }
    first_8_bytes(&hash.finalize())
}

/// The cluster's ID: its initial members' IDs, in any order.
pub fn cluster_id(member_ids: &[u64]) -> u64 {
    let mut ids = member_ids.to_vec();
    ids.sort_unstable();
    let mut hash = Sha1::new();
    for id in ids {
        hash.update(id.to_be_bytes());
    }
    first_8_bytes(&hash.finalize())
}

/// The IDs of data dirs made by earlier builds, which derived them with FNV-1a. A data dir
/// keeps the IDs it was made with: its log names its members by them.
pub mod legacy {
    /// FNV-1a over the parts, each followed by a 0 byte; never 0 (etcd's "no member").
    fn fnv1a(parts: &[&[u8]]) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for part in parts {
            for b in part.iter().chain(b"\0") {
                h ^= u64::from(*b);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        h.max(1)
    }

    /// A member's ID: its peer URLs (sorted) and the cluster token.
    pub fn member_id(peer_urls: &[String], token: &str) -> u64 {
        let mut urls = peer_urls.to_vec();
        urls.sort();
        let mut parts: Vec<&[u8]> = urls.iter().map(|u| u.as_bytes()).collect();
        parts.push(token.as_bytes());
        fnv1a(&parts)
    }

    /// The cluster's ID: the token alone.
    pub fn cluster_id(token: &str) -> u64 {
        fnv1a(&[b"leasehold-cluster", token.as_bytes()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn urls(list: &[&str]) -> Vec<String> {
        list.iter().map(|u| (*u).to_owned()).collect()
    }

    /// etcd 3.7.3's TestCtlV3GetFormat expects these header bytes from its one-member cluster
    /// (`https://localhost:20001`, token `new`): cluster ID 0x34c21a2d427db393, and a member ID
    /// whose varint starts 0xed.
    #[test]
    fn ids_are_etcds() {
        let member = member_id(&urls(&["https://localhost:20001"]), "new", None);
        assert_eq!(member, 0x00a8_f345_8387_986d);
        assert_eq!(cluster_id(&[member]), 0x34c2_1a2d_427d_b393);
    }

    #[test]
    fn ids_depend_on_urls_in_any_order_the_token_and_when_a_member_was_added() {
        let a = urls(&["http://a:1", "http://b:2"]);
        let b = urls(&["http://b:2", "http://a:1"]);
        assert_eq!(member_id(&a, "t", None), member_id(&b, "t", None));
        assert_ne!(member_id(&a, "t", None), member_id(&a, "u", None));
        assert_ne!(member_id(&a, "t", Some(1)), member_id(&a, "t", Some(2)));
        assert_ne!(member_id(&a, "t", Some(1)), member_id(&a, "t", None));
        assert_eq!(cluster_id(&[1, 2, 3]), cluster_id(&[3, 1, 2]));
        assert_ne!(cluster_id(&[1, 2]), cluster_id(&[1, 2, 3]));
    }

    #[test]
    fn legacy_ids_are_the_earlier_builds() {
        let a = urls(&["http://a:1"]);
        // Pinned: data dirs made before the change hold these.
        assert_eq!(legacy::member_id(&a, "t"), 0x6306_901a_a0f3_4959);
        assert_eq!(legacy::cluster_id("t"), 0xafeb_5e33_efd2_3de5);
    }
}
