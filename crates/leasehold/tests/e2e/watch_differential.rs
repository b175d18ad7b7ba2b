//! Watch semantics, differentially: every scenario runs against a fresh real etcd and a fresh
//! leasehold, and every watch response (header revision, watch ID, created, canceled,
//! compact_revision, cancel_reason, and each event's type, kv and prev_kv with all fields) must
//! be the same. The intended behaviour is the module doc of `crates/server/src/watch.rs`;
//! lease-related watch semantics are §5 of `/work/shared/reference/lease-spec.md`.
//!
//! Determinism. A watch delivers asynchronously, so the scenarios never race a write against a
//! delivery they record:
//! - history watches are created after the writes they replay (etcd then sends the whole
//!   history in one response whose header is the current revision);
//! - live writes are made one at a time, each waited for, or followed by a *fence* (a write
//!   every watcher of the stream sees, marked by a key ending in `fence` or the value `fence`):
//!   everything read before the fence is everything the watcher was sent, so a duplicate or a
//!   stray event shows in the recording;
//! - on a stream with several watchers, etcd interleaves their responses in map order, so
//!   responses are recorded per watcher (each watcher's own order is deterministic);
//! - the one scenario with concurrent writes records the flattened event sequence and derived
//!   facts, because how etcd groups events while a watcher catches up depends on timing.
//!
//! etcd-client 0.21.1's `Client::watch` returns a `WatchStream` that can add watchers to the
//! same stream (`WatchStream::watch`), cancel one (`WatchStream::cancel(watch_id)`) and request
//! progress; its `WatchResponse` has no accessor for `fragment`, so fragmentation is recorded
//! as the split of events over responses.

use leasehold_testkit as common;
use leasehold_testkit::revision;

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use common::{Record, Recorder, differential, error_json, next_watch_message};
use etcd_client::CompareOp::Equal;
use etcd_client::{
    Client, Compare, DeleteOptions, LeaseGrantOptions, PutOptions, Txn, TxnOp, WatchFilterType,
    WatchOptions, WatchResponse, WatchStream,
};
use serde_json::{Value, json};

/// Messages one fence wait may read before it gives up (every scenario expects far fewer).
const FENCE_MESSAGES_MAX: usize = 2000;
/// How long a scenario waits for a lease to expire and its deletes to arrive.
const EXPIRY_WAIT_MAX: Duration = Duration::from_secs(10);

fn opts() -> WatchOptions {
    WatchOptions::new()
}

/// Opens a stream with one watcher and records its first message (the `created` response).
async fn open(
    c: &mut Client,
    r: &mut Recorder,
    label: &str,
    key: impl Into<Vec<u8>>,
    options: WatchOptions,
) -> WatchStream {
    let mut stream = c
        .watch(key, Some(options))
        .await
        .unwrap_or_else(|e| panic!("{label}: open the watch stream: {e}"));
    r.record_watch(format!("{label}: created"), &mut stream)
        .await;
    stream
}

/// Whether an event is a fence: its key ends with `fence` or its value is `fence`.
fn is_fence(event: &etcd_client::Event) -> bool {
    event
        .kv()
        .is_some_and(|kv| kv.key().ends_with(b"fence") || kv.value() == b"fence")
}

fn has_fence(response: &WatchResponse) -> bool {
    response.events().iter().any(is_fence)
}

/// Reads messages until `done` is true of one (inclusive); returns them and, if it stopped for
/// another reason (time-out, end of stream, error, too many messages), why.
async fn read_until(
    stream: &mut WatchStream,
    mut done: impl FnMut(&WatchResponse) -> bool,
) -> (Vec<WatchResponse>, Option<Value>) {
    let mut responses = Vec::new();
    while responses.len() < FENCE_MESSAGES_MAX {
        match next_watch_message(stream).await {
            Ok(response) => {
                let finished = done(&response);
                responses.push(response);
                if finished {
                    return (responses, None);
                }
            }
            Err(why) => return (responses, Some(why)),
        }
    }
    (
        responses,
        Some(json!(format!("no fence in {FENCE_MESSAGES_MAX} messages"))),
    )
}

fn responses_json(responses: &[WatchResponse]) -> Vec<Value> {
    responses.iter().map(Record::to_json).collect()
}

/// Reads and records every message up to and including the first with a fence event.
async fn record_until_fence(r: &mut Recorder, label: &str, stream: &mut WatchStream) {
    let (responses, stopped) = read_until(stream, has_fence).await;
    r.note(
        label,
        json!({ "responses": responses_json(&responses), "stopped early": stopped }),
    );
}

