use std::collections::BTreeMap;

use proptest::prelude::*;

use crate::*;

fn no_leases(_: LeaseId) -> bool {
    false
}

fn put(store: &mut Store, key: &str, value: &str) -> i64 {
    let req = PutRequest {
        key: key.into(),
        value: value.into(),
        ..Default::default()
    };
    store.put(&req, &no_leases).expect("put").0.revision
}

fn get_at(store: &Store, key: &str, range_end: &str, revision: i64) -> Vec<(String, String)> {
    let req = RangeRequest {
        key: key.into(),
        range_end: range_end.into(),
        revision,
        ..Default::default()
    };
    store
        .range(&req)
        .expect("range")
        .kvs
        .into_iter()
        .map(|kv| {
            (
                String::from_utf8(kv.key).unwrap(),
                String::from_utf8(kv.value.to_vec()).unwrap(),
            )
        })
        .collect()
}

#[test]
fn revisions_start_at_one_and_writes_bump_by_one() {
    let mut s = Store::new();
    assert_eq!(s.current_revision(), 1);
    assert_eq!(put(&mut s, "a", "1"), 2);
    assert_eq!(put(&mut s, "a", "2"), 3);
    let kv = &s
        .range(&RangeRequest {
            key: "a".into(),
            ..Default::default()
        })
        .unwrap()
        .kvs[0];
    assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (2, 3, 2));
}

#[test]
fn delete_then_recreate_starts_a_new_generation() {
    let mut s = Store::new();
    put(&mut s, "a", "1");
    put(&mut s, "a", "2");
    let (resp, changes) = s
        .delete_range(&DeleteRangeRequest {
            key: "a".into(),
            ..Default::default()
        })
        .unwrap();
    assert_eq!((resp.deleted, resp.revision, changes.len()), (1, 4, 1));
    assert_eq!(put(&mut s, "a", "3"), 5);
    let kv = &s
        .range(&RangeRequest {
            key: "a".into(),
            ..Default::default()
        })
        .unwrap()
        .kvs[0];
    assert_eq!((kv.create_revision, kv.version), (5, 1));
    assert_eq!(get_at(&s, "a", "", 3), vec![("a".into(), "2".into())]);
    assert!(get_at(&s, "a", "", 4).is_empty());
}

