//! Watch at scale and across failures, against leasehold only (real etcd under
//! `LEASEHOLD_DIFF_AGAINST_ETCD=1`, which checks the tests themselves):
//! - 10,000 watchers multiplexed on one stream all get created and all get one event;
//! - a watcher that does not read its stream does not slow writers down, and later receives
//!   every event exactly once, in revision order (watch.rs: "a slow client never blocks a
//!   writer and never loses an event");
//! - after a SIGKILL and restart, a client that re-watches from its last revision + 1 gets
//!   exactly the events it missed.
//!
//! etcd-client 0.21.1 multiplexes: `WatchStream::watch` sends another create request on the
//! same gRPC stream, and `WatchStream::split` lets one task send while another reads (needed:
//! the server stops reading requests while its responses are not read).
//!
//! Every wait is bounded: by [`SCALE_WAIT_MAX`] overall, or per message by the harness's
//! `WATCH_MESSAGE_TIMEOUT`.

use leasehold_testkit as common;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use common::{Leasehold, next_watch_message};
use etcd_client::{Client, EventType, WatchOptions, WatchResponse, WatchResponseStream};

/// Bound of each phase of a scale test.
const SCALE_WAIT_MAX: Duration = Duration::from_secs(60);

/// The tests of this binary run one at a time: they are CPU-heavy on a small machine, and the
/// slow-consumer test compares two timings that another test running alongside would skew.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The next message of a split stream, waiting at most until `deadline`.
async fn next_before(
    stream: &mut WatchResponseStream,
    deadline: Instant,
    what: &str,
) -> WatchResponse {
    let left = deadline.saturating_duration_since(Instant::now());
    match tokio::time::timeout(left, stream.message()).await {
        Ok(Ok(Some(response))) => response,
        Ok(Ok(None)) => panic!("{what}: the watch stream ended"),
        Ok(Err(e)) => panic!("{what}: watch stream error: {e}"),
        Err(_) => panic!("{what}: not done within {SCALE_WAIT_MAX:?}"),
    }
}

fn key_of(event: &etcd_client::Event) -> Vec<u8> {
    event.kv().map(|kv| kv.key().to_vec()).unwrap_or_default()
}

/// 10,000 watchers on one stream, all on the prefix `p/`: every one gets its `created`
/// response (distinct IDs, none canceled), then one put reaches each exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_watchers_on_one_stream_each_get_one_event() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    const WATCHERS: usize = 10_000;
    let server = Leasehold::start().await;
    let mut client = server.client().await;
    let prefix = || Some(WatchOptions::new().with_prefix());

    let started = Instant::now();
    let stream = client.watch("p/", prefix()).await.expect("open the stream");
    let (mut requests, mut responses) = stream.split();
    // Sends the other 9,999 creates while this task reads; keeps the request side open.
    let sender = tokio::spawn(async move {
        for _ in 1..WATCHERS {
            requests.watch("p/", prefix()).await.expect("send a create");
        }
        requests
    });

    let deadline = Instant::now() + SCALE_WAIT_MAX;
    let mut ids = HashSet::with_capacity(WATCHERS);
    while ids.len() < WATCHERS {
        let m = next_before(&mut responses, deadline, "10,000 created responses").await;
        assert!(
            m.created() && !m.canceled() && m.events().is_empty(),
            "response {} of the creates is not a plain `created`: {m:?}",
            ids.len()
        );
        assert!(
            ids.insert(m.watch_id()),
            "watch ID {} given twice",
            m.watch_id()
        );
    }
    let _requests = tokio::time::timeout(SCALE_WAIT_MAX, sender)
        .await
        .expect("sender done")
        .expect("sender task");
    let created_in = started.elapsed();

    // One put all of them watch; then a second put as a fence: each watcher must have got the
    // first exactly once before its fence.
    let put_at = Instant::now();
    client.put("p/x", "1", None).await.expect("put p/x");
    client.put("p/fence", "f", None).await.expect("put p/fence");
    let deadline = Instant::now() + SCALE_WAIT_MAX;
    let mut seen: HashMap<i64, Vec<Vec<u8>>> = HashMap::with_capacity(WATCHERS);
    let mut fenced = 0usize;
    while fenced < WATCHERS {
        let m = next_before(
            &mut responses,
            deadline,
            "the put and the fence at every watcher",
        )
        .await;
        assert!(
            ids.contains(&m.watch_id()),
            "events for unknown watch ID: {m:?}"
        );
        assert!(!m.created() && !m.canceled(), "unexpected response: {m:?}");
        let keys = seen.entry(m.watch_id()).or_default();
        for event in m.events() {
            assert_eq!(event.event_type(), EventType::Put);
            let key = key_of(event);
            if key == b"p/fence" {
                fenced += 1;
            }
            keys.push(key);
        }
    }
    let delivered_in = put_at.elapsed();
    for id in &ids {
        assert_eq!(
            seen.get(id).map(Vec::as_slice),
            Some(&[b"p/x".to_vec(), b"p/fence".to_vec()][..]),
            "watcher {id}: expected p/x once, then the fence"
        );
    }
    eprintln!(
        "{WATCHERS} watchers on one stream: created in {created_in:?}, two puts delivered to \
         all in {delivered_in:?}"
    );
}