/// Reads messages until every watcher in `ids` got a fence; records each watcher's messages
/// (and messages for any other ID) separately, in the order they arrived.
async fn record_until_fences_by_watcher(
    r: &mut Recorder,
    label: &str,
    stream: &mut WatchStream,
    ids: &[i64],
) {
    let mut waiting: HashSet<i64> = ids.iter().copied().collect();
    let (responses, stopped) = read_until(stream, |response| {
        if has_fence(response) {
            waiting.remove(&response.watch_id());
        }
        waiting.is_empty()
    })
    .await;
    let mut by_watcher: BTreeMap<i64, Vec<Value>> = BTreeMap::new();
    for response in &responses {
        by_watcher
            .entry(response.watch_id())
            .or_default()
            .push(response.to_json());
    }
    let by_watcher: serde_json::Map<String, Value> = by_watcher
        .into_iter()
        .map(|(id, responses)| (format!("watcher {id}"), Value::Array(responses)))
        .collect();
    r.note(
        label,
        json!({ "by watcher": by_watcher, "stopped early": stopped }),
    );
}

/// History replay from a past revision, then live events: nothing lost and nothing repeated at
/// the seam; a start revision in the future; a start revision with nothing to replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_replay_then_live_events_meet_without_gap_or_duplicate() {
    differential(
        "history_replay_then_live_events_meet_without_gap_or_duplicate",
        |c, r| {
            Box::pin(async move {
                r.record("put h/a=1 (2)", c.put("h/a", "1", None).await);
                r.record("put h/b=1 (3)", c.put("h/b", "1", None).await);
                r.record("put h/a=2 (4)", c.put("h/a", "2", None).await);
                r.record("delete h/b (5)", c.delete("h/b", None).await);
                r.record("put h/c=1 (6)", c.put("h/c", "1", None).await);
                r.record("put other=x (7)", c.put("other", "x", None).await);

                // History: one response with every event in range, header = current revision.
                let mut from2 = open(
                    c,
                    r,
                    "h/ from 2",
                    "h/",
                    opts().with_prefix().with_start_revision(2),
                )
                .await;
                r.record_watch("h/ from 2: history", &mut from2).await;
                let mut from4 = open(
                    c,
                    r,
                    "h/ from 4 prev_kv",
                    "h/",
                    opts().with_prefix().with_start_revision(4).with_prev_key(),
                )
                .await;
                r.record_watch("h/ from 4 prev_kv: history", &mut from4)
                    .await;
                // Revision 7 is current but touches no h/ key: nothing to replay.
                let mut from7 = open(
                    c,
                    r,
                    "h/ from 7",
                    "h/",
                    opts().with_prefix().with_start_revision(7),
                )
                .await;
                // A start revision in the future: revisions 8 and 9 are not sent.
                let mut from10 = open(
                    c,
                    r,
                    "h/ from 10",
                    "h/",
                    opts().with_prefix().with_start_revision(10),
                )
                .await;
                // The whole history, with a key range that is just the prefix.
                let mut all = open(
                    c,
                    r,
                    "all keys from 1",
                    "",
                    opts().with_all_keys().with_start_revision(1),
                )
                .await;
                r.record_watch("all keys from 1: history", &mut all).await;

                // Live, one write at a time: the first live event must be revision 8.
                for (n, rev) in [(1, 8), (2, 9), (3, 10), (4, 11)] {
                    r.record(
                        format!("put h/d={n} ({rev})"),
                        c.put("h/d", n.to_string(), None).await,
                    );
                    r.record_watch(format!("h/ from 2: live {rev}"), &mut from2)
                        .await;
                    r.record_watch(format!("h/ from 4 prev_kv: live {rev}"), &mut from4)
                        .await;
                    r.record_watch(format!("h/ from 7: live {rev}"), &mut from7)
                        .await;
                    r.record_watch(format!("all keys from 1: live {rev}"), &mut all)
                        .await;
                    if rev >= 10 {
                        r.record_watch(format!("h/ from 10: live {rev}"), &mut from10)
                            .await;
                    }
                }
                // A write outside h/, then a fence: the h/ watchers must not see the first.
                r.record("put other=y (12)", c.put("other", "y", None).await);
                r.record("put h/fence (13)", c.put("h/fence", "f", None).await);
                for (label, stream) in [
                    ("h/ from 2: up to the fence", &mut from2),
                    ("h/ from 4 prev_kv: up to the fence", &mut from4),
                    ("h/ from 7: up to the fence", &mut from7),
                    ("h/ from 10: up to the fence", &mut from10),
                    ("all keys from 1: up to the fence", &mut all),
                ] {
                    record_until_fence(r, label, stream).await;
                }

                // A second history watch from 2 now sees the live part as history too.
                let mut again = open(
                    c,
                    r,
                    "h/ from 2 again",
                    "h/",
                    opts().with_prefix().with_start_revision(2),
                )
                .await;
                record_until_fence(r, "h/ from 2 again: history", &mut again).await;
            })
        },
    )
    .await;
}