#[test]
fn live_keys_count_keys_whose_newest_version_is_a_value_through_compaction_and_restore() {
    let mut s = Store::new();
    put(&mut s, "a", "1");
    put(&mut s, "a", "2");
    put(&mut s, "b", "1");
    assert_eq!(s.live_keys(), 2);
    s.delete_range(&DeleteRangeRequest {
        key: "a".into(),
        range_end: "c".into(),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(s.live_keys(), 0);
    put(&mut s, "b", "2");
    assert_eq!(s.live_keys(), 1);
    s.compact(s.current_revision()).expect("compact");
    assert_eq!(s.live_keys(), 1);
    let restored = Store::restore(
        s.current_revision(),
        s.compact_revision(),
        s.records().unwrap(),
    );
    assert_eq!(restored.live_keys(), 1);
    s.validate();
}

#[test]
fn deleting_nothing_keeps_the_revision() {
    let mut s = Store::new();
    put(&mut s, "a", "1");
    let (resp, changes) = s
        .delete_range(&DeleteRangeRequest {
            key: "b".into(),
            ..Default::default()
        })
        .unwrap();
    assert_eq!((resp.deleted, resp.revision, changes.len()), (0, 2, 0));
    assert_eq!(s.current_revision(), 2);
}

#[test]
fn range_limit_sort_and_filters() {
    let mut s = Store::new();
    for (k, v) in [("a", "3"), ("b", "1"), ("c", "2"), ("d", "1")] {
        put(&mut s, k, v);
    }
    put(&mut s, "b", "1"); // b: version 2, mod 6
    let base = RangeRequest {
        key: "a".into(),
        range_end: "z".into(),
        ..Default::default()
    };
    let keys = |r: RangeResponse| {
        r.kvs
            .into_iter()
            .map(|kv| String::from_utf8(kv.key).unwrap())
            .collect::<Vec<_>>()
    };

    let r = s
        .range(&RangeRequest {
            limit: 2,
            ..base.clone()
        })
        .unwrap();
    assert_eq!((r.count, r.more), (4, true));
    assert_eq!(keys(r), ["a", "b"]);

    let r = s
        .range(&RangeRequest {
            sort_target: SortTarget::Value,
            ..base.clone()
        })
        .unwrap();
    assert_eq!(
        keys(r),
        ["b", "d", "c", "a"],
        "ascending by value, ties in key order"
    );
    let r = s
        .range(&RangeRequest {
            sort_target: SortTarget::Value,
            sort_order: SortOrder::Descend,
            ..base.clone()
        })
        .unwrap();
    assert_eq!(
        keys(r),
        ["a", "c", "b", "d"],
        "descending by value, ties in key order"
    );
    let r = s
        .range(&RangeRequest {
            sort_order: SortOrder::Descend,
            limit: 1,
            ..base.clone()
        })
        .unwrap();
    assert_eq!(
        (keys(r.clone()), r.more, r.count),
        (vec!["d".to_string()], true, 4)
    );

    let r = s
        .range(&RangeRequest {
            min_mod_revision: 4,
            max_mod_revision: 5,
            ..base.clone()
        })
        .unwrap();
    assert_eq!(keys(r), ["c", "d"]);
    let r = s
        .range(&RangeRequest {
            max_create_revision: 3,
            ..base.clone()
        })
        .unwrap();
    assert_eq!(keys(r), ["a", "b"]);

    let r = s
        .range(&RangeRequest {
            count_only: true,
            ..base.clone()
        })
        .unwrap();
    assert_eq!((r.count, r.kvs.len(), r.more), (4, 0, false));
    let r = s
        .range(&RangeRequest {
            keys_only: true,
            ..base.clone()
        })
        .unwrap();
    assert!(r.kvs.iter().all(|kv| kv.value.is_empty()));

    // "\0" as range_end means every key from `key` on; an end before the key is empty.
    assert_eq!(get_at(&s, "c", "\0", 0).len(), 2);
    assert!(get_at(&s, "c", "b", 0).is_empty());
}

#[test]
fn reads_outside_the_readable_history_fail() {
    let mut s = Store::new();
    put(&mut s, "a", "1");
    put(&mut s, "a", "2");
    let at = |rev| RangeRequest {
        key: "a".into(),
        revision: rev,
        ..Default::default()
    };
    assert_eq!(s.range(&at(4)), Err(Error::FutureRevision));
    s.compact(3).unwrap();
    assert_eq!(s.range(&at(2)), Err(Error::Compacted));
    assert_eq!(s.range(&at(3)).unwrap().kvs.len(), 1);
    assert_eq!(s.compact(3), Err(Error::Compacted));
    assert_eq!(s.compact(9), Err(Error::FutureRevision));
}

#[test]
fn hash_kv_depends_only_on_history_up_to_its_revision() {
    let mut s = Store::new();
    put(&mut s, "a", "1"); // 2
    put(&mut s, "b", "1"); // 3
    let at_3 = s.hash_kv(3).unwrap();
    assert_eq!(at_3.hash_revision, 3);
    assert_eq!(s.hash_kv(0).unwrap(), at_3, "0 is the current revision");
    put(&mut s, "a", "2"); // 4
    assert_eq!(s.hash_kv(3).unwrap(), at_3, "later writes leave it alone");
    assert_ne!(s.hash_kv(4).unwrap().hash, at_3.hash);
    // A store restored from the same records hashes the same.
    let restored = Store::restore(
        s.current_revision(),
        s.compact_revision(),
        s.records().unwrap(),
    );
    assert_eq!(restored.hash_kv(4), s.hash_kv(4));
    s.compact(3).unwrap();
    assert_eq!(s.hash_kv(2), Err(Error::Compacted));
    assert_eq!(s.hash_kv(5), Err(Error::FutureRevision));
    assert_eq!(s.hash_kv(4).unwrap().compact_revision, 3);
    // At the compaction revision: what the compaction hashed before it removed anything (etcd
    // 3.6+), so every member answers alike however its compactions fell.
    assert_eq!(s.hash_kv(3), Ok(at_3));
}

#[test]
fn hash_kv_at_the_compaction_revision_after_a_restart_hashes_what_is_left() {
    let mut s = Store::new();
    put(&mut s, "a", "1"); // 2
    put(&mut s, "a", "2"); // 3
    put(&mut s, "b", "1"); // 4
    s.compact(3).unwrap();
    let restored = Store::restore(
        s.current_revision(),
        s.compact_revision(),
        s.records().unwrap(),
    );
    let left = restored.hash_kv(3).unwrap();
    assert_eq!(left.compact_revision, 3);
    assert_ne!(
        left.hash,
        s.hash_kv(3).unwrap().hash,
        "the removed version is not hashed"
    );
    assert_eq!(restored.hash_kv(2), Err(Error::Compacted));
}

#[test]
fn compaction_removes_hidden_versions_and_dead_tombstones() {
    let mut s = Store::new();
    put(&mut s, "a", "1"); // 2
    put(&mut s, "a", "2"); // 3
    put(&mut s, "b", "1"); // 4
    s.delete_range(&DeleteRangeRequest {
        key: "b".into(),
        ..Default::default()
    })
    .unwrap(); // 5
    put(&mut s, "a", "3"); // 6
    let (_, removed) = s.compact(5).unwrap();
    // a@2 is hidden by a@3 and b@4 by its tombstone: both go. a@3 stays (visible at 5), and so
    // does b's tombstone @5, at the compaction revision itself (etcd#18089): a watch from 5
    // sees the delete.
    assert_eq!(removed.len(), 2);
    assert_eq!(s.key_history_len(), 2);
    assert_eq!(get_at(&s, "a", "", 5), vec![("a".into(), "2".into())]);
    assert_eq!(get_at(&s, "a", "", 6), vec![("a".into(), "3".into())]);
    let replayed = s.events(5, 6, usize::MAX).unwrap();
    assert_eq!(
        replayed.iter().map(|e| e.kind).collect::<Vec<_>>(),
        vec![EventKind::Delete, EventKind::Put],
        "the delete at the compaction point and the history above it are replayed"
    );
    s.validate();
    // A compaction past the tombstone takes it.
    let (_, removed) = s.compact(6).unwrap();
    assert_eq!(removed.len(), 2, "b@5 and a@3, hidden by a@6");
    assert_eq!(s.key_history_len(), 1);
    s.validate();
}

#[test]
fn bindings_read_the_version_before_a_write_and_share_the_key() {
    let mut s = Store::new();
    let lease = LeaseId::from_wire(7);
    let leased = |value: &str| PutRequest {
        key: b"k".to_vec(),
        value: value.into(),
        lease,
        ..Default::default()
    };
    let (_, first) = s.put(&leased("1"), &|_| true).unwrap(); // 2
    let (_, second) = s
        .put(
            &PutRequest {
                key: b"k".to_vec(),
                ..Default::default()
            },
            &no_leases,
        )
        .unwrap(); // 3
    let rev = |changes: &[Change]| match &changes[0] {
        Change::Write { rev, .. } => *rev,
        Change::Remove { .. } => panic!("a write"),
    };
    assert_eq!(
        s.lease_before(b"k", rev(&first)),
        None,
        "a new key named no lease"
    );
    assert_eq!(s.lease_before(b"k", rev(&second)), lease);
    let (_, deleted) = s
        .delete_range(&DeleteRangeRequest {
            key: b"k".to_vec(),
            ..Default::default()
        })
        .unwrap(); // 4
    assert_eq!(s.lease_before(b"k", rev(&deleted)), None);
    let (_, again) = s.put(&leased("2"), &|_| true).unwrap(); // 5
    assert_eq!(
        s.lease_before(b"k", rev(&again)),
        None,
        "a tombstone names no lease"
    );
    assert_eq!(s.leased_keys().len(), 1);
    let (shared, _) = &s.leased_keys()[0];
    assert!(
        std::sync::Arc::ptr_eq(shared, &s.shared_key(b"k").unwrap()),
        "one copy of the key's bytes"
    );
    assert_eq!(s.shared_key(b"nope"), None);
}

#[test]
fn txn_applies_the_taken_branch_at_one_revision() {
    let mut s = Store::new();
    put(&mut s, "a", "1");
    let req = TxnRequest {
        compare: vec![Compare {
            result: CompareResult::Equal,
            target: CompareTarget::Value(b"1".to_vec()),
            key: "a".into(),
            range_end: vec![],
        }],
        success: vec![
            RequestOp::Put(PutRequest {
                key: "b".into(),
                value: "x".into(),
                ..Default::default()
            }),
            RequestOp::Range(RangeRequest {
                key: "b".into(),
                ..Default::default()
            }),
            RequestOp::DeleteRange(DeleteRangeRequest {
                key: "a".into(),
                ..Default::default()
            }),
        ],
        failure: vec![],
    };
    let (resp, changes) = s.txn(&req, &no_leases).unwrap();
    assert!(resp.succeeded);
    assert_eq!(resp.revision, 3);
    assert_eq!(changes.len(), 2);
    let ResponseOp::Range(r) = &resp.responses[1] else {
        panic!()
    };
    assert_eq!(
        (r.kvs.len(), r.revision),
        (1, 3),
        "a txn reads its own writes"
    );
    assert_eq!(s.current_revision(), 3);
}

#[test]
fn read_only_txn_and_failed_compares_do_not_bump() {
    let mut s = Store::new();
    put(&mut s, "a", "1");
    let req = TxnRequest {
        compare: vec![Compare {
            result: CompareResult::Greater,
            target: CompareTarget::Version(5),
            key: "a".into(),
            range_end: vec![],
        }],
        success: vec![RequestOp::Put(PutRequest {
            key: "b".into(),
            ..Default::default()
        })],
        failure: vec![RequestOp::Range(RangeRequest {
            key: "a".into(),
            ..Default::default()
        })],
    };
    let (resp, changes) = s.txn(&req, &no_leases).unwrap();
    assert!(!resp.succeeded);
    assert_eq!((resp.revision, changes.len()), (2, 0));
}

#[test]
fn value_compare_on_a_missing_key_fails_but_others_compare_as_zero() {
    let mut s = Store::new();
    let cmp = |target| TxnRequest {
        compare: vec![Compare {
            result: CompareResult::Equal,
            target,
            key: "nope".into(),
            range_end: vec![],
        }],
        ..Default::default()
    };
    assert!(
        !s.txn(&cmp(CompareTarget::Value(vec![])), &no_leases)
            .unwrap()
            .0
            .succeeded
    );
    assert!(
        s.txn(&cmp(CompareTarget::Create(0)), &no_leases)
            .unwrap()
            .0
            .succeeded
    );
    assert!(
        s.txn(&cmp(CompareTarget::Lease(0)), &no_leases)
            .unwrap()
            .0
            .succeeded
    );
}

#[test]
fn a_failing_precheck_applies_nothing() {
    let mut s = Store::new();
    put(&mut s, "a", "1");
    let req = TxnRequest {
        success: vec![
            RequestOp::Put(PutRequest {
                key: "b".into(),
                ..Default::default()
            }),
            RequestOp::Put(PutRequest {
                key: "c".into(),
                lease: LeaseId::from_wire(7),
                ..Default::default()
            }),
        ],
        ..Default::default()
    };
    assert_eq!(s.txn(&req, &no_leases).unwrap_err(), Error::LeaseNotFound);
    assert_eq!(s.current_revision(), 2);
    assert!(get_at(&s, "b", "", 0).is_empty());
    let ignore = PutRequest {
        key: "zz".into(),
        ignore_value: true,
        ..Default::default()
    };
    assert_eq!(s.put(&ignore, &no_leases).unwrap_err(), Error::KeyNotFound);
}

#[test]
fn nested_compares_see_the_state_before_the_txn() {
    let mut s = Store::new();
    let nested = TxnRequest {
        compare: vec![Compare {
            result: CompareResult::Equal,
            target: CompareTarget::Create(0),
            key: "a".into(),
            range_end: vec![],
        }],
        success: vec![RequestOp::Put(PutRequest {
            key: "yes".into(),
            ..Default::default()
        })],
        failure: vec![RequestOp::Put(PutRequest {
            key: "no".into(),
            ..Default::default()
        })],
    };
    let req = TxnRequest {
        success: vec![
            RequestOp::Put(PutRequest {
                key: "a".into(),
                ..Default::default()
            }),
            RequestOp::Txn(nested),
        ],
        ..Default::default()
    };
    let (resp, _) = s.txn(&req, &no_leases).unwrap();
    let ResponseOp::Txn(inner) = &resp.responses[1] else {
        panic!()
    };
    assert!(
        inner.succeeded,
        "the nested compare ran before `a` was written"
    );
    assert_eq!(get_at(&s, "yes", "", 0).len(), 1);
}

#[test]
fn ignore_value_and_ignore_lease_keep_the_previous_ones() {
    let mut s = Store::new();
    let lease = LeaseId::from_wire(-7).unwrap();
    let any = |_: LeaseId| true;
    s.put(
        &PutRequest {
            key: "k".into(),
            value: "v".into(),
            lease: Some(lease),
            ..Default::default()
        },
        &any,
    )
    .unwrap();
    s.put(
        &PutRequest {
            key: "k".into(),
            value: "w".into(),
            ignore_lease: true,
            ..Default::default()
        },
        &any,
    )
    .unwrap();
    s.put(
        &PutRequest {
            key: "k".into(),
            ignore_value: true,
            ..Default::default()
        },
        &any,
    )
    .unwrap();
    let kv = &s
        .range(&RangeRequest {
            key: "k".into(),
            ..Default::default()
        })
        .unwrap()
        .kvs[0];
    assert_eq!((&kv.value[..], kv.lease, kv.version), (&b"w"[..], None, 3));
}

#[test]
fn delete_keys_removes_all_at_one_revision_in_key_order() {
    let mut s = Store::new();
    for k in ["c", "a", "b"] {
        put(&mut s, k, "1");
    }
    let (rev, changes) = s.delete_keys([&b"c"[..], b"a", b"b", b"missing"]);
    assert_eq!(rev, 5);
    let keys: Vec<&[u8]> = changes
        .iter()
        .map(|c| match c {
            Change::Write { record, .. } => record.key(),
            _ => panic!(),
        })
        .collect();
    assert_eq!(keys, [b"a", b"b", b"c"]);
    let (rev, changes) = s.delete_keys([&b"a"[..]]);
    assert_eq!(
        (rev, changes.len()),
        (5, 0),
        "deleting nothing keeps the revision"
    );
}

#[test]
fn restore_from_records_gives_the_same_store() {
    let mut s = Store::new();
    put(&mut s, "a", "1");
    put(&mut s, "b", "1");
    s.delete_range(&DeleteRangeRequest {
        key: "a".into(),
        ..Default::default()
    })
    .unwrap();
    put(&mut s, "a", "2");
    s.compact(3).unwrap();
    let r = Store::restore(
        s.current_revision(),
        s.compact_revision(),
        s.records().unwrap(),
    );
    assert_eq!(r.records().unwrap(), s.records().unwrap());
    assert_eq!(
        (r.current_revision(), r.compact_revision()),
        (s.current_revision(), s.compact_revision())
    );
}

#[test]
fn events_replay_history_in_revision_order_with_prev_kv() {
    let mut s = Store::new();
    put(&mut s, "a", "1"); // 2
    put(&mut s, "b", "1"); // 3
    put(&mut s, "a", "2"); // 4
    s.delete_keys([&b"a"[..], b"b"]); // 5: two deletes
    let evs = s.events(3, 5, usize::MAX).unwrap();
    type Summary<'a> = (EventKind, &'a [u8], i64, Option<&'a [u8]>);
    let summary: Vec<Summary<'_>> = evs
        .iter()
        .map(|e| {
            (
                e.kind,
                e.kv.key.as_slice(),
                e.kv.mod_revision,
                e.prev_kv.as_ref().map(|p| &p.value[..]),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (EventKind::Put, &b"b"[..], 3, None),
            (EventKind::Put, &b"a"[..], 4, Some(&b"1"[..])),
            (EventKind::Delete, &b"a"[..], 5, Some(&b"2"[..])),
            (EventKind::Delete, &b"b"[..], 5, Some(&b"1"[..])),
        ]
    );
    assert_eq!(
        evs[2].kv,
        KeyValue {
            key: b"a".to_vec(),
            mod_revision: 5,
            ..Default::default()
        },
        "a delete carries only key and revision"
    );
    assert_eq!(
        s.events(2, 5, 2).unwrap().len(),
        2,
        "bounded by revisions: 2 and 3"
    );
    assert!(
        key_in_range(b"a", b"\0", b"zz")
            && !key_in_range(b"b", b"c", b"c")
            && key_in_range(b"k", b"", b"k")
    );
}

// --- Property test against a simple model: a full copy of the key space at every revision. ---

#[derive(Clone, Debug)]
enum Op {
    Put(u8, u8),
    Delete(u8, u8),
    Compact(u8),
    Read(u8, u8, u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..8, any::<u8>()).prop_map(|(k, v)| Op::Put(k, v)),
        2 => (0u8..8, 0u8..9).prop_map(|(k, e)| Op::Delete(k, e)),
        1 => any::<u8>().prop_map(Op::Compact),
        3 => (0u8..8, 0u8..9, any::<u8>()).prop_map(|(k, e, r)| Op::Read(k, e, r)),
    ]
}

fn key(k: u8) -> Vec<u8> {
    vec![b'k', b'0' + k]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn matches_a_model_of_full_copies(ops in proptest::collection::vec(op(), 1..60)) {
        let mut s = Store::new();
        // model[r] is the key space at revision r; index 0 is unused.
        let mut model: Vec<BTreeMap<Vec<u8>, Vec<u8>>> = vec![BTreeMap::new(), BTreeMap::new()];
        let mut compacted = -1i64;
        // Every change the model made: (kind, key, value, revision), in order.
        let mut changes = Vec::new();
        for op in ops {
            match op {
                Op::Put(k, v) => {
                    let rev = s.put(&PutRequest { key: key(k), value: vec![v], ..Default::default() }, &no_leases).unwrap().0.revision;
                    let mut next = model.last().unwrap().clone();
                    next.insert(key(k), vec![v]);
                    model.push(next);
                    changes.push((EventKind::Put, key(k), vec![v], rev));
                    prop_assert_eq!(rev as usize, model.len() - 1);
                }
                Op::Delete(k, e) => {
                    let end = if e > k { key(e) } else { vec![] };
                    let (resp, _) = s.delete_range(&DeleteRangeRequest { key: key(k), range_end: end.clone(), prev_kv: false }).unwrap();
                    let mut next = model.last().unwrap().clone();
                    let doomed: Vec<Vec<u8>> = next.keys().filter(|x| if end.is_empty() { **x == key(k) } else { **x >= key(k) && **x < end }).cloned().collect();
                    prop_assert_eq!(resp.deleted as usize, doomed.len());
                    if !doomed.is_empty() {
                        for d in doomed {
                            next.remove(&d);
                            changes.push((EventKind::Delete, d, Vec::new(), model.len() as i64));
                        }
                        model.push(next);
                    }
                }
                Op::Compact(r) => {
                    let rev = i64::from(r) % (model.len() as i64 + 1);
                    let res = s.compact(rev);
                    if rev <= compacted {
                        prop_assert_eq!(res.unwrap_err(), Error::Compacted);
                    } else if rev > s.current_revision() {
                        prop_assert_eq!(res.unwrap_err(), Error::FutureRevision);
                    } else {
                        prop_assert!(res.is_ok());
                        compacted = rev;
                    }
                }
                Op::Read(k, e, r) => {
                    let rev = i64::from(r) % (model.len() as i64 + 1);
                    let end = if e > k { key(e) } else { vec![] };
                    let res = s.range(&RangeRequest { key: key(k), range_end: end.clone(), revision: rev, ..Default::default() });
                    let at = if rev == 0 { model.len() as i64 - 1 } else { rev };
                    if rev > s.current_revision() {
                        prop_assert_eq!(res.unwrap_err(), Error::FutureRevision);
                    } else if at < compacted {
                        prop_assert_eq!(res.unwrap_err(), Error::Compacted);
                    } else {
                        let got: Vec<(Vec<u8>, Vec<u8>)> = res.unwrap().kvs.into_iter().map(|kv| (kv.key, kv.value.to_vec())).collect();
                        let want: Vec<(Vec<u8>, Vec<u8>)> = model[at as usize].iter().filter(|(x, _)| if end.is_empty() { **x == key(k) } else { **x >= key(k) && **x < end }).map(|(a, b)| (a.clone(), b.clone())).collect();
                        prop_assert_eq!(got, want);
                    }
                }
            }
            prop_assert_eq!(s.current_revision() as usize, model.len() - 1);
            s.validate();
        }
        // Watch history from the compaction point is every change the model made at it or
        // above it, in order (a delete at it included: etcd 3.6+ keeps that tombstone).
        let from = compacted.max(1);
        let want: Vec<(EventKind, Vec<u8>, Vec<u8>, i64)> = changes
            .into_iter()
            .filter(|c| c.3 >= from)
            .collect();
        let summary = |store: &Store| -> Vec<(EventKind, Vec<u8>, Vec<u8>, i64)> {
            store
                .events(from, store.current_revision(), usize::MAX).unwrap()
                .into_iter()
                .map(|e| (e.kind, e.kv.key, e.kv.value.to_vec(), e.kv.mod_revision))
                .collect()
        };
        let restored = Store::restore(s.current_revision(), s.compact_revision(), s.records().unwrap());
        prop_assert_eq!(restored.records().unwrap(), s.records().unwrap());
        prop_assert_eq!(&summary(&s), &want);
        prop_assert_eq!(summary(&restored), want);
    }
}

#[test]
fn prefix_range_end_follows_clientv3() {
    assert_eq!(prefix_range_end(b"a/"), b"a0".to_vec());
    assert_eq!(prefix_range_end(b"storm/"), b"storm0".to_vec());
    assert_eq!(prefix_range_end(b"a\xff"), b"b".to_vec());
    assert_eq!(prefix_range_end(b"\xff\xff"), vec![0]);
    assert_eq!(prefix_range_end(b""), vec![0]);
}

// --- A range read in steps, with writes between the steps, answers as one read at its start. ---

#[derive(Clone, Debug)]
enum Between {
    Nothing,
    Put(u8, u8),
    Delete(u8, u8),
    Compact,
}

fn between() -> impl Strategy<Value = Between> {
    prop_oneof![
        3 => Just(Between::Nothing),
        4 => (0u8..8, any::<u8>()).prop_map(|(k, v)| Between::Put(k, v)),
        2 => (0u8..8, 0u8..9).prop_map(|(k, e)| Between::Delete(k, e)),
        1 => Just(Between::Compact),
    ]
}

/// Applies one write between two steps of a scan; the revision compacted to, if it compacted.
/// Its changes go to `rows`, and when `big` its value is one [`Store::release_values`] lets go
/// of, as it then does with everything.
fn apply_between(s: &mut Store, write: Between, rows: &Persisted, big: bool) -> Option<i64> {
    let mut compacted = None;
    let changes = match write {
        Between::Nothing => Vec::new(),
        Between::Put(k, v) => {
            let put = PutRequest {
                key: key(k),
                value: scan_value(v, big),
                ..Default::default()
            };
            s.put(&put, &no_leases).unwrap().1
        }
        Between::Delete(k, e) => {
            let range_end = if e > k { key(e) } else { Vec::new() };
            s.delete_range(&DeleteRangeRequest {
                key: key(k),
                range_end,
                prev_kv: false,
            })
            .unwrap()
            .1
        }
        Between::Compact => {
            let to = s.current_revision();
            let Ok((_, changes)) = s.compact(to) else {
                return None;
            };
            compacted = Some(to);
            changes
        }
    };
    rows.write(&changes);
    if big {
        s.release_values(i64::MAX, 0);
    }
    compacted
}

/// A value of 0-3 bytes; or, when `big`, long enough to be released.
fn scan_value(v: u8, big: bool) -> Vec<u8> {
    let extra = if big { crate::store::RELEASE_MIN } else { 0 };
    vec![v; extra + usize::from(v % 4)]
}

fn range_request() -> impl Strategy<Value = RangeRequest> {
    // Key order with no filters, as most reads are, comes up as often as all the rest.
    let sort = prop_oneof![
        2 => Just(SortOrder::None),
        1 => Just(SortOrder::Ascend),
        1 => Just(SortOrder::Descend)
    ];
    let target = prop_oneof![
        4 => Just(SortTarget::Key),
        1 => Just(SortTarget::Version),
        1 => Just(SortTarget::Create),
        1 => Just(SortTarget::Mod),
        1 => Just(SortTarget::Value)
    ];
    let filter = || prop_oneof![1 => Just(0i64), 1 => 1i64..6];
    (
        (0u8..8, 0u8..10, 0i64..5, 0i64..4),
        (sort, target, any::<bool>(), any::<bool>()),
        (filter(), filter(), filter(), filter()),
    )
        .prop_map(
            |((k, e, limit, rev), (sort_order, sort_target, keys_only, count_only), f)| {
                RangeRequest {
                    key: key(k),
                    // 9 is etcd's "every key from `key` on".
                    range_end: match e {
                        9 => vec![0],
                        e if e > k => key(e),
                        _ => Vec::new(),
                    },
                    limit,
                    revision: rev,
                    sort_order,
                    sort_target,
                    keys_only,
                    count_only: count_only && keys_only,
                    min_mod_revision: f.0 * 3,
                    max_mod_revision: f.1 * 5,
                    min_create_revision: f.2 * 3,
                    max_create_revision: f.3 * 5,
                    ..Default::default()
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    /// Also when the store released the values it reads, which the scan reads back after its
    /// last step: writes and a compaction that come after that step (and remove rows) change
    /// nothing of the answer.
    fn a_scan_in_steps_answers_as_one_read_at_its_start(
        history in proptest::collection::vec((0u8..8, any::<u8>(), any::<bool>()), 0..30),
        req in range_request(),
        keys in 1usize..4,
        bytes in 0usize..8,
        writes in proptest::collection::vec(between(), 0..12),
        big in any::<bool>(),
    ) {
        let rows = std::sync::Arc::new(Persisted::default());
        let mut s = Store::new();
        s.set_value_source(std::sync::Arc::new(rows.clone()));
        for (k, v, delete) in history {
            let changes = if delete {
                s.delete_range(&DeleteRangeRequest { key: key(k), ..Default::default() }).unwrap().1
            } else {
                s.put(&PutRequest { key: key(k), value: scan_value(v, big), ..Default::default() }, &no_leases).unwrap().1
            };
            rows.write(&changes);
        }
        s.release_values(i64::MAX, 0);
        let whole = s.clone().range(&req);
        let mut scan = match s.range_scan(req.clone()) {
            Ok(scan) => scan,
            Err(e) => {
                prop_assert_eq!(whole.unwrap_err(), e);
                return Ok(());
            }
        };
        let budget = ScanBudget { keys, bytes };
        let mut writes = writes.into_iter();
        let mut compacted_past = false;
        loop {
            match s.range_step(&mut scan, budget) {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => {
                    prop_assert_eq!(e, Error::Compacted);
                    prop_assert!(compacted_past, "compacted with nothing compacted past the scan");
                    return Ok(());
                }
            }
            let write = writes.next().unwrap_or(Between::Nothing);
            if apply_between(&mut s, write, &rows, big).is_some_and(|to| to > scan.revision()) {
                compacted_past = true;
            }
        }
        // What the scan has yet to read back may be compacted away now: it must not matter.
        let every_key_again = (0..8).map(|k| Between::Put(k, 1));
        for write in writes.chain(every_key_again).chain([Between::Compact]) {
            apply_between(&mut s, write, &rows, big);
        }
        prop_assert_eq!(scan.finish(), whole);
    }
}

#[test]
fn a_scan_takes_a_step_per_budget_and_always_makes_progress() {
    let mut s = Store::new();
    for k in 0..8 {
        put(&mut s, &format!("k{k}"), "0123456789");
    }
    let every = RangeRequest {
        key: b"k".to_vec(),
        range_end: b"l".to_vec(),
        ..Default::default()
    };
    let steps = |budget: ScanBudget| {
        let mut scan = s.range_scan(every.clone()).unwrap();
        let mut n = 1;
        while !s.range_step(&mut scan, budget).unwrap() {
            n += 1;
        }
        (n, scan.finish().unwrap().kvs.len())
    };
    // Three keys a step: 3 + 3 + 2.
    assert_eq!(
        steps(ScanBudget {
            keys: 3,
            bytes: usize::MAX
        }),
        (3, 8)
    );
    // 12 bytes (a key and its value) fill the budget at the first key: one key a step.
    assert_eq!(
        steps(ScanBudget {
            keys: usize::MAX,
            bytes: 12
        }),
        (8, 8)
    );
    // A budget of nothing still looks at one key a step.
    assert_eq!(steps(ScanBudget { keys: 0, bytes: 0 }), (8, 8));
    assert_eq!(steps(ScanBudget::UNBOUNDED), (1, 8));
}

#[test]
fn a_scan_compacted_past_its_revision_stops_rather_than_answer_a_mix() {
    let mut s = Store::new();
    for k in 0..4 {
        put(&mut s, &format!("k{k}"), "old");
    }
    let every = RangeRequest {
        key: b"k".to_vec(),
        range_end: b"l".to_vec(),
        ..Default::default()
    };
    let one_key = ScanBudget {
        keys: 1,
        bytes: usize::MAX,
    };
    let mut scan = s.range_scan(every.clone()).unwrap();
    assert!(!s.range_step(&mut scan, one_key).unwrap());
    // A write the scan must not see, then a compaction that removes the version it must see.
    put(&mut s, "k3", "new");
    assert!(
        !s.range_step(&mut scan, one_key).unwrap(),
        "a write alone is fine"
    );
    s.compact(s.current_revision()).unwrap();
    assert_eq!(s.range_step(&mut scan, one_key), Err(Error::Compacted));

    // Compacted up to the scan's own revision: everything it reads is still there.
    put(&mut s, "z", "outside the range");
    let mut scan = s.range_scan(every).unwrap();
    assert!(!s.range_step(&mut scan, one_key).unwrap());
    s.compact(scan.revision()).unwrap();
    put(&mut s, "k3", "newer");
    while !s.range_step(&mut scan, one_key).unwrap() {}
    let values: Vec<Vec<u8>> = scan
        .finish()
        .unwrap()
        .kvs
        .into_iter()
        .map(|kv| kv.value.to_vec())
        .collect();
    assert_eq!(values, [b"old", b"old", b"old", b"new"].map(|v| v.to_vec()));
}

/// A store after `history`: for each `(k, v, kind)`, a delete of keys k and k+1 when `kind` is
/// 0, else a put of a 0-3 byte value to key k.
fn store_with_history(history: Vec<(u8, u8, u8)>) -> Store {
    let mut s = Store::new();
    for (k, v, kind) in history {
        match kind {
            0 => {
                s.delete_range(&DeleteRangeRequest {
                    key: key(k),
                    range_end: key(k + 2),
                    prev_kv: false,
                })
                .unwrap();
            }
            _ => {
                s.put(
                    &PutRequest {
                        key: key(k),
                        value: vec![v; usize::from(v % 4)],
                        ..Default::default()
                    },
                    &no_leases,
                )
                .unwrap();
            }
        }
    }
    s
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn watch_history_in_steps_is_the_history_read_at_its_start(
        history in proptest::collection::vec((0u8..8, any::<u8>(), 0u8..3), 1..30),
        from in 0i64..40,
        revisions_max in 1usize..40,
        keys in 1usize..4,
        bytes in 0usize..8,
        writes in proptest::collection::vec(between(), 0..12),
    ) {
        let mut s = store_with_history(history);
        let to = s.current_revision();
        let from = from.min(to).max(1);
        let whole = s.events(from, to, revisions_max).unwrap();
        let mut scan = s.events_scan(from, to, revisions_max, s.compact_revision());
        let budget = ScanBudget { keys, bytes };
        let mut writes = writes.into_iter();
        loop {
            match s.events_step(&mut scan, budget) {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => {
                    prop_assert_eq!(e, Error::Compacted);
                    prop_assert!(s.compact_revision() >= from, "compacted with nothing compacted past the scan");
                    return Ok(());
                }
            }
            apply_between(&mut s, writes.next().unwrap_or(Between::Nothing), &Persisted::default(), false);
        }
        prop_assert_eq!(scan.finish(), whole);
    }
}

/// A watched range in etcd's forms: one key, `key..end` (also an empty one, end <= key), or every
/// key from `key` on.
fn watched_range() -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
    (0u8..9, 0u8..10).prop_map(|(k, e)| {
        let range_end = match e {
            0 => Vec::new(),
            9 => vec![0],
            e => key(e),
        };
        (key(k), range_end)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    /// A filtered history read returns exactly the events of the keys in its ranges (and
    /// `prev_kv` only when asked), as many distinct revisions of them as asked, in steps of any
    /// budget.
    #[test]
    fn filtered_history_is_the_history_of_the_filtered_keys(
        history in proptest::collection::vec((0u8..8, any::<u8>(), 0u8..3), 1..30),
        ranges in proptest::collection::vec(watched_range(), 0..4),
        prev_kv in any::<bool>(),
        from in 0i64..40,
        revisions_max in 1usize..10,
        keys in 1usize..4,
    ) {
        let s = store_with_history(history);
        let to = s.current_revision();
        let from = from.min(to).max(1);
        let mut expected: Vec<Event> = s
            .events(from, to, usize::MAX)
            .unwrap()
            .into_iter()
            .filter(|e| ranges.iter().any(|(k, end)| key_in_range(k, end, &e.kv.key)))
            .map(|e| Event { prev_kv: e.prev_kv.filter(|_| prev_kv), ..e })
            .collect();
        let mut distinct: Vec<i64> = expected.iter().map(|e| e.kv.mod_revision).collect();
        distinct.dedup();
        if let Some(past) = distinct.get(revisions_max) {
            expected.retain(|e| e.kv.mod_revision < *past);
        }
        let filter = EventsFilter::keys(ranges.iter().map(|(k, e)| (k.as_slice(), e.as_slice())), prev_kv);
        let mut scan = s.events_scan(from, to, revisions_max, s.compact_revision()).with_filter(filter);
        while !s.events_step(&mut scan, ScanBudget { keys, bytes: usize::MAX }).unwrap() {}
        prop_assert_eq!(scan.finish(), expected);
    }
}

#[test]
fn a_filter_merges_overlapping_ranges_and_keeps_apart_the_rest() {
    let f = EventsFilter::keys(
        [
            (&b"b"[..], &b"d"[..]),
            (b"c", b"f"),
            (b"x", b""),
            (b"m", b"k"),
            (b"p", b"q"),
        ],
        false,
    );
    for (k, wanted) in [
        (&b"a"[..], false),
        (b"b", true),
        (b"e", true),
        (b"f", false),
        (b"k", false),
        (b"m", false),
        (b"p", true),
        (b"p\xff", true),
        (b"q", false),
        (b"x", true),
        (b"x\0", false),
        (b"y", false),
    ] {
        assert_eq!(f.wants(k), wanted, "{:?}", String::from_utf8_lossy(k));
    }
    let from_k = EventsFilter::keys([(&b"k"[..], &[0][..]), (b"a", b"b")], true);
    assert!(from_k.wants(b"zzz") && from_k.wants(b"k") && from_k.wants(b"a\xff"));
    assert!(!from_k.wants(b"b") && !from_k.wants(b"j"));
    assert!(EventsFilter::everything().wants(b""));
    assert!(!EventsFilter::keys([], true).wants(b"a"));
}

#[test]
fn a_history_read_sees_a_compaction_since_its_caller_looked() {
    let mut s = Store::new();
    for v in 0..6 {
        put(&mut s, "k", &v.to_string());
    }
    // The caller looks (compaction point -1, nothing compacted), picks `from` = 3; a compaction
    // to 4 lands before the read begins: the read must say so, not start from 4 silently.
    let seen = s.compact_revision();
    s.compact(4).unwrap();
    let mut scan = s.events_scan(3, s.current_revision(), usize::MAX, seen);
    assert_eq!(
        s.events_step(&mut scan, ScanBudget::UNBOUNDED),
        Err(Error::Compacted)
    );
    assert!(!scan.is_done(), "an error never makes a scan look done");
    // Looked at after the compaction, from its revision on: read whole.
    let mut scan = s.events_scan(4, s.current_revision(), usize::MAX, s.compact_revision());
    assert!(s.events_step(&mut scan, ScanBudget::UNBOUNDED).unwrap());
    assert_eq!(
        scan.finish(),
        s.events(4, s.current_revision(), usize::MAX).unwrap()
    );
}

proptest! {
    /// A file whose compaction a stop interrupted holds the rows the compaction kept and some of
    /// those it hides: restoring it gives the compacted store, and names the hidden rows still
    /// there, which are the compaction's removals that were left.
    #[test]
    fn restore_leaves_out_and_names_what_an_interrupted_compaction_hides(
        ops in proptest::collection::vec((0u8..4, any::<bool>()), 1..40),
        at in any::<prop::sample::Index>(),
        removed_before_the_stop in any::<prop::sample::Index>(),
    ) {
        let mut s = Store::new();
        for (k, is_put) in ops {
            let key = format!("k{k}");
            if is_put {
                put(&mut s, &key, "v");
            } else {
                s.delete_range(&DeleteRangeRequest { key: key.into_bytes(), ..Default::default() }).unwrap();
            }
        }
        let before = s.records().unwrap();
        let revision = 1 + at.index(s.current_revision() as usize) as i64;
        let mut compacted = s.clone();
        let (_, changes) = compacted.compact(revision).unwrap();
        let hidden: Vec<Revision> = changes
            .iter()
            .map(|c| match c {
                Change::Remove { rev } => *rev,
                Change::Write { .. } => unreachable!("a compaction only removes"),
            })
            .collect();
        // Some of the removals reached the file before the stop.
        let done = removed_before_the_stop.index(hidden.len() + 1);
        let in_file: Vec<(Revision, Record)> = before
            .into_iter()
            .filter(|(rev, _)| !hidden[..done].contains(rev))
            .collect();
        let (restored, left) =
            Store::restore_with_hidden(s.current_revision(), revision, in_file);
        let mut want_left = hidden[done..].to_vec();
        want_left.sort_unstable();
        prop_assert_eq!(left, want_left);
        prop_assert_eq!(restored.records(), compacted.records());
        prop_assert_eq!(restored.compact_revision(), revision);
        prop_assert_eq!(
            restored.events(revision, restored.current_revision(), usize::MAX).unwrap(),
            compacted.events(revision, compacted.current_revision(), usize::MAX).unwrap()
        );
        restored.validate();
    }
}

/// A long value is handed out as the store's own bytes (a read takes a reference, not a copy),
/// to every reader and to the write's event alike; a short one is copied (see `share`).
#[test]
fn long_values_are_shared_and_short_ones_copied() {
    let mut s = Store::new();
    let long = "v".repeat(1024);
    put(&mut s, "long", &long);
    put(&mut s, "short", "sixteen-bytes-ok");
    let read = |s: &Store, key: &str| {
        let req = RangeRequest {
            key: key.into(),
            ..Default::default()
        };
        s.range(&req).expect("range").kvs.remove(0).value
    };
    let (a, b) = (read(&s, "long"), read(&s, "long"));
    assert_eq!(a, long.as_bytes());
    assert_eq!(
        a.as_ptr(),
        b.as_ptr(),
        "two reads share one copy of a long value"
    );
    let (a, b) = (read(&s, "short"), read(&s, "short"));
    assert_eq!(a, &b"sixteen-bytes-ok"[..]);
    assert_ne!(a.as_ptr(), b.as_ptr(), "a short value is copied");

    let req = PutRequest {
        key: b"long2".to_vec(),
        value: long.clone().into_bytes(),
        ..Default::default()
    };
    let (_, changes) = s.put(&req, &no_leases).expect("put");
    let Some(Change::Write {
        record: Record::Put(kv),
        ..
    }) = changes.last()
    else {
        panic!("a put's change is its record: {changes:?}");
    };
    assert_eq!(
        kv.value.as_ptr(),
        read(&s, "long2").as_ptr(),
        "the event carries the stored value"
    );
}

/// The rows a caller persisted, as the source a store reads released values back from.
#[derive(Debug, Default)]
struct Persisted(std::sync::Mutex<BTreeMap<Revision, bytes::Bytes>>);

impl Persisted {
    fn write(&self, changes: &[Change]) {
        let mut rows = self.0.lock().unwrap();
        for change in changes {
            match change {
                Change::Write {
                    rev,
                    record: Record::Put(kv),
                } => {
                    rows.insert(*rev, kv.value.clone());
                }
                Change::Write { .. } => {}
                Change::Remove { rev } => {
                    rows.remove(rev);
                }
            }
        }
    }
}

impl ValueSource for std::sync::Arc<Persisted> {
    /// A copy of the rows as they stand: what is written or removed later is not seen, as in a
    /// read transaction.
    fn reader(&self) -> Result<Box<dyn ValueReader + Send>, String> {
        Ok(Box::new(RowsView(self.0.lock().unwrap().clone())))
    }
}

struct RowsView(BTreeMap<Revision, bytes::Bytes>);

/// A store that reads released values back from `rows`, and those rows, empty.
fn store_over_rows() -> (Store, std::sync::Arc<Persisted>) {
    let rows = std::sync::Arc::new(Persisted::default());
    let mut s = Store::new();
    s.set_value_source(std::sync::Arc::new(rows.clone()));
    (s, rows)
}

/// A value of 200 bytes: big enough to be released.
fn big(c: char) -> String {
    c.to_string().repeat(200)
}

/// Puts each key and value in `s`, in order, and persists what each put wrote into `rows`.
fn put_persisted<const N: usize>(s: &mut Store, rows: &Persisted, puts: [(&str, String); N]) {
    for (key, value) in puts {
        let (_, changes) = s
            .put(
                &PutRequest {
                    key: key.into(),
                    value: value.into(),
                    ..Default::default()
                },
                &no_leases,
            )
            .unwrap();
        rows.write(&changes);
    }
}

impl ValueReader for RowsView {
    fn read(&mut self, rev: Revision) -> Result<bytes::Bytes, String> {
        self.0
            .get(&rev)
            .cloned()
            .ok_or_else(|| format!("no row at {rev:?}"))
    }
}

#[test]
fn a_released_value_is_read_back_and_a_lost_row_is_an_error() {
    let (mut s, rows) = store_over_rows();
    put_persisted(
        &mut s,
        &rows,
        [
            ("a", big('1')),
            ("a", big('2')),
            ("b", "small".to_string()),
            ("b", big('3')),
            ("a", big('4')),
        ],
    );
    // Big: a@2, a@3, b@5, a@6; b@4 is too small to release.
    assert_eq!(s.releasable_bytes(), 800);
    assert_eq!(
        s.release_values(2, 0),
        200,
        "only what is durable: up to revision 2"
    );
    assert_eq!(
        s.release_values(i64::MAX, 400),
        200,
        "down to what may stay held"
    );
    assert_eq!(s.release_values(i64::MAX, 0), 400);
    assert_eq!(s.releasable_bytes(), 0);
    s.validate();
    assert_eq!(get_at(&s, "a", "", 2), vec![("a".into(), big('1'))]);
    assert_eq!(get_at(&s, "a", "", 3), vec![("a".into(), big('2'))]);
    assert_eq!(get_at(&s, "a", "", 0), vec![("a".into(), big('4'))]);
    let events = s.events(2, s.current_revision(), usize::MAX).unwrap();
    let prev: Vec<Option<String>> = events
        .iter()
        .map(|e| {
            e.prev_kv
                .as_ref()
                .map(|p| String::from_utf8(p.value.to_vec()).unwrap())
        })
        .collect();
    assert_eq!(
        prev,
        vec![
            None,
            Some(big('1')),
            None,
            Some("small".into()),
            Some(big('2'))
        ]
    );
    // A source that lost the row: the read says so, as an error of its own.
    rows.0.lock().unwrap().clear();
    assert!(matches!(
        s.range(&RangeRequest {
            key: "a".into(),
            revision: 2,
            ..Default::default()
        }),
        Err(Error::Unreadable(_))
    ));
    assert_eq!(
        get_at(&s, "b", "", 4),
        vec![("b".into(), "small".into())],
        "a small value stays held"
    );
}

/// A compaction's hash is computed after the compaction (by the hashing worker, or by the
/// first to ask), from the versions the compaction picked and the view of the rows it opened:
/// the compaction's removals, persisted before the hash is computed, do not change it.
#[test]
fn a_compactions_hash_is_taken_later_from_what_it_picked() {
    let (mut s, rows) = store_over_rows();
    put_persisted(
        &mut s,
        &rows,
        [
            ("a", big('1')),
            ("b", big('2')),
            ("a", big('3')),
            ("c", "small".to_string()),
            ("b", big('4')),
        ],
    );
    s.release_values(i64::MAX, 0);
    let before = s.hash_kv(5).unwrap();
    // The first compaction: hashed by the first to ask, after its removals left the rows.
    let (_, changes) = s.compact(5).unwrap();
    rows.write(&changes);
    assert!(
        changes.iter().any(|c| matches!(c, Change::Remove { .. })),
        "the compaction removed rows"
    );
    assert_eq!(s.hash_kv(5), Ok(before));
    assert_eq!(s.compaction_hashes(), vec![before]);
    // The second: hashed by the worker, after its removals, then asked for.
    put_persisted(&mut s, &rows, [("a", big('5')), ("a", big('6'))]);
    s.release_values(i64::MAX, 0);
    let before = s.hash_kv(8).unwrap();
    let (_, changes) = s.compact(8).unwrap();
    rows.write(&changes);
    crate::hash_in_background(s.newest_compaction_hash().unwrap());
    assert_eq!(s.hash_kv(8), Ok(before));
    assert_eq!(s.compaction_hashes().last(), Some(&before));
    // What is left at the compaction revision hashes otherwise (a@7 is gone): the taken hash
    // is the one answered, not one taken afresh.
    let fresh = Store::restore(
        s.current_revision(),
        s.compact_revision(),
        s.records().unwrap(),
    );
    let mut fresh = fresh;
    fresh.set_value_source(std::sync::Arc::new(rows.clone()));
    assert_ne!(fresh.hash_kv(8).unwrap().hash, before.hash);
}

/// A value the compaction's view cannot read back: the hash says so when asked for, and the
/// compaction itself (and every write after it) goes on.
#[test]
fn a_compactions_hash_over_a_lost_row_is_an_error_of_the_hash_alone() {
    let (mut s, rows) = store_over_rows();
    put_persisted(&mut s, &rows, [("a", big('1')), ("a", big('2'))]);
    s.release_values(i64::MAX, 0);
    rows.0.lock().unwrap().clear();
    assert_eq!(s.compact(3).map(|(rev, _)| rev), Ok(3));
    assert!(matches!(s.hash_kv(3), Err(Error::Unreadable(_))));
    assert_eq!(s.compaction_hashes(), vec![]);
    put(&mut s, "b", "1");
    assert_eq!(s.current_revision(), 4);
}

#[derive(Clone, Debug)]
enum ReleaseOp {
    Put(u8, u16),
    /// A txn that puts `new` if the key's value is the one `Put(_, n)` would write, and reads
    /// the key otherwise.
    SwapValue(u8, u16, u16),
    Delete(u8),
    Compact(u8),
    Release(u16),
}

/// One of 12 values, small (kept) and big (released): a compare of values meets equal ones.
fn release_value(n: u16) -> Vec<u8> {
    vec![b'a' + (n % 3) as u8; [0, 50, 200, 300][usize::from(n % 4)]]
}

fn release_op() -> impl Strategy<Value = ReleaseOp> {
    prop_oneof![
        5 => (0u8..6, 0u16..12).prop_map(|(k, n)| ReleaseOp::Put(k, n)),
        2 => (0u8..6, 0u16..12, 0u16..12).prop_map(|(k, n, new)| ReleaseOp::SwapValue(k, n, new)),
        1 => (0u8..6).prop_map(ReleaseOp::Delete),
        1 => any::<u8>().prop_map(ReleaseOp::Compact),
        2 => (0u16..600).prop_map(ReleaseOp::Release),
    ]
}

proptest! {
    /// A store that releases values answers every read as one that holds them all: ranges at
    /// every revision (sorted by value too), watch history with previous values, hashes, and the
    /// records a snapshot carries.
    #[test]
    fn releasing_values_changes_no_answer(ops in proptest::collection::vec(release_op(), 1..60)) {
        let rows = std::sync::Arc::new(Persisted::default());
        let mut held = Store::new();
        let mut released = Store::new();
        released.set_value_source(std::sync::Arc::new(rows.clone()));
        for op in ops {
            match op {
                ReleaseOp::Put(k, n) => {
                    let req = PutRequest { key: vec![b'k', k], value: release_value(n), prev_kv: true, ..Default::default() };
                    let a = held.put(&req, &no_leases).unwrap();
                    let b = released.put(&req, &no_leases).unwrap();
                    rows.write(&b.1);
                    prop_assert_eq!(a, b);
                }
                ReleaseOp::SwapValue(k, n, new) => {
                    let req = TxnRequest {
                        compare: vec![Compare { key: vec![b'k', k], range_end: vec![], target: CompareTarget::Value(release_value(n)), result: CompareResult::Equal }],
                        success: vec![RequestOp::Put(PutRequest { key: vec![b'k', k], value: release_value(new), prev_kv: true, ..Default::default() })],
                        failure: vec![RequestOp::Range(RangeRequest { key: vec![b'k', k], ..Default::default() })],
                    };
                    let a = held.txn(&req, &no_leases).unwrap();
                    let b = released.txn(&req, &no_leases).unwrap();
                    rows.write(&b.1);
                    prop_assert_eq!(a, b);
                }
                ReleaseOp::Delete(k) => {
                    let req = DeleteRangeRequest { key: vec![b'k', k], prev_kv: true, ..Default::default() };
                    let a = held.delete_range(&req).unwrap();
                    let b = released.delete_range(&req).unwrap();
                    rows.write(&b.1);
                    prop_assert_eq!(a, b);
                }
                ReleaseOp::Compact(r) => {
                    let rev = 1 + i64::from(r) % held.current_revision();
                    let a = held.compact(rev);
                    let b = released.compact(rev);
                    if let Ok((_, changes)) = &b {
                        rows.write(changes);
                    }
                    prop_assert_eq!(a, b);
                }
                ReleaseOp::Release(keep) => {
                    released.release_values(released.current_revision(), usize::from(keep));
                    prop_assert!(released.releasable_bytes() <= usize::from(keep));
                }
            }
            released.validate();
        }
        released.release_values(released.current_revision(), 0);
        for rev in held.compact_revision().max(1)..=held.current_revision() {
            let orders = [(SortTarget::Key, SortOrder::Descend, 3), (SortTarget::Value, SortOrder::Descend, 3), (SortTarget::Key, SortOrder::None, 2), (SortTarget::Key, SortOrder::None, 0)];
            for (sort_target, sort_order, limit) in orders {
                let req = RangeRequest { key: vec![b'k'], range_end: vec![b'l'], revision: rev, sort_target, sort_order, limit, ..Default::default() };
                prop_assert_eq!(held.range(&req), released.range(&req));
            }
            prop_assert_eq!(held.hash_kv(rev), released.hash_kv(rev));
        }
        let from = held.compact_revision().max(1);
        prop_assert_eq!(
            held.events(from, held.current_revision(), usize::MAX),
            released.events(from, released.current_revision(), usize::MAX)
        );
        prop_assert_eq!(held.records(), released.records());
    }
}

#[test]
fn a_store_restored_with_values_left_in_the_file_reads_what_a_held_restore_reads() {
    let rows = std::sync::Arc::new(Persisted::default());
    let mut s = Store::new();
    let big = |c: char| c.to_string().repeat(crate::RELEASE_MIN);
    put_persisted(
        &mut s,
        &rows,
        [
            ("a", big('1')),
            ("b", "small".to_string()),
            ("a", big('2')),
            ("c", big('3')),
            ("b", big('4')),
        ],
    );
    let changes = s
        .delete_range(&DeleteRangeRequest {
            key: "c".into(),
            ..Default::default()
        })
        .unwrap()
        .1;
    rows.write(&changes);
    let records = s.records().unwrap();
    let (current, compact) = (s.current_revision(), s.compact_revision());
    let held = Store::restore(current, compact, records.clone());
    let left = records.into_iter().map(|(rev, mut record)| {
        let released = matches!(&record, Record::Put(kv) if kv.value.len() >= crate::RELEASE_MIN);
        if let Record::Put(kv) = &mut record
            && released
        {
            kv.value = bytes::Bytes::new();
        }
        (rev, record, released)
    });
    let (mut released, hidden) = Store::restore_released(current, compact, left);
    assert!(hidden.is_empty());
    assert_eq!(
        released.releasable_bytes(),
        0,
        "no value of the file is held"
    );
    released.set_value_source(std::sync::Arc::new(rows.clone()));
    released.validate();
    for rev in 0..=current {
        for k in ["a", "b", "c"] {
            assert_eq!(get_at(&released, k, "", rev), get_at(&held, k, "", rev));
        }
    }
    let all = |s: &Store| s.events(1, current, usize::MAX).unwrap();
    assert_eq!(all(&released), all(&held), "history and prev_kv alike");
    // The small value is held: it reads with no row behind it.
    rows.0.lock().unwrap().clear();
    assert_eq!(
        get_at(&released, "b", "", 3),
        vec![("b".into(), "small".into())]
    );
}
