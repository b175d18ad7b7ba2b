//! Member and cluster IDs, derived as etcd derives them (from peer URLs and the cluster token),
//! so that every member computes every other member's ID the same way — at bootstrap from
//! `--initial-cluster`, and for MemberAdd from the new member's peer URLs.

/// FNV-1a over the parts, each followed by a 0 byte: a stable hash, so IDs survive restarts
/// and rebuilds. Never 0 (etcd's "no member").
pub fn fnv1a(parts: &[&[u8]]) -> u64 {
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

/// The cluster's ID: the token alone, so a member that joins later derives the same ID as the
/// members that bootstrapped the cluster.
pub fn cluster_id(token: &str) -> u64 {
    fnv1a(&[b"leasehold-cluster", token.as_bytes()])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_depend_on_urls_in_any_order_and_on_the_token() {
        let a = vec!["http://a:1".to_owned(), "http://b:2".to_owned()];
        let b = vec!["http://b:2".to_owned(), "http://a:1".to_owned()];
        assert_eq!(member_id(&a, "t"), member_id(&b, "t"));
        assert_ne!(member_id(&a, "t"), member_id(&a, "u"));
        assert_ne!(cluster_id("t"), cluster_id("u"));
        assert_ne!(member_id(&a, "t"), 0);
    }
}