/// A watcher created from a past revision while another client keeps writing: whatever the
/// grouping (etcd's depends on timing, so only the flattened event sequence and derived facts
/// are recorded), every revision from the start to the fence arrives exactly once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catching_up_while_writes_continue_loses_and_repeats_nothing() {
    differential(
        "catching_up_while_writes_continue_loses_and_repeats_nothing",
        |c, r| {
            Box::pin(async move {
                const WRITES: usize = 300;
                const WATCH_AFTER: usize = 100;
                const KEYS: usize = 16;
                let first = c.put("c/00", "0", None).await.expect("put c/00");
                let first = first.header().expect("header").revision();
                let (started_tx, started_rx) = tokio::sync::oneshot::channel();
                let mut writer = c.clone();
                let writes = tokio::spawn(async move {
                    let mut started_tx = Some(started_tx);
                    for i in 1..WRITES {
                        // 16 keys written over and over: most events have a prev_kv.
                        writer
                            .put(format!("c/{:02}", i % KEYS), i.to_string(), None)
                            .await
                            .expect("put c/i");
                        if i == WATCH_AFTER {
                            let _ = started_tx.take().expect("once").send(());
                        }
                    }
                    writer
                        .put("c/zfence", "f", None)
                        .await
                        .expect("put the fence");
                });
                started_rx.await.expect("the writer got going");
                let mut stream = c
                    .watch(
                        "c/",
                        Some(
                            opts()
                                .with_prefix()
                                .with_start_revision(first)
                                .with_prev_key(),
                        ),
                    )
                    .await
                    .expect("open the watch");
                let (responses, stopped) = read_until(&mut stream, has_fence).await;
                writes.await.expect("writer task");

                let created = responses.first();
                r.note(
                    "first message: created, watch 0, not canceled, header at least start+100",
                    json!(created.map(|m| (
                        m.created(),
                        m.watch_id(),
                        m.canceled(),
                        m.header().map(|h| h.revision()).unwrap_or(0) >= first + WATCH_AFTER as i64
                    ))),
                );
                let events: Vec<(i64, &etcd_client::Event)> = responses
                    .iter()
                    .skip(1)
                    .flat_map(|m| m.events().iter().map(move |e| (m.watch_id(), e)))
                    .collect();
                let flattened: Vec<Value> = events
                    .iter()
                    .map(|(id, e)| {
                        let kv = e.kv();
                        json!([
                            id,
                            format!("{:?}", e.event_type()),
                            kv.map(|kv| common::bytes_json(kv.key())),
                            kv.map(|kv| kv.mod_revision() - first),
                            kv.map(|kv| common::bytes_json(kv.value())),
                            e.prev_kv().is_some(),
                        ])
                    })
                    .collect();
                r.note(
                    "every event, flattened: \
                     [watch id, type, key, mod_revision - start, value, has prev_kv]",
                    Value::Array(flattened),
                );
                let revisions: Vec<i64> = events
                    .iter()
                    .filter_map(|(_, e)| e.kv().map(|kv| kv.mod_revision()))
                    .collect();
                let event_responses = &responses[1.min(responses.len())..];
                let none_empty = event_responses.iter().all(|m| !m.events().is_empty());
                let headers_not_behind = event_responses.iter().all(|m| {
                    let last = m.events().last().and_then(|e| e.kv());
                    let last = last.map_or(0, |kv| kv.mod_revision());
                    m.header().map_or(0, |h| h.revision()) >= last
                });
                r.note(
                    "facts",
                    json!({
                        "stopped early": stopped,
                        "revisions are exactly start..=start+300, each once": revisions
                            == (first..=first + WRITES as i64).collect::<Vec<_>>(),
                        "no event response is empty": none_empty,
                        "every header revision >= its last event": headers_not_behind,
                    }),
                );
            })
        },
    )
    .await;
}