/// `n` puts of 1 KiB values to `<prefix><i>` from 4 concurrent writers; returns how long they
/// took. Panics if they take longer than [`SCALE_WAIT_MAX`].
async fn timed_puts(client: &Client, prefix: &str, n: usize) -> Duration {
    const WRITERS: usize = 4;
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(WRITERS);
    for w in 0..WRITERS {
        let mut c = client.clone();
        let prefix = prefix.to_string();
        tasks.push(tokio::spawn(async move {
            for i in (w..n).step_by(WRITERS) {
                let value = format!("{i:04}").repeat(256);
                c.put(format!("{prefix}{i:04}"), value, None)
                    .await
                    .expect("put");
            }
        }));
    }
    let all = futures::future::join_all(tasks);
    match tokio::time::timeout(SCALE_WAIT_MAX, all).await {
        Ok(results) => {
            for r in results {
                r.expect("writer task");
            }
        }
        Err(_) => panic!("{n} puts to {prefix} took longer than {SCALE_WAIT_MAX:?}"),
    }
    started.elapsed()
}

/// A watcher that does not read its stream while 5,000 puts (5 MiB of values) go by: the
/// writers are not held up (within [`SCALE_WAIT_MAX`], and at most 3x the time of the same puts
/// with no watcher), and when the watcher finally reads it gets every event exactly once, in
/// revision order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_does_not_read_neither_blocks_writers_nor_loses_events() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    const PUTS: usize = 5_000;
    let server = Leasehold::start().await;
    let mut client = server.client().await;

    let baseline = timed_puts(&client, "base/", PUTS).await;

    let mut idle = client
        .watch("s/", Some(WatchOptions::new().with_prefix()))
        .await
        .expect("open the idle watch");
    let created = next_watch_message(&mut idle).await.expect("created");
    assert!(created.created() && !created.canceled(), "{created:?}");
    let start = created.header().expect("header").revision() + 1;
    // From here on nothing reads `idle` until the puts are done. 5 MiB is far more than the
    // HTTP/2 windows and the server's response queue hold, so the server's sender stalls.
    let with_idle_watcher = timed_puts(&client, "s/", PUTS).await;
    eprintln!(
        "{PUTS} puts: {baseline:?} without a watcher, {with_idle_watcher:?} with a watcher that \
         does not read"
    );
    assert!(
        with_idle_watcher <= baseline * 3,
        "writers were slowed down by a watcher that does not read: {with_idle_watcher:?} vs \
         {baseline:?} without it"
    );
    let end = client
        .get("s/", None)
        .await
        .expect("get")
        .header()
        .expect("header")
        .revision();
    assert_eq!(
        end - start + 1,
        PUTS as i64,
        "the s/ puts were not all the writes"
    );

    // Now read: revisions start..=end, each exactly once, in order, each with its own value.
    let deadline = Instant::now() + SCALE_WAIT_MAX;
    let mut next = start;
    let mut keys = HashSet::with_capacity(PUTS);
    let mut responses = 0usize;
    let (_requests, mut stream) = idle.split();
    while next <= end {
        let m = next_before(&mut stream, deadline, "the idle watcher's backlog").await;
        responses += 1;
        assert!(!m.canceled(), "the slow watcher was canceled: {m:?}");
        for event in m.events() {
            let kv = event.kv().expect("kv");
            assert_eq!(
                kv.mod_revision(),
                next,
                "events out of order, missing or repeated"
            );
            assert_eq!(event.event_type(), EventType::Put);
            let key = String::from_utf8(kv.key().to_vec()).expect("utf-8 key");
            let i = &key["s/".len()..];
            assert_eq!(kv.value(), i.repeat(256).as_bytes(), "value of {key}");
            assert!(keys.insert(key.clone()), "{key} delivered twice");
            next += 1;
        }
    }
    assert_eq!(keys.len(), PUTS);
    // Nothing after the last put: a fence write must be the very next event.
    client
        .put("s/fence", "f", None)
        .await
        .expect("put the fence");
    let deadline = Instant::now() + SCALE_WAIT_MAX;
    let m = next_before(&mut stream, deadline, "the fence").await;
    let fence: Vec<(Vec<u8>, i64)> = m
        .events()
        .iter()
        .map(|e| (key_of(e), e.kv().map_or(0, |kv| kv.mod_revision())))
        .collect();
    assert_eq!(
        fence,
        [(b"s/fence".to_vec(), end + 1)],
        "after the backlog: {m:?}"
    );
    eprintln!("the idle watcher then read {PUTS} events in {responses} responses");
}

