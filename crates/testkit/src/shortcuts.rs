//! Small helpers that several test files need: the store's revision, etcdctl output as text,
//! the `remaining(<n>s)` of `lease timetolive`, common request options, and an auth set-up.

use std::process::Output;

use etcd_client::{Client, GetOptions, LockOptions};

/// The store's current revision, from the header of a Range of a key that is never written.
pub async fn revision(c: &mut Client) -> i64 {
    c.get("leasehold-test-revision-probe", None)
        .await
        .expect("range for the revision")
        .header()
        .expect("header")
        .revision()
}

/// A process's standard output as text.
pub fn stdout_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Position, length and value of the first `remaining(<n>s)` in `line` (etcdctl's
/// `lease timetolive`; `n` may be negative).
pub fn find_remaining(line: &str) -> Option<(usize, usize, i64)> {
    const OPEN: &str = "remaining(";
    let at = line.find(OPEN)?;
    let rest = &line[at + OPEN.len()..];
    let digits = rest
        .char_indices()
        .take_while(|(i, c)| c.is_ascii_digit() || (*i == 0 && *c == '-'))
        .count();
    if digits == 0 || !rest[digits..].starts_with("s)") {
        return None;
    }
    let value = rest[..digits].parse().ok()?;
    Some((at, OPEN.len() + digits + 2, value))
}

/// Sorts the keys of `attached keys([b a])` in a `lease timetolive --keys` line: their order is
/// unspecified (etcd sends them in map order).
pub fn sort_attached_keys(line: &mut String) {
    const OPEN: &str = "attached keys([";
    if let Some(at) = line.find(OPEN)
        && let Some(end) = line[at..].find("])")
    {
        let start = at + OPEN.len();
        let end = at + end;
        let mut keys: Vec<&str> = line[start..end].split(' ').collect();
        keys.sort_unstable();
        let sorted = keys.join(" ");
        line.replace_range(start..end, &sorted);
    }
}

/// Every key (etcdctl's `--from-key ''`).
pub fn all_keys() -> Option<GetOptions> {
    Some(GetOptions::new().with_all_keys())
}

/// A lock held by `lease`.
pub fn lock_with(lease: i64) -> Option<LockOptions> {
    Some(LockOptions::new().with_lease(lease))
}

/// Turns auth on at `endpoint` with two users: `root` (password `rootpw`, with the root role)
/// and `alice` (`alicepw`), who holds `role`; the role first gets `grant`, if given.
pub async fn enable_auth_with_alice(
    endpoint: &str,
    role: &str,
    grant: Option<etcd_client::Permission>,
) {
    let mut admin = Client::connect([endpoint], None).await.expect("connect");
    admin.user_add("root", "rootpw", None).await.expect("root");
    admin
        .user_grant_role("root", "root")
        .await
        .expect("root role");
    admin
        .user_add("alice", "alicepw", None)
        .await
        .expect("alice");
    admin.role_add(role).await.expect("role");
    if let Some(grant) = grant {
        admin
            .role_grant_permission(role, grant)
            .await
            .expect("grant");
    }
    admin
        .user_grant_role("alice", role)
        .await
        .expect("grant role");
    admin.auth_enable().await.expect("auth enable");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remaining_is_found_with_its_span_and_value() {
        let line = "lease 1 granted with TTL(10s), remaining(7s)";
        let (at, len, value) = find_remaining(line).unwrap();
        assert_eq!((&line[at..at + len], value), ("remaining(7s)", 7));
        assert_eq!(find_remaining("remaining(-1s)").map(|r| r.2), Some(-1));
        assert_eq!(find_remaining("remaining(s)"), None);
        assert_eq!(find_remaining("remaining(1-s)"), None);
        assert_eq!(find_remaining("no lease"), None);
    }

    #[test]
    fn attached_keys_are_sorted_in_place() {
        let mut line = "lease 1 granted with TTL(5s), attached keys([c a b])".to_owned();
        sort_attached_keys(&mut line);
        assert_eq!(line, "lease 1 granted with TTL(5s), attached keys([a b c])");
        let mut none = "lease 1 already expired".to_owned();
        sort_attached_keys(&mut none);
        assert_eq!(none, "lease 1 already expired");
    }
}