/// Key, prefix, range, from-key, all-keys and empty-range watchers each see exactly their keys,
/// live and in history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_prefix_range_and_from_key_watchers_see_exactly_their_keys() {
    differential(
        "key_prefix_range_and_from_key_watchers_see_exactly_their_keys",
        |c, r| {
            Box::pin(async move {
                // (label, key, options); each watcher on its own stream.
                let watchers: Vec<(&str, Vec<u8>, WatchOptions)> = vec![
                    ("key a", b"a".to_vec(), opts()),
                    ("prefix a", b"a".to_vec(), opts().with_prefix()),
                    ("range [b, d)", b"b".to_vec(), opts().with_range("d")),
                    ("from key c", b"c".to_vec(), opts().with_from_key()),
                    ("all keys", Vec::new(), opts().with_all_keys()),
                    ("prefix \\xff", vec![0xff], opts().with_prefix()),
                    // An empty key without range_end watches the key "\0".
                    ("empty key", Vec::new(), opts()),
                ];
                let mut streams = Vec::new();
                for (label, key, options) in &watchers {
                    let stream =
                        open(c, r, &format!("live {label}"), key.clone(), options.clone()).await;
                    streams.push(stream);
                }
                // Empty ranges (key >= range_end): etcd refuses them. A normal watcher added to
                // the same stream afterwards sees the fence; whatever the refused watcher was
                // sent (nothing, in etcd) shows up before it.
                let mut empty_ranges = Vec::new();
                for (label, key, end) in [("range [d, b)", "d", "b"), ("range [b, b)", "b", "b")] {
                    let mut stream = open(c, r, label, key, opts().with_range(end)).await;
                    stream
                        .watch("", Some(opts().with_all_keys()))
                        .await
                        .expect("add an all-keys watcher");
                    let created = r
                        .record_watch(format!("{label}: all-keys watcher created"), &mut stream)
                        .await;
                    empty_ranges.push((label, stream, created.map_or(-1, |m| m.watch_id())));
                }
                let start = revision(c).await + 1;

                r.record("put a", c.put("a", "1", None).await);
                r.record("put ab", c.put("ab", "1", None).await);
                r.record("put b", c.put("b", "1", None).await);
                r.record("put b/1", c.put("b/1", "1", None).await);
                r.record("put c", c.put("c", "1", None).await);
                r.record("put cz", c.put("cz", "1", None).await);
                r.record("put d", c.put("d", "1", None).await);
                r.record("put \\xff", c.put(vec![0xff], "1", None).await);
                r.record("put \\xff\\x01", c.put(vec![0xff, 0x01], "1", None).await);
                r.record("put \\0", c.put(vec![0x00], "1", None).await);
                r.record(
                    "delete [ab, c): ab, b, b/1 in one revision",
                    c.delete("ab", Some(DeleteOptions::new().with_range("c")))
                        .await,
                );
                r.record("put a again", c.put("a", "2", None).await);
                // The fence: one txn with a fence in every watcher's range.
                r.record(
                    "fence txn",
                    c.txn(Txn::new().and_then([
                        TxnOp::put(vec![0x00], "fence", None),
                        TxnOp::put("a", "fence", None),
                        TxnOp::put("b/fence", "f", None),
                        TxnOp::put(vec![0xff, b'f', b'e', b'n', b'c', b'e'], "f", None),
                    ]))
                    .await,
                );
                for ((label, _, _), stream) in watchers.iter().zip(streams.iter_mut()) {
                    record_until_fence(r, &format!("live {label}: up to the fence"), stream).await;
                }
                // The all-keys watcher's own responses are those of "live all keys" (recorded
                // above); what matters here is that nothing else arrives on the stream.
                for (label, stream, id) in &mut empty_ranges {
                    let id = *id;
                    let (responses, stopped) =
                        read_until(stream, |m| m.watch_id() == id && has_fence(m)).await;
                    let (mine, others): (Vec<_>, Vec<_>) =
                        responses.iter().partition(|m| m.watch_id() == id);
                    r.note(
                        format!("{label}: up to the all-keys watcher's fence"),
                        json!({
                            "responses for the all-keys watcher": mine.len(),
                            "responses for any other watch ID": others
                                .iter()
                                .map(|m| m.to_json())
                                .collect::<Vec<_>>(),
                            "stopped early": stopped,
                        }),
                    );
                }

                // The same ranges from history: one response each, header = current revision.
                for (label, key, options) in &watchers {
                    let label = format!("history {label}");
                    let mut stream = open(
                        c,
                        r,
                        &label,
                        key.clone(),
                        options.clone().with_start_revision(start),
                    )
                    .await;
                    record_until_fence(r, &format!("{label}: up to the fence"), &mut stream).await;
                }
            })
        },
    )
    .await;
}