/// Puts `key` and returns its revision.
async fn put(client: &mut Client, key: &str) -> i64 {
    client
        .put(key, key, None)
        .await
        .unwrap_or_else(|e| panic!("put {key}: {e}"))
        .header()
        .expect("header")
        .revision()
}

/// The (key, mod_revision) of every event of a response.
fn events_of(m: &WatchResponse) -> Vec<(String, i64)> {
    m.events()
        .iter()
        .map(|e| {
            let kv = e.kv().expect("kv");
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                kv.mod_revision(),
            )
        })
        .collect()
}

/// A client sees r/1..r/5 live; the server is SIGKILLed and restarted on the same ports and
/// data dir; r/6..r/10 are written; the client re-watches from its last revision + 1 and gets
/// exactly r/6..r/10, then live events again, with no gap and no duplicate. History from the
/// start still holds every acknowledged write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewatch_after_a_restart_from_the_last_revision_gets_exactly_the_missed_events() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    let mut server = Leasehold::start().await;
    let mut client = server.client().await;
    let mut watch = client
        .watch("r/", Some(WatchOptions::new().with_prefix()))
        .await
        .expect("open the watch");
    let created = next_watch_message(&mut watch).await.expect("created");
    assert!(created.created(), "{created:?}");

    let mut before = Vec::new();
    let mut last_seen = 0;
    for n in 1..=5 {
        let key = format!("r/{n}");
        let rev = put(&mut client, &key).await;
        before.push((key.clone(), rev));
        let m = next_watch_message(&mut watch).await.expect("live event");
        assert_eq!(events_of(&m), [(key, rev)], "live event {n}");
        last_seen = rev;
    }

    server.restart().await;
    // The old stream ends (with an error or cleanly), it does not go quiet forever.
    match next_watch_message(&mut watch).await {
        Ok(m) => panic!("the old stream delivered after the kill: {m:?}"),
        Err(why) => assert!(
            !why.to_string().contains("no message within"),
            "the old stream did not end after the kill: {why}"
        ),
    }
    drop(watch);
    drop(client);

    let mut client = server.client().await;
    let mut missed = Vec::new();
    for n in 6..=10 {
        let key = format!("r/{n}");
        let rev = put(&mut client, &key).await;
        missed.push((key, rev));
    }
    let mut watch = client
        .watch(
            "r/",
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(last_seen + 1),
            ),
        )
        .await
        .expect("re-watch");
    let created = next_watch_message(&mut watch).await.expect("created");
    assert!(created.created() && !created.canceled(), "{created:?}");
    // History may come in one or more responses; together exactly the missed events.
    let mut replayed = Vec::new();
    while replayed.len() < missed.len() {
        let m = next_watch_message(&mut watch)
            .await
            .expect("replayed events");
        assert!(!m.canceled(), "{m:?}");
        replayed.extend(events_of(&m));
    }
    assert_eq!(replayed, missed, "replay after the restart");
    assert_eq!(
        missed[0].1,
        last_seen + 1,
        "a revision appeared between the last one seen and r/6 (made by the restart?)"
    );

    // Live again: the next write is the next event, nothing repeated before it.
    let rev = put(&mut client, "r/11").await;
    let m = next_watch_message(&mut watch)
        .await
        .expect("live after the replay");
    assert_eq!(events_of(&m), [("r/11".to_string(), rev)]);

    // Every acknowledged write survived the SIGKILL.
    let mut all = client
        .watch(
            "r/",
            Some(WatchOptions::new().with_prefix().with_start_revision(1)),
        )
        .await
        .expect("watch from 1");
    next_watch_message(&mut all).await.expect("created");
    let mut history = Vec::new();
    let expected: Vec<(String, i64)> = before
        .into_iter()
        .chain(missed)
        .chain([("r/11".to_string(), rev)])
        .collect();
    while history.len() < expected.len() {
        let m = next_watch_message(&mut all).await.expect("history");
        history.extend(events_of(&m));
    }
    assert_eq!(
        history, expected,
        "history from revision 1 after the restart"
    );
}

