//! KV semantics, differentially: every scenario runs against a fresh real etcd and a fresh
//! leasehold, and every response (header revision, every key-value field, count, more,
//! prev_kvs, deleted, txn results, and errors as gRPC code + message) must be the same.
//!
//! Each scenario starts two servers, so each groups several related checks. Scenarios are
//! deterministic: nothing in them depends on timing. A new scenario can be checked on its own
//! with `LEASEHOLD_DIFF_AGAINST_ETCD=1` (etcd on both sides) before it says anything about
//! leasehold.

use leasehold_testkit as common;
use leasehold_testkit::all_keys;

use common::{Recorder, differential};
use etcd_client::CompareOp::{Equal, Greater, Less, NotEqual};
use etcd_client::{
    Client, Compare, DeleteOptions, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
};

fn at_revision(revision: i64) -> Option<GetOptions> {
    Some(GetOptions::new().with_revision(revision))
}

fn prefix() -> Option<GetOptions> {
    Some(GetOptions::new().with_prefix())
}

fn prev_kv() -> Option<PutOptions> {
    Some(PutOptions::new().with_prev_key())
}

/// A read of every key, recorded: the state after a step, with the store's revision.
async fn record_everything(c: &mut Client, r: &mut Recorder, label: &str) {
    r.record(
        format!("{label}: range all keys"),
        c.get("", all_keys()).await,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_store_and_put_get_with_prev_kv() {
    differential("empty_store_and_put_get_with_prev_kv", |c, r| {
        Box::pin(async move {
            // A new store is at revision 1 and holds nothing.
            r.record("range one key on the empty store", c.get("a", None).await);
            record_everything(c, r, "empty store").await;
            r.record(
                "count_only on the empty store",
                c.get(
                    "",
                    Some(GetOptions::new().with_all_keys().with_count_only()),
                )
                .await,
            );

            r.record(
                "put a=1 (first write is revision 2)",
                c.put("a", "1", None).await,
            );
            r.record("put a=2 with prev_kv", c.put("a", "2", prev_kv()).await);
            r.record(
                "put b=1 with prev_kv (no previous)",
                c.put("b", "1", prev_kv()).await,
            );
            r.record("put a='' with prev_kv", c.put("a", "", prev_kv()).await);
            r.record("get a (empty value)", c.get("a", None).await);
            r.record("get b", c.get("b", None).await);
            r.record("get missing key", c.get("zz", None).await);

            r.record(
                "put binary key and value",
                c.put(vec![0x00, 0xff, 0x01], vec![0xfe, 0x00], None).await,
            );
            r.record("get binary key", c.get(vec![0x00, 0xff, 0x01], None).await);
            r.record(
                "put key with a space and unicode",
                c.put("k ü/é", "välue", prev_kv()).await,
            );
            r.record(
                "get key with a space and unicode",
                c.get("k ü/é", None).await,
            );

            // ignore_value / ignore_lease on an existing key keep the value and the lease but
            // still make a new revision of the key.
            r.record(
                "put b ignore_value with prev_kv",
                c.put(
                    "b",
                    "",
                    Some(PutOptions::new().with_ignore_value().with_prev_key()),
                )
                .await,
            );
            r.record("get b after ignore_value", c.get("b", None).await);
            r.record(
                "put b=3 ignore_lease",
                c.put("b", "3", Some(PutOptions::new().with_ignore_lease()))
                    .await,
            );
            r.record("get b after ignore_lease", c.get("b", None).await);
            r.record(
                "put b ignore_value and ignore_lease",
                c.put(
                    "b",
                    "",
                    Some(PutOptions::new().with_ignore_value().with_ignore_lease()),
                )
                .await,
            );
            r.record(
                "put b with lease 0 (no lease) and prev_kv",
                c.put(
                    "b",
                    "4",
                    Some(PutOptions::new().with_lease(0).with_prev_key()),
                )
                .await,
            );
            record_everything(c, r, "end").await;
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_across_overwrite_delete_and_recreate() {
    differential("versions_across_overwrite_delete_and_recreate", |c, r| {
        Box::pin(async move {
            r.record("put k=v1", c.put("k", "v1", None).await); // rev 2
            r.record("put k=v2", c.put("k", "v2", None).await); // rev 3
            r.record("put k=v3", c.put("k", "v3", None).await); // rev 4
            r.record("get k: version 3", c.get("k", None).await);
            r.record(
                "delete k with prev_kv",
                c.delete("k", Some(DeleteOptions::new().with_prev_key()))
                    .await,
            ); // rev 5
            r.record("get k after delete", c.get("k", None).await);
            r.record(
                "put k=v4: new generation",
                c.put("k", "v4", prev_kv()).await,
            ); // rev 6
            r.record(
                "get k: version 1 again, new create_revision",
                c.get("k", None).await,
            );
            r.record("put other", c.put("other", "o", None).await); // rev 7
            r.record("put k=v5", c.put("k", "v5", None).await); // rev 8
            r.record("delete k", c.delete("k", None).await); // rev 9
            r.record("put k=v6", c.put("k", "v6", None).await); // rev 10

            // History: k at every revision, including before it existed and while deleted.
            for revision in 1..=10 {
                r.record(
                    format!("get k at revision {revision}"),
                    c.get("k", at_revision(revision)).await,
                );
            }
            for revision in [4, 5, 7, 9] {
                r.record(
                    format!("all keys at revision {revision}"),
                    c.get(
                        "",
                        Some(GetOptions::new().with_all_keys().with_revision(revision)),
                    )
                    .await,
                );
            }
            record_everything(c, r, "end").await;
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_single_range_prefix_and_nothing() {
    differential("delete_single_range_prefix_and_nothing", |c, r| {
        Box::pin(async move {
            for key in ["a", "a1", "a2", "a3", "b", "b1", "b2", "c", "d"] {
                r.record(
                    format!("put {key}"),
                    c.put(key, format!("value of {key}"), None).await,
                );
            }
            r.record(
                "delete a with prev_kv",
                c.delete("a", Some(DeleteOptions::new().with_prev_key()))
                    .await,
            );
            r.record(
                "delete [a1, a3) with prev_kv",
                c.delete(
                    "a1",
                    Some(DeleteOptions::new().with_range("a3").with_prev_key()),
                )
                .await,
            );
            r.record(
                "delete prefix b without prev_kv",
                c.delete("b", Some(DeleteOptions::new().with_prefix()))
                    .await,
            );
            record_everything(c, r, "after deletes").await;

            // Deleting nothing does not make a revision.
            r.record(
                "delete missing key",
                c.delete("zz", Some(DeleteOptions::new().with_prev_key()))
                    .await,
            );
            r.record("delete already deleted key", c.delete("a", None).await);
            r.record(
                "delete empty prefix range",
                c.delete("nothing/", Some(DeleteOptions::new().with_prefix()))
                    .await,
            );
            r.record(
                "delete range with end before key",
                c.delete("d", Some(DeleteOptions::new().with_range("a")))
                    .await,
            );
            r.record(
                "delete range with end equal to key",
                c.delete("d", Some(DeleteOptions::new().with_range("d")))
                    .await,
            );
            record_everything(c, r, "after deleting nothing (revision unchanged)").await;

            r.record(
                "delete from key a3 with prev_kv",
                c.delete(
                    "a3",
                    Some(DeleteOptions::new().with_from_key().with_prev_key()),
                )
                .await,
            );
            record_everything(c, r, "after delete from key").await;
            r.record("put a again", c.put("a", "again", None).await);
            r.record("put e", c.put("e", "e", None).await);
            r.record(
                "delete all keys with prev_kv",
                c.delete(
                    "",
                    Some(DeleteOptions::new().with_all_keys().with_prev_key()),
                )
                .await,
            );
            record_everything(c, r, "after delete all").await;
            r.record(
                "get a at the revision before delete all",
                c.get("a", Some(GetOptions::new().with_revision(16))).await,
            );
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_forms_limit_more_count_keys_only_count_only() {
    differential(
        "range_forms_limit_more_count_keys_only_count_only",
        |c, r| {
            Box::pin(async move {
                let keys: [&[u8]; 11] = [
                    b"\x01",
                    b"a",
                    b"a/1",
                    b"a/2",
                    b"a/3",
                    b"ab",
                    b"b",
                    b"b/1",
                    b"c",
                    b"\xff",
                    b"\xff\xff",
                ];
                for key in keys {
                    r.record(
                        format!("put {key:?}"),
                        c.put(key, b"v".to_vec(), None).await,
                    );
                }
                let ranges: Vec<(&str, Vec<u8>, Option<GetOptions>)> = vec![
                    ("single key a", b"a".to_vec(), None),
                    (
                        "[a, b)",
                        b"a".to_vec(),
                        Some(GetOptions::new().with_range("b")),
                    ),
                    (
                        "[a/1, a/3)",
                        b"a/1".to_vec(),
                        Some(GetOptions::new().with_range("a/3")),
                    ),
                    ("prefix a/", b"a/".to_vec(), prefix()),
                    ("prefix a", b"a".to_vec(), prefix()),
                    ("prefix \\xff", b"\xff".to_vec(), prefix()),
                    ("prefix of a missing key", b"zz".to_vec(), prefix()),
                    (
                        "from key b",
                        b"b".to_vec(),
                        Some(GetOptions::new().with_from_key()),
                    ),
                    (
                        "from key \\0 (range_end \\0)",
                        b"\x00".to_vec(),
                        Some(GetOptions::new().with_from_key()),
                    ),
                    ("all keys", b"".to_vec(), all_keys()),
                    (
                        "range end before key",
                        b"b".to_vec(),
                        Some(GetOptions::new().with_range("a")),
                    ),
                    (
                        "range end equal to key",
                        b"b".to_vec(),
                        Some(GetOptions::new().with_range("b")),
                    ),
                    (
                        "limit 2 of prefix a",
                        b"a".to_vec(),
                        Some(GetOptions::new().with_prefix().with_limit(2)),
                    ),
                    (
                        "limit 5 of prefix a (exactly all)",
                        b"a".to_vec(),
                        Some(GetOptions::new().with_prefix().with_limit(5)),
                    ),
                    (
                        "limit 100 of prefix a",
                        b"a".to_vec(),
                        Some(GetOptions::new().with_prefix().with_limit(100)),
                    ),
                    (
                        "limit 1 of a single key",
                        b"a".to_vec(),
                        Some(GetOptions::new().with_limit(1)),
                    ),
                    (
                        "limit 3 of all keys",
                        b"".to_vec(),
                        Some(GetOptions::new().with_all_keys().with_limit(3)),
                    ),
                    (
                        "negative limit",
                        b"a".to_vec(),
                        Some(GetOptions::new().with_prefix().with_limit(-1)),
                    ),
                    (
                        "keys_only prefix a",
                        b"a".to_vec(),
                        Some(GetOptions::new().with_prefix().with_keys_only()),
                    ),
                    (
                        "keys_only limit 2",
                        b"a".to_vec(),
                        Some(
                            GetOptions::new()
                                .with_prefix()
                                .with_keys_only()
                                .with_limit(2),
                        ),
                    ),
                    (
                        "count_only prefix a",
                        b"a".to_vec(),
                        Some(GetOptions::new().with_prefix().with_count_only()),
                    ),
                    (
                        "count_only limit 2",
                        b"a".to_vec(),
                        Some(
                            GetOptions::new()
                                .with_prefix()
                                .with_count_only()
                                .with_limit(2),
                        ),
                    ),
                    (
                        "count_only and keys_only",
                        b"a".to_vec(),
                        Some(
                            GetOptions::new()
                                .with_prefix()
                                .with_count_only()
                                .with_keys_only(),
                        ),
                    ),
                    (
                        "count_only of a missing key",
                        b"zz".to_vec(),
                        Some(GetOptions::new().with_count_only()),
                    ),
                    (
                        "serializable read",
                        b"a".to_vec(),
                        Some(GetOptions::new().with_prefix().with_serializable()),
                    ),
                ];
                for (label, key, options) in ranges {
                    r.record(format!("range {label}"), c.get(key, options).await);
                }
            })
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_sort_by_every_target_and_order() {
    differential("range_sort_by_every_target_and_order", |c, r| {
        Box::pin(async move {
            // No ties in any sort target, so every order is fully determined: key order,
            // create order (s3 s1 s5 s2 s4), mod order, versions (s1:3 s2:1 s3:5 s4:2 s5:4)
            // and values all differ.
            let writes = [
                ("s3", "m"),
                ("s1", "q"),
                ("s5", "c"),
                ("s2", "z"),
                ("s4", "k"),
                ("s3", "n"),
                ("s1", "r"),
                ("s3", "o"),
                ("s5", "d"),
                ("s4", "l"),
                ("s1", "s"),
                ("s3", "p"),
                ("s5", "e"),
                ("s3", "a"),
                ("s5", "f"),
            ];
            for (key, value) in writes {
                r.record(format!("put {key}={value}"), c.put(key, value, None).await);
            }
            r.record("outside the prefix", c.put("t", "t", None).await);
            let targets = [
                ("KEY", SortTarget::Key),
                ("VERSION", SortTarget::Version),
                ("CREATE", SortTarget::Create),
                ("MOD", SortTarget::Mod),
                ("VALUE", SortTarget::Value),
            ];
            let orders = [
                ("NONE", SortOrder::None),
                ("ASCEND", SortOrder::Ascend),
                ("DESCEND", SortOrder::Descend),
            ];
            for (target_name, target) in targets {
                for (order_name, order) in orders {
                    r.record(
                        format!("prefix s sorted by {target_name} {order_name}"),
                        c.get(
                            "s",
                            Some(GetOptions::new().with_prefix().with_sort(target, order)),
                        )
                        .await,
                    );
                }
                // Sorting happens before the limit is applied.
                r.record(
                    format!("prefix s sorted by {target_name} DESCEND, limit 2"),
                    c.get(
                        "s",
                        Some(
                            GetOptions::new()
                                .with_prefix()
                                .with_sort(target, SortOrder::Descend)
                                .with_limit(2),
                        ),
                    )
                    .await,
                );
                r.record(
                    format!("prefix s sorted by {target_name} ASCEND, limit 3, keys_only"),
                    c.get(
                        "s",
                        Some(
                            GetOptions::new()
                                .with_prefix()
                                .with_sort(target, SortOrder::Ascend)
                                .with_limit(3)
                                .with_keys_only(),
                        ),
                    )
                    .await,
                );
            }
            r.record(
                "sorted by VALUE DESCEND at an old revision",
                c.get(
                    "s",
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_sort(SortTarget::Value, SortOrder::Descend)
                            .with_revision(8),
                    ),
                )
                .await,
            );
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_revision_filters_and_history_reads() {
    differential("range_revision_filters_and_history_reads", |c, r| {
        Box::pin(async move {
            r.record("put f1", c.put("f1", "1a", None).await); // 2
            r.record("put f2", c.put("f2", "2a", None).await); // 3
            r.record("put f3", c.put("f3", "3a", None).await); // 4
            r.record("put f1 again", c.put("f1", "1b", None).await); // 5
            r.record("put f4", c.put("f4", "4a", None).await); // 6
            r.record("put f2 again", c.put("f2", "2b", None).await); // 7
            r.record("delete f3", c.delete("f3", None).await); // 8
            r.record("put f5", c.put("f5", "5a", None).await); // 9

            let filtered = |o: GetOptions| Some(o.with_prefix());
            let cases: Vec<(&str, Option<GetOptions>)> = vec![
                (
                    "min_mod_revision 6",
                    filtered(GetOptions::new().with_min_mod_revision(6)),
                ),
                (
                    "max_mod_revision 5",
                    filtered(GetOptions::new().with_max_mod_revision(5)),
                ),
                (
                    "min_create_revision 3",
                    filtered(GetOptions::new().with_min_create_revision(3)),
                ),
                (
                    "max_create_revision 3",
                    filtered(GetOptions::new().with_max_create_revision(3)),
                ),
                (
                    "min_mod 5 and max_create 3",
                    filtered(
                        GetOptions::new()
                            .with_min_mod_revision(5)
                            .with_max_create_revision(3),
                    ),
                ),
                (
                    "min_mod 6 max_mod 7",
                    filtered(
                        GetOptions::new()
                            .with_min_mod_revision(6)
                            .with_max_mod_revision(7),
                    ),
                ),
                (
                    "min_mod above everything",
                    filtered(GetOptions::new().with_min_mod_revision(100)),
                ),
                (
                    "min_mod 6 with limit 1",
                    filtered(GetOptions::new().with_min_mod_revision(6).with_limit(1)),
                ),
                (
                    "max_create 3 with limit 1",
                    filtered(GetOptions::new().with_max_create_revision(3).with_limit(1)),
                ),
                (
                    "min_mod 6 count_only",
                    filtered(GetOptions::new().with_min_mod_revision(6).with_count_only()),
                ),
                (
                    "min_mod 6 keys_only",
                    filtered(GetOptions::new().with_min_mod_revision(6).with_keys_only()),
                ),
                (
                    "min_mod 6 sorted by MOD DESCEND",
                    filtered(
                        GetOptions::new()
                            .with_min_mod_revision(6)
                            .with_sort(SortTarget::Mod, SortOrder::Descend),
                    ),
                ),
                (
                    "at revision 4",
                    filtered(GetOptions::new().with_revision(4)),
                ),
                (
                    "at revision 6",
                    filtered(GetOptions::new().with_revision(6)),
                ),
                (
                    "at revision 7",
                    filtered(GetOptions::new().with_revision(7)),
                ),
                (
                    "at revision 8 (f3 deleted)",
                    filtered(GetOptions::new().with_revision(8)),
                ),
                (
                    "at revision 6 with min_mod 5",
                    filtered(GetOptions::new().with_revision(6).with_min_mod_revision(5)),
                ),
                (
                    "at revision 6 with limit 2",
                    filtered(GetOptions::new().with_revision(6).with_limit(2)),
                ),
                (
                    "at revision 6 count_only",
                    filtered(GetOptions::new().with_revision(6).with_count_only()),
                ),
                (
                    "at the current revision 9",
                    filtered(GetOptions::new().with_revision(9)),
                ),
                (
                    "at revision 0 (latest)",
                    filtered(GetOptions::new().with_revision(0)),
                ),
                (
                    "at revision 1 (before any write)",
                    filtered(GetOptions::new().with_revision(1)),
                ),
            ];
            for (label, options) in cases {
                r.record(format!("prefix f, {label}"), c.get("f", options).await);
            }
            r.record("f3 at revision 7", c.get("f3", at_revision(7)).await);
            r.record("f3 at revision 8", c.get("f3", at_revision(8)).await);
            r.record("f1 at revision 4", c.get("f1", at_revision(4)).await);
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_compares_and_branches() {
    differential("txn_compares_and_branches", |c, r| {
        Box::pin(async move {
            r.record("put x=10", c.put("x", "10", None).await); // 2
            r.record("put x=20", c.put("x", "20", None).await); // 3: version 2, create 2, mod 3
            r.record("put y=abc", c.put("y", "abc", None).await); // 4
            r.record("put p/1", c.put("p/1", "1", None).await); // 5
            r.record("put p/2", c.put("p/2", "2", None).await); // 6

            let compares: Vec<(&str, Vec<Compare>)> = vec![
                ("no compares", vec![]),
                ("version(x) = 2", vec![Compare::version("x", Equal, 2)]),
                ("version(x) != 2", vec![Compare::version("x", NotEqual, 2)]),
                ("version(x) < 3", vec![Compare::version("x", Less, 3)]),
                ("version(x) > 1", vec![Compare::version("x", Greater, 1)]),
                ("version(x) > 2", vec![Compare::version("x", Greater, 2)]),
                (
                    "version(missing) = 0",
                    vec![Compare::version("missing", Equal, 0)],
                ),
                (
                    "version(missing) > 0",
                    vec![Compare::version("missing", Greater, 0)],
                ),
                (
                    "create(x) = 2",
                    vec![Compare::create_revision("x", Equal, 2)],
                ),
                (
                    "create(x) < 3",
                    vec![Compare::create_revision("x", Less, 3)],
                ),
                (
                    "create(x) > 2",
                    vec![Compare::create_revision("x", Greater, 2)],
                ),
                (
                    "create(missing) = 0",
                    vec![Compare::create_revision("missing", Equal, 0)],
                ),
                ("mod(x) = 3", vec![Compare::mod_revision("x", Equal, 3)]),
                ("mod(x) > 2", vec![Compare::mod_revision("x", Greater, 2)]),
                ("mod(x) < 3", vec![Compare::mod_revision("x", Less, 3)]),
                ("mod(x) != 3", vec![Compare::mod_revision("x", NotEqual, 3)]),
                (
                    "mod(missing) = 0",
                    vec![Compare::mod_revision("missing", Equal, 0)],
                ),
                (
                    "mod(missing) < 1",
                    vec![Compare::mod_revision("missing", Less, 1)],
                ),
                ("value(x) = 20", vec![Compare::value("x", Equal, "20")]),
                ("value(x) != 20", vec![Compare::value("x", NotEqual, "20")]),
                (
                    "value(x) > 1 (bytewise)",
                    vec![Compare::value("x", Greater, "1")],
                ),
                ("value(x) < 3", vec![Compare::value("x", Less, "3")]),
                ("value(x) < 200", vec![Compare::value("x", Less, "200")]),
                ("value(x) > 20", vec![Compare::value("x", Greater, "20")]),
                (
                    "value(missing) = ''",
                    vec![Compare::value("missing", Equal, "")],
                ),
                (
                    "value(missing) != ''",
                    vec![Compare::value("missing", NotEqual, "")],
                ),
                ("lease(x) = 0", vec![Compare::lease("x", Equal, 0)]),
                ("lease(x) != 0", vec![Compare::lease("x", NotEqual, 0)]),
                ("lease(x) > 0", vec![Compare::lease("x", Greater, 0)]),
                (
                    "lease(missing) = 0",
                    vec![Compare::lease("missing", Equal, 0)],
                ),
                (
                    "version(prefix p/) = 1",
                    vec![Compare::version("p/", Equal, 1).with_prefix()],
                ),
                (
                    "mod(prefix p/) > 5",
                    vec![Compare::mod_revision("p/", Greater, 5).with_prefix()],
                ),
                (
                    "mod(prefix p/) > 4",
                    vec![Compare::mod_revision("p/", Greater, 4).with_prefix()],
                ),
                (
                    "value(prefix p/) > 0",
                    vec![Compare::value("p/", Greater, "0").with_prefix()],
                ),
                (
                    "create([p/1, p/2)) = 5",
                    vec![Compare::create_revision("p/1", Equal, 5).with_range("p/2")],
                ),
                (
                    "create([p/1, p/3)) = 5",
                    vec![Compare::create_revision("p/1", Equal, 5).with_range("p/3")],
                ),
                (
                    "version(prefix q/, no keys) = 0",
                    vec![Compare::version("q/", Equal, 0).with_prefix()],
                ),
                (
                    "value(prefix q/, no keys) = ''",
                    vec![Compare::value("q/", Equal, "").with_prefix()],
                ),
                (
                    "lease(all keys) = 0",
                    vec![Compare::lease("\0", Equal, 0).with_range("\0")],
                ),
                (
                    "all true",
                    vec![
                        Compare::version("x", Equal, 2),
                        Compare::value("y", Equal, "abc"),
                        Compare::mod_revision("p/2", Equal, 6),
                    ],
                ),
                (
                    "one false",
                    vec![
                        Compare::version("x", Equal, 2),
                        Compare::value("y", Equal, "abd"),
                        Compare::mod_revision("p/2", Equal, 6),
                    ],
                ),
                (
                    "compare on an empty key",
                    vec![Compare::version("", Equal, 0)],
                ),
            ];
            // Read-only branches: these txns do not change the store, so one setup serves all.
            for (label, compare) in compares {
                let txn = Txn::new()
                    .when(compare)
                    .and_then([TxnOp::get("x", None)])
                    .or_else([TxnOp::get("y", None), TxnOp::get("p/", prefix())]);
                r.record(format!("txn if {label}"), c.txn(txn).await);
            }

            // Writing branches: the taken branch is applied, the other is not.
            let txn = Txn::new()
                .when([Compare::value("x", Equal, "20")])
                .and_then([
                    TxnOp::put("x", "30", prev_kv()),
                    TxnOp::put("z", "new", None),
                ])
                .or_else([TxnOp::put("y", "not this", None)]);
            r.record("txn success branch writes", c.txn(txn).await);
            let txn = Txn::new()
                .when([Compare::value("x", Equal, "20")])
                .and_then([TxnOp::put("y", "not this", None)])
                .or_else([
                    TxnOp::delete(
                        "p/",
                        Some(DeleteOptions::new().with_prefix().with_prev_key()),
                    ),
                    TxnOp::put("w", "w", None),
                ]);
            r.record("txn failure branch writes", c.txn(txn).await);
            let txn = Txn::new()
                .when([Compare::version("x", Equal, 0)])
                .and_then([TxnOp::put("y", "not this", None)]);
            r.record("txn false with no failure ops", c.txn(txn).await);
            let txn = Txn::new()
                .when([Compare::version("missing", Equal, 0)])
                .or_else([TxnOp::put("y", "not this", None)]);
            r.record("txn true with no success ops", c.txn(txn).await);
            record_everything(c, r, "end").await;
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_nested_reads_own_writes_and_revision_rules() {
    differential("txn_nested_reads_own_writes_and_revision_rules", |c, r| {
        Box::pin(async move {
            r.record("put x", c.put("x", "x0", None).await); // 2
            r.record("put y", c.put("y", "y0", None).await); // 3

            // A read-only txn does not make a revision; neither does a txn whose branch is empty
            // or only deletes nothing.
            r.record(
                "read-only txn",
                c.txn(Txn::new().and_then([TxnOp::get("x", None), TxnOp::get("", all_keys())]))
                    .await,
            );
            r.record("txn with no ops", c.txn(Txn::new()).await);
            r.record(
                "txn deleting nothing",
                c.txn(Txn::new().and_then([TxnOp::delete("missing", None)]))
                    .await,
            );
            record_everything(c, r, "revision still 3").await;

            // Every write of one txn has the same revision; later ops see earlier ones.
            let txn = Txn::new().and_then([
                TxnOp::put("a", "1", None),
                TxnOp::get("a", None),
                TxnOp::put("b", "2", prev_kv()),
                TxnOp::get(
                    "",
                    Some(GetOptions::new().with_all_keys().with_count_only()),
                ),
                TxnOp::delete("x", Some(DeleteOptions::new().with_prev_key())),
                TxnOp::get("x", None),
                TxnOp::put("y", "y1", prev_kv()),
                TxnOp::get("", all_keys()),
            ]);
            r.record(
                "txn: put, read, delete, read, overwrite, read",
                c.txn(txn).await,
            );
            record_everything(c, r, "after one txn: one revision").await;

            // Reads after a delete in the same txn do not see the deleted key.
            let txn = Txn::new().and_then([
                TxnOp::delete("a", Some(DeleteOptions::new().with_prev_key())),
                TxnOp::get("a", None),
                TxnOp::put("c", "1", None),
                TxnOp::get("", Some(GetOptions::new().with_all_keys().with_keys_only())),
            ]);
            r.record("txn: delete then read", c.txn(txn).await);

            // Nested txns. Compares of nested txns are evaluated against the store as it was
            // before the outer txn's ops ran.
            let inner = Txn::new()
                .when([Compare::version("n", Equal, 0)])
                .and_then([TxnOp::get("n", None), TxnOp::put("n2", "inner-then", None)])
                .or_else([TxnOp::get("n", None), TxnOp::put("n2", "inner-else", None)]);
            let txn = Txn::new()
                .when([Compare::version("n", Equal, 0)])
                .and_then([
                    TxnOp::put("n", "outer", None),
                    TxnOp::txn(inner),
                    TxnOp::get("n", prefix()),
                ]);
            r.record("nested txn after an outer write", c.txn(txn).await);
            record_everything(c, r, "after nested txn").await;

            let deepest =
                Txn::new().and_then([TxnOp::put("deep", "3", None), TxnOp::get("d", prefix())]);
            let middle = Txn::new()
                .when([Compare::value("n", Equal, "nope")])
                .and_then([TxnOp::put("never", "x", None)])
                .or_else([TxnOp::put("d2", "2", None), TxnOp::txn(deepest)]);
            let txn = Txn::new()
                .when([Compare::version("n", Greater, 5)])
                .and_then([TxnOp::put("never", "x", None)])
                .or_else([
                    TxnOp::put("d1", "1", None),
                    TxnOp::txn(middle),
                    TxnOp::get("d", prefix()),
                ]);
            r.record(
                "three levels of nesting in failure branches",
                c.txn(txn).await,
            );

            let txn =
                Txn::new().and_then([TxnOp::txn(Txn::new().and_then([TxnOp::get("n", None)]))]);
            r.record("read-only nested txn", c.txn(txn).await);

            // Reads at a revision and with options inside a txn.
            let txn = Txn::new().and_then([
                TxnOp::get("x", at_revision(2)),
                TxnOp::get("a", at_revision(4)),
                TxnOp::get("", Some(GetOptions::new().with_all_keys().with_limit(2))),
                TxnOp::get(
                    "",
                    Some(
                        GetOptions::new()
                            .with_all_keys()
                            .with_sort(SortTarget::Mod, SortOrder::Descend)
                            .with_limit(3),
                    ),
                ),
                TxnOp::get(
                    "",
                    Some(GetOptions::new().with_all_keys().with_min_mod_revision(6)),
                ),
            ]);
            r.record("txn reads with options", c.txn(txn).await);

            let txn = Txn::new().and_then([
                TxnOp::put("m1", "1", None),
                TxnOp::put("m2", "2", None),
                TxnOp::put("m3", "3", None),
                TxnOp::delete("m1", None),
            ]);
            r.record("txn put and delete same key (refused)", c.txn(txn).await);
            let txn = Txn::new().and_then([
                TxnOp::put("m1", "1", None),
                TxnOp::put("m2", "2", None),
                TxnOp::put("m3", "3", None),
            ]);
            r.record("txn three puts: one revision", c.txn(txn).await);
            r.record("m keys share a mod_revision", c.get("m", prefix()).await);
            record_everything(c, r, "end").await;
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_duplicate_keys_and_op_limits() {
    differential("txn_duplicate_keys_and_op_limits", |c, r| {
        Box::pin(async move {
            r.record("put k", c.put("k", "0", None).await);
            let put = |key: &str| TxnOp::put(key, "v", None);
            let del = |key: &str| TxnOp::delete(key, None);
            let del_range = |key: &str, end: &str| {
                TxnOp::delete(key, Some(DeleteOptions::new().with_range(end)))
            };
            let then = |ops: Vec<TxnOp>| TxnOp::txn(Txn::new().and_then(ops));
            let then_else = |ops: Vec<TxnOp>, else_ops: Vec<TxnOp>| {
                TxnOp::txn(Txn::new().and_then(ops).or_else(else_ops))
            };

            let cases: Vec<(&str, Txn)> = vec![
                ("put k, put k", Txn::new().and_then([put("k"), put("k")])),
                ("put k, delete k", Txn::new().and_then([put("k"), del("k")])),
                ("delete k, put k", Txn::new().and_then([del("k"), put("k")])),
                (
                    "delete [a, z), put k",
                    Txn::new().and_then([del_range("a", "z"), put("k")]),
                ),
                (
                    "delete prefix k, put k1",
                    Txn::new().and_then([
                        TxnOp::delete("k", Some(DeleteOptions::new().with_prefix())),
                        put("k1"),
                    ]),
                ),
                (
                    "delete k, put k1 (no overlap)",
                    Txn::new().and_then([del("k"), put("k1")]),
                ),
                (
                    "delete k, delete [a, z) (deletes may overlap)",
                    Txn::new().and_then([del("k"), del_range("a", "z")]),
                ),
                (
                    "put k, nested put k",
                    Txn::new().and_then([put("k"), then(vec![put("k")])]),
                ),
                (
                    "nested put k, put k",
                    Txn::new().and_then([then(vec![put("k")]), put("k")]),
                ),
                (
                    "two nested txns put k",
                    Txn::new().and_then([then(vec![put("k")]), then(vec![put("k")])]),
                ),
                (
                    "nested then put k, nested else put k (exclusive)",
                    Txn::new().and_then([then_else(vec![put("k")], vec![put("k")])]),
                ),
                (
                    "delete k, nested put k",
                    Txn::new().and_then([del("k"), then(vec![put("k")])]),
                ),
                (
                    "nested delete k, put k",
                    Txn::new().and_then([then(vec![del("k")]), put("k")]),
                ),
                (
                    "nested delete [a, z), nested put k",
                    Txn::new().and_then([then(vec![del_range("a", "z")]), then(vec![put("k")])]),
                ),
                (
                    "put k in success and in failure (exclusive)",
                    Txn::new().and_then([put("k")]).or_else([put("k")]),
                ),
                (
                    "failure branch: put k, put k",
                    Txn::new()
                        .when([Compare::version("k", Equal, 0)])
                        .or_else([put("k"), put("k")]),
                ),
                (
                    "duplicate in the branch not taken",
                    Txn::new()
                        .when([Compare::version("k", Equal, 1)])
                        .and_then([put("k2")])
                        .or_else([put("k"), put("k")]),
                ),
                (
                    "get k, get k, put k (reads do not conflict)",
                    Txn::new().and_then([TxnOp::get("k", None), TxnOp::get("k", None), put("k")]),
                ),
            ];
            for (label, txn) in cases {
                r.record(format!("txn {label}"), c.txn(txn).await);
            }

            // At most 128 ops per list (compares, success, failure), nested lists included.
            let puts = |n: usize| {
                (0..n)
                    .map(|i| TxnOp::put(format!("many/{i:03}"), "v", None))
                    .collect::<Vec<_>>()
            };
            let gets = |n: usize| {
                (0..n)
                    .map(|i| TxnOp::get(format!("many/{i:03}"), None))
                    .collect::<Vec<_>>()
            };
            let compares = |n: usize| {
                (0..n)
                    .map(|i| Compare::version(format!("many/{i:03}"), Equal, 0))
                    .collect::<Vec<_>>()
            };
            r.record("128 puts", c.txn(Txn::new().and_then(puts(128))).await);
            r.record("129 puts", c.txn(Txn::new().and_then(puts(129))).await);
            r.record("129 gets", c.txn(Txn::new().and_then(gets(129))).await);
            r.record(
                "128 compares",
                c.txn(Txn::new().when(compares(128)).and_then(gets(1)))
                    .await,
            );
            r.record(
                "129 compares",
                c.txn(Txn::new().when(compares(129)).and_then(gets(1)))
                    .await,
            );
            r.record(
                "129 failure ops",
                c.txn(Txn::new().and_then(gets(1)).or_else(gets(129))).await,
            );
            r.record(
                "nested txn with 129 ops",
                c.txn(Txn::new().and_then([TxnOp::txn(Txn::new().and_then(gets(129)))]))
                    .await,
            );

            // Invalid ops inside a txn.
            r.record(
                "txn put with empty key",
                c.txn(Txn::new().and_then([put("")])).await,
            );
            r.record(
                "txn get with empty key",
                c.txn(Txn::new().and_then([TxnOp::get("", None)])).await,
            );
            r.record(
                "txn delete with empty key",
                c.txn(Txn::new().and_then([del("")])).await,
            );
            r.record(
                "txn nested put with empty key",
                c.txn(Txn::new().and_then([then(vec![put("")])])).await,
            );
            r.record(
                "txn put with an unknown lease",
                c.txn(Txn::new().and_then([TxnOp::put(
                    "k",
                    "v",
                    Some(PutOptions::new().with_lease(7_777)),
                )]))
                .await,
            );
            r.record(
                "txn put ignore_value on a missing key",
                c.txn(Txn::new().and_then([TxnOp::put(
                    "missing",
                    "",
                    Some(PutOptions::new().with_ignore_value()),
                )]))
                .await,
            );
            r.record(
                "txn put ignore_value with a value",
                c.txn(Txn::new().and_then([TxnOp::put(
                    "k",
                    "v",
                    Some(PutOptions::new().with_ignore_value()),
                )]))
                .await,
            );
            r.record(
                "txn put ignore_value on an existing key",
                c.txn(Txn::new().and_then([TxnOp::put(
                    "k",
                    "",
                    Some(PutOptions::new().with_ignore_value().with_prev_key()),
                )]))
                .await,
            );
            r.record(
                "txn get at a future revision",
                c.txn(Txn::new().and_then([TxnOp::get("k", at_revision(1_000))]))
                    .await,
            );
            record_everything(c, r, "end").await;
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_and_revision_bounds() {
    differential("compaction_and_revision_bounds", |c, r| {
        Box::pin(async move {
            for i in 1..=5 {
                r.record(
                    format!("put c=v{i}"),
                    c.put("c", format!("v{i}"), None).await,
                ); // 2..=6
            }
            r.record("put d", c.put("d", "d", None).await); // 7
            r.record("delete d", c.delete("d", None).await); // 8

            r.record("get at a future revision", c.get("c", at_revision(9)).await);
            r.record(
                "get at the current revision",
                c.get("c", at_revision(8)).await,
            );
            r.record("compact a future revision", c.compact(9, None).await);
            r.record("compact 4", c.compact(4, None).await);
            record_everything(c, r, "compaction does not make a revision").await;
            r.record("get at 3 (compacted)", c.get("c", at_revision(3)).await);
            r.record("get at 1 (compacted)", c.get("c", at_revision(1)).await);
            r.record(
                "get at 4 (the compaction revision)",
                c.get("c", at_revision(4)).await,
            );
            r.record("get at 5", c.get("c", at_revision(5)).await);
            r.record("get latest", c.get("c", None).await);
            r.record(
                "all keys at 4",
                c.get("", Some(GetOptions::new().with_all_keys().with_revision(4)))
                    .await,
            );
            r.record(
                "count_only at 3 (compacted)",
                c.get(
                    "c",
                    Some(GetOptions::new().with_revision(3).with_count_only()),
                )
                .await,
            );
            r.record(
                "txn get at 3 (compacted)",
                c.txn(Txn::new().and_then([TxnOp::get("c", at_revision(3))]))
                    .await,
            );
            r.record(
                "txn get at 4",
                c.txn(Txn::new().and_then([TxnOp::get("c", at_revision(4))]))
                    .await,
            );
            r.record("compact 4 again", c.compact(4, None).await);
            r.record("compact 3 (below)", c.compact(3, None).await);
            r.record("compact 0", c.compact(0, None).await);
            r.record(
                "compare mod(c) = 6 after compaction",
                c.txn(Txn::new().when([Compare::mod_revision("c", Equal, 6)]))
                    .await,
            );

            r.record("get d at 7", c.get("d", at_revision(7)).await);
            r.record("compact 8 (current)", c.compact(8, None).await);
            r.record("get d at 7 (compacted)", c.get("d", at_revision(7)).await);
            r.record("get d at 8", c.get("d", at_revision(8)).await);
            r.record(
                "all keys at 8",
                c.get("", Some(GetOptions::new().with_all_keys().with_revision(8)))
                    .await,
            );

            // The key's history survives compaction: create_revision and version go on.
            r.record("put c=v6", c.put("c", "v6", prev_kv()).await); // 9
            r.record(
                "get c: version 6, create_revision 2",
                c.get("c", None).await,
            );
            r.record(
                "put d again: a new generation",
                c.put("d", "d2", None).await,
            ); // 10
            r.record("get d", c.get("d", None).await);
            r.record(
                "get at 10",
                c.get(
                    "",
                    Some(GetOptions::new().with_all_keys().with_revision(10)),
                )
                .await,
            );
            r.record(
                "get at 11 (future)",
                c.get(
                    "",
                    Some(GetOptions::new().with_all_keys().with_revision(11)),
                )
                .await,
            );
            r.record(
                "compact 10 physical",
                c.compact(
                    10,
                    Some(etcd_client::CompactionOptions::new().with_physical()),
                )
                .await,
            );
            r.record("get at 9 (compacted)", c.get("c", at_revision(9)).await);
            record_everything(c, r, "end").await;
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_validation_errors() {
    differential("request_validation_errors", |c, r| {
        Box::pin(async move {
            r.record("put k", c.put("k", "v", None).await); // 2

            r.record("put with empty key", c.put("", "v", None).await);
            r.record("get with empty key", c.get("", None).await);
            r.record(
                "get with empty key and a range end",
                c.get("", Some(GetOptions::new().with_range("z"))).await,
            );
            r.record("delete with empty key", c.delete("", None).await);
            r.record(
                "put ignore_value on a missing key",
                c.put("missing", "", Some(PutOptions::new().with_ignore_value()))
                    .await,
            );
            r.record(
                "put ignore_value with a value",
                c.put("k", "v2", Some(PutOptions::new().with_ignore_value()))
                    .await,
            );
            r.record(
                "put ignore_lease on a missing key",
                c.put("missing", "v", Some(PutOptions::new().with_ignore_lease()))
                    .await,
            );
            r.record(
                "put ignore_lease with a lease",
                c.put(
                    "k",
                    "v",
                    Some(PutOptions::new().with_ignore_lease().with_lease(5)),
                )
                .await,
            );
            // Leasehold has no leases yet; etcd answers the same for a lease that does not exist.
            r.record(
                "put with an unknown lease",
                c.put("k", "v", Some(PutOptions::new().with_lease(123_456)))
                    .await,
            );
            r.record(
                "get at a negative revision",
                c.get("k", at_revision(-1)).await,
            );

            // etcd takes requests up to 1.5 MiB; gRPC messages over 2 MiB are refused by the
            // transport (whose message text is the gRPC library's own, so only the code counts).
            const MIB: usize = 1024 * 1024;
            r.record_code_only(
                "put a 2 MiB value",
                c.put("big", vec![b'x'; 2 * MIB], None).await,
            );
            r.record(
                "put a 1.75 MiB value",
                c.put("big", vec![b'x'; MIB * 7 / 4], None).await,
            );
            r.record(
                "txn put a 1.75 MiB value",
                c.txn(Txn::new().and_then([TxnOp::put("big", vec![b'y'; MIB * 7 / 4], None)]))
                    .await,
            );
            r.record(
                "put a 1.4 MiB value",
                c.put("big", vec![b'z'; MIB * 14 / 10], None).await,
            );
            r.record("get the 1.4 MiB value", c.get("big", None).await);
            r.record(
                "put a 1.4 MiB key",
                c.put(vec![b'k'; MIB * 14 / 10], "v", None).await,
            );
            r.record(
                "count all keys",
                c.get(
                    "",
                    Some(GetOptions::new().with_all_keys().with_count_only()),
                )
                .await,
            );
            r.record(
                "all keys, keys_only",
                c.get("", Some(GetOptions::new().with_all_keys().with_keys_only()))
                    .await,
            );
        })
    })
    .await;
}