/// NOPUT, NODELETE and both; prev_kv on puts, deletes, re-creations and leased keys; live and
/// from history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noput_nodelete_filters_and_prev_kv() {
    differential("noput_nodelete_filters_and_prev_kv", |c, r| {
        Box::pin(async move {
            let watchers: Vec<(&str, WatchOptions)> = vec![
                ("plain", opts().with_prefix()),
                ("prev_kv", opts().with_prefix().with_prev_key()),
                (
                    "NOPUT",
                    opts().with_prefix().with_filters([WatchFilterType::NoPut]),
                ),
                (
                    "NODELETE",
                    opts()
                        .with_prefix()
                        .with_filters([WatchFilterType::NoDelete]),
                ),
                (
                    "NOPUT prev_kv",
                    opts()
                        .with_prefix()
                        .with_prev_key()
                        .with_filters([WatchFilterType::NoPut]),
                ),
                (
                    "NODELETE prev_kv",
                    opts()
                        .with_prefix()
                        .with_prev_key()
                        .with_filters([WatchFilterType::NoDelete]),
                ),
            ];
            let mut streams = Vec::new();
            for (label, options) in &watchers {
                streams.push(open(c, r, &format!("live {label}"), "f/", options.clone()).await);
            }
            // Both filters: it can never see a fence, so its cancellation is the fence.
            let both = || {
                opts()
                    .with_prefix()
                    .with_prev_key()
                    .with_filters([WatchFilterType::NoPut, WatchFilterType::NoDelete])
            };
            let mut silent = open(c, r, "live NOPUT+NODELETE", "f/", both()).await;
            r.record(
                "grant lease 0x77 TTL 600",
                c.lease_grant(600, Some(LeaseGrantOptions::new().with_id(0x77)))
                    .await,
            );
            let start = revision(c).await + 1;

            r.record(
                "put f/a=1 (a creation: no prev_kv)",
                c.put("f/a", "1", None).await,
            );
            r.record("put f/a=2", c.put("f/a", "2", None).await);
            r.record(
                "put f/b with the lease",
                c.put("f/b", "leased", Some(PutOptions::new().with_lease(0x77)))
                    .await,
            );
            r.record(
                "put f/b=2 ignore_lease",
                c.put("f/b", "2", Some(PutOptions::new().with_ignore_lease()))
                    .await,
            );
            r.record("delete f/a (prev_kv = f/a=2)", c.delete("f/a", None).await);
            r.record(
                "put f/a=3 (re-created: no prev_kv)",
                c.put("f/a", "3", None).await,
            );
            r.record(
                "txn: put f/t, delete f/a (one revision, a put and a delete)",
                c.txn(
                    Txn::new().and_then([TxnOp::put("f/t", "t", None), TxnOp::delete("f/a", None)]),
                )
                .await,
            );
            r.record("put f/empty=\"\"", c.put("f/empty", "", None).await);
            r.record(
                "delete a missing key: no revision, no event",
                c.delete("f/missing", None).await,
            );
            r.record(
                "delete prefix f/: three deletes in one revision (f/b, f/empty, f/t)",
                c.delete("f/", Some(DeleteOptions::new().with_prefix()))
                    .await,
            );
            r.record("put f/fence", c.put("f/fence", "f", None).await);
            r.record("delete f/fence", c.delete("f/fence", None).await);
            for ((label, _), stream) in watchers.iter().zip(streams.iter_mut()) {
                record_until_fence(r, &format!("live {label}: up to the fence"), stream).await;
            }
            silent.cancel(0).await.expect("send cancel");
            r.record_watch(
                "live NOPUT+NODELETE: next message is the cancel",
                &mut silent,
            )
            .await;

            for (label, options) in &watchers {
                let label = format!("history {label}");
                let mut stream = open(
                    c,
                    r,
                    &label,
                    "f/",
                    options.clone().with_start_revision(start),
                )
                .await;
                record_until_fence(r, &format!("{label}: up to the fence"), &mut stream).await;
            }
            let mut silent = open(
                c,
                r,
                "history NOPUT+NODELETE",
                "f/",
                both().with_start_revision(start),
            )
            .await;
            silent.cancel(0).await.expect("send cancel");
            r.record_watch(
                "history NOPUT+NODELETE: next message is the cancel",
                &mut silent,
            )
            .await;
        })
    })
    .await;
}

/// A txn's writes are one revision: one response, events in operation order (sub-revision),
/// including nested txns and multi-key deletes; no event for a read-only or failed-compare txn
/// without writes. A history response above the message size limit is split into fragments
/// only when the watcher asked for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_events_are_grouped_per_revision_in_operation_order() {
    differential(
        "txn_events_are_grouped_per_revision_in_operation_order",
        |c, r| {
            Box::pin(async move {
                r.record("put t/c=0", c.put("t/c", "0", None).await);
                r.record("put t/x=0", c.put("t/x", "0", None).await);
                let start = revision(c).await + 1;
                let mut live = open(
                    c,
                    r,
                    "t/ prev_kv",
                    "t/",
                    opts().with_prefix().with_prev_key(),
                )
                .await;

                r.record(
                    "txn: put t/b, put t/a, delete t/c, put t/d",
                    c.txn(Txn::new().and_then([
                        TxnOp::put("t/b", "1", None),
                        TxnOp::put("t/a", "1", None),
                        TxnOp::delete("t/c", None),
                        TxnOp::put("t/d", "1", None),
                    ]))
                    .await,
                );
                r.record_watch("t/: the txn, one response", &mut live).await;
                r.record(
                    "txn: delete [t/a, t/c) then put t/z",
                    c.txn(Txn::new().and_then([
                        TxnOp::delete("t/a", Some(DeleteOptions::new().with_range("t/c"))),
                        TxnOp::put("t/z", "1", None),
                    ]))
                    .await,
                );
                r.record_watch("t/: delete range + put, one response", &mut live)
                    .await;
                r.record(
                    "nested txn: put t/n1 inside, then t/n2 outside",
                    c.txn(Txn::new().and_then([
                        TxnOp::txn(Txn::new().and_then([TxnOp::put("t/n1", "1", None)])),
                        TxnOp::put("t/n2", "1", None),
                    ]))
                    .await,
                );
                r.record_watch("t/: nested txn, one response", &mut live)
                    .await;
                r.record(
                    "read-only txn: no revision",
                    c.txn(Txn::new().and_then([TxnOp::get("t/", None)])).await,
                );
                r.record(
                    "failed compare, else branch empty: no revision",
                    c.txn(
                        Txn::new()
                            .when([Compare::value("t/x", Equal, "nope")])
                            .and_then([TxnOp::put("t/x", "then", None)]),
                    )
                    .await,
                );
                r.record(
                    "failed compare, else branch writes",
                    c.txn(
                        Txn::new()
                            .when([Compare::value("t/x", Equal, "nope")])
                            .and_then([TxnOp::put("t/x", "then", None)])
                            .or_else([
                                TxnOp::put("t/x", "else", None),
                                TxnOp::put("t/y", "else", None),
                            ]),
                    )
                    .await,
                );
                r.record_watch("t/: else branch, one response", &mut live)
                    .await;
                r.record("put t/fence", c.put("t/fence", "f", None).await);
                record_until_fence(r, "t/: nothing before the fence", &mut live).await;

                let mut history = open(
                    c,
                    r,
                    "t/ from the first txn, prev_kv",
                    "t/",
                    opts()
                        .with_prefix()
                        .with_prev_key()
                        .with_start_revision(start),
                )
                .await;
                record_until_fence(r, "history: every revision in one response", &mut history)
                    .await;

                // Three 1 MiB values: together above the 1.5 MiB request limit.
                let big = vec![b'v'; 1024 * 1024];
                let big_start = revision(c).await + 1;
                for n in 1..=3 {
                    r.record(
                        format!("put big/{n} (1 MiB)"),
                        c.put(format!("big/{n}"), big.clone(), None).await,
                    );
                }
                r.record("put big/fence", c.put("big/fence", "f", None).await);
                let mut whole = open(
                    c,
                    r,
                    "big/ from history",
                    "big/",
                    opts().with_prefix().with_start_revision(big_start),
                )
                .await;
                record_until_fence(r, "big/ from history: one response", &mut whole).await;
                let mut fragmented = open(
                    c,
                    r,
                    "big/ from history, fragment",
                    "big/",
                    opts()
                        .with_prefix()
                        .with_start_revision(big_start)
                        .with_fragment(),
                )
                .await;
                record_until_fence(
                    r,
                    "big/ from history, fragment: split between events",
                    &mut fragmented,
                )
                .await;
            })
        },
    )
    .await;
}

