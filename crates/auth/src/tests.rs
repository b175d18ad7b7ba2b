use proptest::prelude::*;

use super::*;

fn perm(kind: PermKind, key: &str, range_end: &str) -> Permission {
    Permission {
        kind,
        key: key.as_bytes().to_vec(),
        range_end: range_end.as_bytes().to_vec(),
        lease: None,
    }
}

fn caller(s: &AuthState, user: &str) -> Caller {
    s.caller(user)
}

/// A store with auth enabled: root, and `alice` with role `r`.
fn enabled() -> AuthState {
    let mut s = AuthState::default();
    let changes = [
        AuthChange::UserAdd {
            name: ROOT.into(),
            password_hash: Some("h".into()),
        },
        AuthChange::UserGrantRole {
            user: ROOT.into(),
            role: ROOT.into(),
        },
        AuthChange::UserAdd {
            name: "alice".into(),
            password_hash: Some("h".into()),
        },
        AuthChange::RoleAdd { name: "r".into() },
        AuthChange::UserGrantRole {
            user: "alice".into(),
            role: "r".into(),
        },
        AuthChange::Enable,
    ];
    for c in &changes {
        s.apply(None, c).unwrap();
    }
    s
}

#[test]
fn enabling_needs_root_with_the_root_role_and_does_not_bump() {
    let mut s = AuthState::default();
    assert_eq!(
        s.apply(None, &AuthChange::Enable),
        Err(AuthError::RootUserNotExist)
    );
    let root = AuthChange::UserAdd {
        name: ROOT.into(),
        password_hash: None,
    };
    s.apply(None, &root).unwrap();
    assert_eq!(
        s.apply(None, &AuthChange::Enable),
        Err(AuthError::RootRoleNotExist)
    );
    let grant = AuthChange::UserGrantRole {
        user: ROOT.into(),
        role: ROOT.into(),
    };
    s.apply(None, &grant).unwrap();
    assert_eq!(s.revision, 3, "user add and grant bumped");
    s.apply(None, &AuthChange::Enable).unwrap();
    assert!(s.enabled);
    assert_eq!(s.revision, 3, "enabling does not bump");
    // Re-granting is a no-op without a bump.
    let root_caller = caller(&s, ROOT);
    s.apply(Some(&root_caller), &grant).unwrap();
    assert_eq!(s.revision, 3);
}

#[test]
fn root_cannot_be_taken_apart_while_auth_is_on() {
    let mut s = enabled();
    let root = caller(&s, ROOT);
    for c in [
        AuthChange::UserDelete { name: ROOT.into() },
        AuthChange::UserRevokeRole {
            user: ROOT.into(),
            role: ROOT.into(),
        },
        AuthChange::RoleDelete { name: ROOT.into() },
    ] {
        assert_eq!(
            s.apply(Some(&root), &c),
            Err(AuthError::InvalidAuthMgmt),
            "{c:?}"
        );
    }
    // A non-root user is refused before that.
    let alice = caller(&s, "alice");
    let delete_root = AuthChange::UserDelete { name: ROOT.into() };
    assert_eq!(
        s.apply(Some(&alice), &delete_root),
        Err(AuthError::PermissionDenied)
    );
    assert_eq!(s.apply(None, &delete_root), Err(AuthError::UserEmpty));
    s.apply(Some(&root), &AuthChange::Disable).unwrap();
    s.apply(None, &delete_root).unwrap();
}

#[test]
fn errors_match_etcds_preconditions() {
    let mut s = AuthState::default();
    let add = |name: &str| AuthChange::UserAdd {
        name: name.into(),
        password_hash: None,
    };
    assert_eq!(s.apply(None, &add("")), Err(AuthError::UserEmpty));
    s.apply(None, &add("u")).unwrap();
    assert_eq!(s.apply(None, &add("u")), Err(AuthError::UserAlreadyExist));
    let role = |name: &str| AuthChange::RoleAdd { name: name.into() };
    assert_eq!(s.apply(None, &role("")), Err(AuthError::RoleEmpty));
    let grant = |user: &str, role: &str| AuthChange::UserGrantRole {
        user: user.into(),
        role: role.into(),
    };
    assert_eq!(
        s.apply(None, &grant("nobody", "r")),
        Err(AuthError::UserNotFound)
    );
    assert_eq!(
        s.apply(None, &grant("u", "r")),
        Err(AuthError::RoleNotFound)
    );
    let revoke = AuthChange::UserRevokeRole {
        user: "u".into(),
        role: "r".into(),
    };
    assert_eq!(s.apply(None, &revoke), Err(AuthError::RoleNotGranted));
    s.apply(None, &role("r")).unwrap();
    let revoke_perm = AuthChange::RoleRevokePermission {
        role: "r".into(),
        key: b"a".to_vec(),
        range_end: Vec::new(),
    };
    assert_eq!(
        s.apply(None, &revoke_perm),
        Err(AuthError::PermissionNotGranted)
    );
    let before = s.revision;
    assert!(s.apply(None, &role("r")).is_err());
    assert_eq!(s.revision, before, "a failed change does not bump");
}

#[test]
fn grants_are_kept_sorted_by_key_and_updated_in_place() {
    let mut s = AuthState::default();
    s.apply(None, &AuthChange::RoleAdd { name: "r".into() })
        .unwrap();
    let grant = |p: Permission| AuthChange::RoleGrantPermission {
        role: "r".into(),
        perm: p,
    };
    s.apply(None, &grant(perm(PermKind::Read, "m", "")))
        .unwrap();
    s.apply(None, &grant(perm(PermKind::Write, "a", "c")))
        .unwrap();
    s.apply(None, &grant(perm(PermKind::ReadWrite, "m", "")))
        .unwrap();
    assert_eq!(
        s.roles["r"].perms,
        vec![
            perm(PermKind::Write, "a", "c"),
            perm(PermKind::ReadWrite, "m", "")
        ]
    );
}