/// etcd#15220: a progress response tells the client "you have every event up to revision R",
/// so it must never come before those events. A watcher that replays 2,500 revisions of history
/// (three delivery passes of at most 1,000 revisions) asks for progress right after its create;
/// the answer must come after the whole replay, and name a revision the client has every event
/// of. Ten streams: the old server answered at once with the current revision whenever it read
/// the request between two passes, which the first stream alone made likely. (etcd 3.4 answers
/// at once too, so this test is against leasehold only.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_progress_response_never_comes_before_the_events_it_covers() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    const PUTS: i64 = 2_500;
    const WRITERS: i64 = 8;
    const STREAMS: usize = 10;
    let server = Leasehold::start().await;
    let client = server.client().await;
    let first = put(&mut client.clone(), "progress/first").await;
    let writers = (0..WRITERS).map(|w| {
        let mut c = client.clone();
        tokio::spawn(async move {
            for i in (w..PUTS - 1).step_by(WRITERS as usize) {
                c.put(format!("progress/{i:05}"), "v", None)
                    .await
                    .expect("put");
            }
        })
    });
    let written = futures::future::join_all(writers);
    for done in tokio::time::timeout(SCALE_WAIT_MAX, written)
        .await
        .expect("the puts finish in time")
    {
        done.expect("writer task");
    }
    // One put per revision, from `first` on: the events up to revision r number r - first + 1.
    let deadline = Instant::now() + SCALE_WAIT_MAX;
    for s in 0..STREAMS {
        let mut c = client.clone();
        let (mut requests, mut stream) = c
            .watch(
                "progress/",
                Some(WatchOptions::new().with_prefix().with_start_revision(first)),
            )
            .await
            .expect("watch")
            .split();
        requests.request_progress().await.expect("progress request");
        let mut received: i64 = 0;
        loop {
            let m = next_before(&mut stream, deadline, "replay").await;
            if m.created() {
                continue;
            }
            if m.watch_id() == -1 && m.events().is_empty() {
                let r = m.header().expect("header").revision();
                assert!(
                    r >= first,
                    "stream {s}: progress at {r}, before the history"
                );
                assert_eq!(
                    received,
                    r - first + 1,
                    "stream {s}: progress says every event up to revision {r}, \
                     but {received} of them have arrived"
                );
                assert_eq!(received, PUTS, "stream {s}: the whole history first");
                break;
            }
            received += m.events().len() as i64;
        }
    }
}