/// A start revision below the compaction point: created, then canceled with the compaction
/// revision; at the compaction point: replayed (prev_kv of an event at the compaction revision
/// itself is compacted away). Other watchers of the stream carry on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compacted_start_revision_is_canceled_with_the_compact_revision() {
    differential(
        "compacted_start_revision_is_canceled_with_the_compact_revision",
        |c, r| {
            Box::pin(async move {
                for n in 1..=6 {
                    r.record(
                        format!("put k={n} ({})", n + 1),
                        c.put("k", n.to_string(), None).await,
                    );
                }
                r.record("compact 5", c.compact(5, None).await);

                let mut below = open(c, r, "k from 3", "k", opts().with_start_revision(3)).await;
                r.record_watch("k from 3: canceled", &mut below).await;
                // The stream is still usable: a live watcher on it works.
                below.watch("k", None).await.expect("add a live watcher");
                r.record_watch("k from 3 stream: live watcher created", &mut below)
                    .await;

                let mut one_below =
                    open(c, r, "k from 4", "k", opts().with_start_revision(4)).await;
                r.record_watch("k from 4: canceled", &mut one_below).await;

                let mut at = open(
                    c,
                    r,
                    "k from 5 prev_kv",
                    "k",
                    opts().with_start_revision(5).with_prev_key(),
                )
                .await;
                r.record_watch("k from 5 prev_kv: history", &mut at).await;

                // A second watcher on a live stream, below the compaction point.
                let mut shared = open(c, r, "shared: live k", "k", opts()).await;
                shared
                    .watch("k", Some(opts().with_start_revision(2)))
                    .await
                    .expect("add a compacted watcher");
                r.record_watch("shared: watcher from 2 created", &mut shared)
                    .await;
                r.record_watch("shared: watcher from 2 canceled", &mut shared)
                    .await;

                r.record("put k=7 (8)", c.put("k", "7", None).await);
                r.record_watch("k from 3 stream: live 8", &mut below).await;
                r.record_watch("k from 5 prev_kv: live 8", &mut at).await;
                r.record_watch("shared: live 8 for watcher 0 only", &mut shared)
                    .await;

                // Compact at the current revision; a watch from it replays that revision.
                r.record("compact 8", c.compact(8, None).await);
                let mut at_current = open(
                    c,
                    r,
                    "k from 8 prev_kv",
                    "k",
                    opts().with_start_revision(8).with_prev_key(),
                )
                .await;
                r.record_watch("k from 8 prev_kv: history", &mut at_current)
                    .await;
                let mut old = open(c, r, "k from 7", "k", opts().with_start_revision(7)).await;
                r.record_watch("k from 7: canceled", &mut old).await;
                let mut future =
                    open(c, r, "k from 100", "k", opts().with_start_revision(100)).await;
                future.cancel(0).await.expect("send cancel");
                r.record_watch("k from 100: nothing before its cancel", &mut future)
                    .await;
            })
        },
    )
    .await;
}