#[test]
fn key_checks_follow_etcds_order() {
    let mut s = enabled();
    let root = caller(&s, ROOT);
    let alice = caller(&s, "alice");
    assert_eq!(
        s.check_key(None, b"k", b"", Access::Read),
        Err(AuthError::UserEmpty)
    );
    assert_eq!(s.check_key(Some(&root), b"k", b"\0", Access::Write), Ok(()));
    assert_eq!(
        s.check_key(Some(&alice), b"k", b"", Access::Read),
        Err(AuthError::PermissionDenied)
    );
    let grant = AuthChange::RoleGrantPermission {
        role: "r".into(),
        perm: perm(PermKind::Read, "k", "l"),
    };
    s.apply(Some(&root), &grant).unwrap();
    assert_eq!(
        s.check_key(Some(&alice), b"k", b"", Access::Read),
        Err(AuthError::AuthOldRevision),
        "alice's permissions were read before the grant"
    );
    let alice = caller(&s, "alice");
    assert_eq!(s.check_key(Some(&alice), b"k1", b"", Access::Read), Ok(()));
    assert_eq!(
        s.check_key(Some(&alice), b"k1", b"", Access::Write),
        Err(AuthError::PermissionDenied)
    );
    assert_eq!(s.check_key(Some(&alice), b"k", b"l", Access::Read), Ok(()));
    assert_eq!(
        s.check_key(Some(&alice), b"k", b"m", Access::Read),
        Err(AuthError::PermissionDenied)
    );
    // Auth off: anyone.
    s.apply(Some(&root), &AuthChange::Disable).unwrap();
    assert_eq!(s.check_key(None, b"x", b"\0", Access::Write), Ok(()));
}

#[test]
fn ranges_are_covered_by_touching_grants_and_from_key_grants() {
    let r = |k: &str, e: &str| perm(PermKind::Read, k, e);
    let grants = [r("a", "c"), r("c", "e"), r("x", "\0")];
    assert!(covers(&grants, b"a", b"e"), "touching intervals");
    assert!(!covers(&grants, b"a", b"f"), "a gap at [e, x)");
    assert!(covers(&grants, b"x", b"\0"), "from x on");
    assert!(covers(&grants, b"zzz", b""), "a key in the open grant");
    assert!(!covers(&grants, b"0", b"b"), "starts before every grant");
    // One key is [k, k\0): with [k\0, m) it covers [k, m).
    let grants = [r("k", ""), r("k\0", "m")];
    assert!(covers(&grants, b"k", b"m"));
    assert!(!covers(&grants, b"k", b"n"));
    assert!(!covers(&[], b"k", b""));
}

proptest! {
    /// The interval answer agrees with checking every key of a small key space one by one.
    #[test]
    fn coverage_agrees_with_key_by_key(
        grants in proptest::collection::vec((0u8..6, 0u8..7), 0..5),
        from in 0u8..6,
        to in 0u8..7,
    ) {
        // Keys are single bytes 1..=5 ("\0" is the open end); a grant (k, e) with e <= k is one key.
        let to_perm = |(k, e): (u8, u8)| Permission {
            lease: None,
            kind: PermKind::Read,
            key: vec![k + 1],
            range_end: if e == 6 { vec![0] } else if e <= k { Vec::new() } else { vec![e + 1] },
        };
        let perms: Vec<Permission> = grants.into_iter().map(to_perm).collect();
        let key = vec![from + 1];
        let range_end = if to == 6 { vec![0] } else { vec![to + 1] };
        if range_end != [0] && range_end <= key {
            return Ok(());
        }
        // Within single-byte keys plus the keys just after them (k\0), the range's members.
        let mut members: Vec<Vec<u8>> = Vec::new();
        for b in 1u8..=8 {
            members.push(vec![b]);
            members.push(vec![b, 0]);
        }
        let in_range = |k: &Vec<u8>| *k >= key && (range_end == [0] || *k < range_end);
        let each = members
            .iter()
            .filter(|k| in_range(k))
            .all(|k| covers(&perms, k, b""));
        // Beyond the 8 keys modelled, an open range is only covered by an open grant.
        let open_ok = range_end != [0] || perms.iter().any(|p| p.range_end == [0]);
        prop_assert_eq!(covers(&perms, &key, &range_end), each && open_ok);
    }
}

#[test]
fn a_grant_bound_to_a_lease_goes_with_it() {
    let mut s = enabled();
    let root = caller(&s, ROOT);
    let bound = Permission {
        lease: Some(7),
        ..perm(PermKind::ReadWrite, "svc/", "svc0")
    };
    let grant = AuthChange::RoleGrantPermission {
        role: "r".into(),
        perm: bound,
    };
    s.apply(Some(&root), &grant).unwrap();
    let alice = caller(&s, "alice");
    assert_eq!(
        s.check_key(Some(&alice), b"svc/a", b"", Access::Write),
        Ok(())
    );
    assert!(!s.end_lease(8), "another lease: nothing goes");
    assert_eq!(
        s.check_key(Some(&alice), b"svc/a", b"", Access::Write),
        Ok(())
    );
    assert!(s.end_lease(7));
    assert_eq!(
        s.check_key(Some(&alice), b"svc/a", b"", Access::Write),
        Err(AuthError::AuthOldRevision),
        "a caller looked up before the lease ended"
    );
    let alice = caller(&s, "alice");
    assert_eq!(
        s.check_key(Some(&alice), b"svc/a", b"", Access::Write),
        Err(AuthError::PermissionDenied)
    );
    assert!(s.roles["r"].perms.is_empty());
}