/// Several watchers on one stream (auto and chosen IDs, a duplicate ID), each seeing its own
/// range; cancel (and cancel of unknown or already canceled IDs); progress requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_watchers_on_one_stream_cancel_and_progress() {
    differential(
        "several_watchers_on_one_stream_cancel_and_progress",
        |c, r| {
            Box::pin(async move {
                r.record("put m/a=0", c.put("m/a", "0", None).await);
                let mut s = open(
                    c,
                    r,
                    "watcher 3 (chosen): m/a",
                    "m/a",
                    opts().with_watch_id(3),
                )
                .await;
                // Auto IDs skip the chosen 3.
                let adds: Vec<(&str, &str, WatchOptions)> = vec![
                    ("auto: m/ prefix", "m/", opts().with_prefix()),
                    ("auto: [m/b, m/d)", "m/b", opts().with_range("m/d")),
                    (
                        "auto: m/ prefix prev_kv",
                        "m/",
                        opts().with_prefix().with_prev_key(),
                    ),
                    ("auto: m/a", "m/a", opts()),
                    (
                        "duplicate chosen 3",
                        "m/",
                        opts().with_prefix().with_watch_id(3),
                    ),
                    (
                        "chosen 10: m/ from 2 (history)",
                        "m/",
                        opts()
                            .with_prefix()
                            .with_watch_id(10)
                            .with_start_revision(2),
                    ),
                ];
                for (label, key, options) in adds {
                    s.watch(key, Some(options)).await.expect("send create");
                    r.record_watch(format!("{label}: created"), &mut s).await;
                }
                r.record_watch("watcher 10: history", &mut s).await;

                r.record("put m/a=1", c.put("m/a", "1", None).await);
                r.record("put m/b=1", c.put("m/b", "1", None).await);
                r.record("put m/c=1", c.put("m/c", "1", None).await);
                r.record("put m/d=1", c.put("m/d", "1", None).await);
                r.record("delete m/a", c.delete("m/a", None).await);
                r.record("put other", c.put("other", "1", None).await);
                let fence = || {
                    Txn::new().and_then([
                        TxnOp::put("m/a", "fence", None),
                        TxnOp::put("m/c", "fence", None),
                    ])
                };
                r.record("fence txn", c.txn(fence()).await);
                let ids = [0, 1, 2, 3, 4, 10];
                record_until_fences_by_watcher(r, "all watchers: up to the fence", &mut s, &ids)
                    .await;

                s.cancel(1).await.expect("send cancel 1");
                r.record_watch("cancel watcher 1", &mut s).await;
                s.cancel(99).await.expect("send cancel 99");
                s.cancel(1).await.expect("send cancel 1 again");
                s.request_progress().await.expect("send progress request");
                r.record_watch(
                    "unknown and repeated cancels answer nothing: progress next",
                    &mut s,
                )
                .await;
                s.watch("m/", Some(opts().with_prefix()))
                    .await
                    .expect("send create");
                r.record_watch("auto ID after a cancel", &mut s).await;

                r.record("put m/b=2", c.put("m/b", "2", None).await);
                r.record("fence txn", c.txn(fence()).await);
                record_until_fences_by_watcher(
                    r,
                    "after the cancel: up to the fence",
                    &mut s,
                    &[0, 2, 3, 4, 5, 10],
                )
                .await;
                for id in [0, 2, 3, 4, 5, 10] {
                    s.cancel(id).await.expect("send cancel");
                    r.record_watch(format!("cancel watcher {id}"), &mut s).await;
                }
                r.record("put m/a=after", c.put("m/a", "after", None).await);
                s.request_progress().await.expect("send progress request");
                r.record_watch("no watcher left: only the progress response", &mut s)
                    .await;
            })
        },
    )
    .await;
}

/// §5.2 of the lease spec: a revoke and an expiry each delete the lease's keys in one revision;
/// a watcher gets one response with one DELETE per key in key order, kv carrying only key and
/// mod_revision, prev_kv the last put with its lease. History replays them the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_revoke_and_expiry_deletes_reach_a_watcher_in_one_response() {
    differential(
        "lease_revoke_and_expiry_deletes_reach_a_watcher_in_one_response",
        |c, r| {
            Box::pin(async move {
                let with_lease = |id: i64| Some(PutOptions::new().with_lease(id));
                r.record(
                    "grant 0x7001 TTL 600",
                    c.lease_grant(600, Some(LeaseGrantOptions::new().with_id(0x7001)))
                        .await,
                );
                let start = revision(c).await + 1;
                for key in ["l/b", "l/c", "l/a"] {
                    r.record(
                        format!("put {key} with the lease"),
                        c.put(key, key, with_lease(0x7001)).await,
                    );
                }
                r.record(
                    "put l/other without a lease",
                    c.put("l/other", "o", None).await,
                );
                let mut live = open(
                    c,
                    r,
                    "l/ prev_kv",
                    "l/",
                    opts().with_prefix().with_prev_key(),
                )
                .await;
                r.record("revoke 0x7001", c.lease_revoke(0x7001).await);
                r.record_watch("l/: the revoke's deletes, one response", &mut live)
                    .await;

                r.record(
                    "grant 0x7002 TTL 2",
                    c.lease_grant(2, Some(LeaseGrantOptions::new().with_id(0x7002)))
                        .await,
                );
                r.record(
                    "put l/x with lease 0x7002",
                    c.put("l/x", "x", with_lease(0x7002)).await,
                );
                r.record(
                    "put l/y with lease 0x7002",
                    c.put("l/y", "y", with_lease(0x7002)).await,
                );
                r.record_watch("l/: put l/x", &mut live).await;
                r.record_watch("l/: put l/y", &mut live).await;
                let granted = Instant::now();
                let expired = tokio::time::timeout(EXPIRY_WAIT_MAX, live.message()).await;
                match expired {
                    Ok(Ok(Some(response))) => {
                        r.note("l/: the expiry's deletes, one response", response.to_json());
                        r.note(
                            "the expiry came no earlier than 1.5 s after the grant",
                            json!(granted.elapsed() >= Duration::from_millis(1500)),
                        );
                    }
                    Ok(Ok(None)) => r.note("l/: the expiry's deletes", json!("stream ended")),
                    Ok(Err(e)) => r.note("l/: the expiry's deletes", error_json(&e)),
                    Err(_) => r.note(
                        "l/: the expiry's deletes",
                        json!(format!("nothing within {EXPIRY_WAIT_MAX:?}")),
                    ),
                }
                r.record("put l/fence", c.put("l/fence", "f", None).await);
                record_until_fence(r, "l/: nothing else before the fence", &mut live).await;

                let mut history = open(
                    c,
                    r,
                    "l/ from the first put, prev_kv",
                    "l/",
                    opts()
                        .with_prefix()
                        .with_prev_key()
                        .with_start_revision(start),
                )
                .await;
                record_until_fence(
                    r,
                    "history: puts, revoke deletes, expiry deletes",
                    &mut history,
                )
                .await;
                let mut deletes_only = open(
                    c,
                    r,
                    "l/ from the first put, NOPUT",
                    "l/",
                    opts()
                        .with_prefix()
                        .with_start_revision(start)
                        .with_filters([WatchFilterType::NoPut]),
                )
                .await;
                r.record_watch("history NOPUT: only the deletes", &mut deletes_only)
                    .await;
            })
        },
    )
    .await;
}

/// A response of a long history, summarised: header revision, number of events, first and last
/// mod_revision relative to `base`.
fn batch_summary(m: &WatchResponse, base: i64) -> Value {
    let revision =
        |e: Option<&etcd_client::Event>| e.and_then(|e| e.kv()).map(|kv| kv.mod_revision() - base);
    json!({
        "created": m.created(),
        "header - base": m.header().map(|h| h.revision() - base),
        "watch_id": m.watch_id(),
        "events": m.events().len(),
        "first - base": revision(m.events().first()),
        "last - base": revision(m.events().last()),
    })
}

/// A watcher catching up over more than 1,000 revisions gets its history in batches, as etcd
/// does (`watchBatchMaxRevs` = 1000: at most 1,000 of *the watcher's* revisions per response,
/// header = current revision). Recorded as one summary per response (the events themselves are
/// plain puts, checked by the other scenarios).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_histories_come_in_batches_of_1000_revisions() {
    differential(
        "long_histories_come_in_batches_of_1000_revisions",
        |c, r| {
            Box::pin(async move {
                const PUTS: i64 = 1200;
                let base = revision(c).await;
                // Every 4th put goes to g/a, the others to g/b: g/a has 300 revisions spread over
                // all 1,200, g/b 900 (the last one at base + 1200).
                for i in 0..PUTS {
                    let key = if i % 4 == 0 { "g/a" } else { "g/b" };
                    c.put(key, i.to_string(), None).await.expect("put");
                }
                r.record("put g/a-fence", c.put("g/a-fence", "f", None).await);
                for (label, key, options) in [
                    ("g/ prefix: 1,201 revisions", "g/", opts().with_prefix()),
                    (
                        "[g/a, g/b): g/a and the fence, 301 revisions",
                        "g/a",
                        opts().with_range("g/b"),
                    ),
                    ("g/b: 900 revisions", "g/b", opts()),
                ] {
                    let mut stream = c
                        .watch(key, Some(options.with_start_revision(base + 1)))
                        .await
                        .expect("open the watch");
                    let created = next_watch_message(&mut stream).await;
                    r.note(
                        format!("{label}: created"),
                        created.map_or_else(|e| e, |m| batch_summary(&m, base)),
                    );
                    // g/b never sees the fence: stop at its last revision instead.
                    let (responses, stopped) = read_until(&mut stream, |m| {
                        has_fence(m)
                            || m.events().last().and_then(|e| e.kv()).is_some_and(|kv| {
                                kv.key() == b"g/b" && kv.mod_revision() == base + PUTS
                            })
                    })
                    .await;
                    let summaries: Vec<Value> =
                        responses.iter().map(|m| batch_summary(m, base)).collect();
                    r.note(
                        format!("{label}: responses"),
                        json!({ "summaries": summaries, "stopped early": stopped }),
                    );
                }
            })
        },
    )
    .await;
}
