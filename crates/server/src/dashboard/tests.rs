//! The dashboard's summary, on a store and lease table built by hand: pagination, the deadline
//! histogram, the queue discovery rule, the recent-ends ring and the query parser.

use std::collections::BTreeSet;

use leasehold_mvcc::{PutRequest, Store};
use leasehold_raft::{LeaseId, LeaseTable};

use super::view::*;

fn id(n: i64) -> LeaseId {
    LeaseId::from_wire(n).unwrap()
}

/// A store and lease table kept in step, as the state machine keeps them.
#[derive(Default)]
struct State {
    store: Store,
    leases: LeaseTable,
}

impl State {
    fn grant(&mut self, lease: i64, ttl_secs: i64, now_ms: u64) {
        self.leases.grant(id(lease), ttl_secs, now_ms).unwrap();
    }

    fn put(&mut self, key: &str, value: &str, lease: Option<i64>) {
        let leases = &self.leases;
        let req = PutRequest {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            lease: lease.map(id),
            ..PutRequest::default()
        };
        let (_, changes) = self.store.put(&req, &|l| leases.contains(l)).unwrap();
        leasehold_raft::rebind(&self.store, &mut self.leases, &changes);
    }

    fn names(&self, keys_per_step: usize) -> (BTreeSet<Vec<u8>>, usize) {
        let mut names = BTreeSet::new();
        let mut cursor = None;
        let mut steps = 0;
        loop {
            steps += 1;
            assert!(steps < 10_000, "the walk ends");
            match scan_queue_names(&self.leases, cursor, keys_per_step, &mut names) {
                Some(next) => cursor = Some(next),
                None => return (names, steps),
            }
        }
    }
}

fn text(names: &BTreeSet<Vec<u8>>) -> Vec<String> {
    names
        .iter()
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect()
}

#[test]
fn the_first_page_is_the_soonest_deadlines_and_offsets_walk_on() {
    let mut s = State::default();
    // Leases 1..=450 with deadlines in reverse id order: lease 450 is due first.
    for n in 1..=450 {
        s.grant(n, 1_000 - n, 0);
    }
    let page = lease_page(&s.leases, &Query::default());
    assert_eq!(page.total, 450);
    assert_eq!(page.rows.len(), PAGE_LEN_DEFAULT);
    assert_eq!(page.rows[0].id, id(450));
    assert!(
        page.rows
            .windows(2)
            .all(|w| w[0].deadline_ms <= w[1].deadline_ms)
    );
    let query = Query::parse(Some("offset=400&limit=100")).unwrap();
    let page = lease_page(&s.leases, &query);
    assert_eq!(page.rows.len(), 50, "the last page is short");
    assert_eq!(page.rows[0].id, id(50));
    assert_eq!(page.rows.last().unwrap().id, id(1));
    let beyond = lease_page(&s.leases, &Query::parse(Some("offset=5000")).unwrap());
    assert!(beyond.rows.is_empty());
    assert_eq!(beyond.total, 450);
}

#[test]
fn a_search_finds_one_lease_by_its_hex_id_with_its_first_keys() {
    let mut s = State::default();
    s.grant(0x694d_77aa_9e38_260f, 60, 0);
    s.grant(7, 60, 0);
    for k in 0..8 {
        s.put(&format!("svc/{k}"), "", Some(0x694d_77aa_9e38_260f));
    }
    let query = Query::parse(Some("lease=694d77aa9e38260f")).unwrap();
    let page = lease_page(&s.leases, &query);
    assert_eq!(page.total, 1);
    let row = &page.rows[0];
    assert_eq!(lease_hex(row.id), "694d77aa9e38260f");
    assert_eq!(row.keys_len, 8);
    assert_eq!(row.keys.len(), LEASE_KEYS_SHOWN_MAX);
    assert_eq!(row.keys[0], b"svc/0");
    let missing = lease_page(&s.leases, &Query::parse(Some("lease=0x99")).unwrap());
    assert_eq!((missing.total, missing.rows.len()), (0, 0));
    assert_eq!(lease_hex(id(7)), "0000000000000007", "etcdctl's %016x");
    assert_eq!(
        lease_hex(id(-2)),
        "-000000000000002",
        "the sign counts in the width"
    );
}

#[test]
fn the_histogram_counts_each_second_of_the_next_minute() {
    let mut s = State::default();
    let now_ms = 100_000;
    // Granted at different lease times so the deadlines fall where wanted.
    s.grant(1, 2, now_ms - 5_000); // overdue by 3 s
    s.grant(2, 1, now_ms - 1_000); // due exactly now: overdue
    s.grant(3, 1, now_ms); // +1 s: bucket 1
    s.grant(4, 1, now_ms - 500); // +0.5 s: bucket 0
    s.grant(5, 60, now_ms - 1); // +59.999 s: bucket 59
    s.grant(6, 60, now_ms); // +60 s: later
    s.grant(7, 3_600, now_ms); // later
    s.leases.advance(now_ms);
    let h = histogram(&s.leases, now_ms);
    assert_eq!(h.overdue, 2);
    assert_eq!(h.buckets[0], 1);
    assert_eq!(h.buckets[1], 1);
    assert_eq!(h.buckets[59], 1);
    assert_eq!(h.buckets.iter().sum::<usize>(), 3);
    assert_eq!(h.later, 2);
    assert_eq!(h.buckets.len(), HISTOGRAM_BUCKETS_LEN);
}

#[test]
fn queue_keys_are_keys_whose_last_segment_is_their_own_leases_hex_id() {
    // (key, lease) → the queue name it stands for.
    let check = |key: &str, lease: i64, expect: Option<&str>| {
        let name = queue_name(key.as_bytes(), id(lease)).map(|n| String::from_utf8_lossy(n));
        assert_eq!(name.as_deref(), expect, "{key} on lease {lease:x}");
    };
    check("jobs/3e9", 0x3e9, Some("jobs"));
    check(
        "/a/b/lock/694d77aa9e38260f",
        0x694d_77aa_9e38_260f,
        Some("/a/b/lock"),
    );
    check("jobs/3e9", 0x3ea, None); // another lease's id
    check("jobs/03e9", 0x3e9, None); // %x has no padding
    check("jobs/3E9", 0x3e9, None); // lowercase only
    check("jobs3e9", 0x3e9, None); // no separator
    check("/3e9", 0x3e9, None); // no name
    check("3e9", 0x3e9, None);
    check("neg/-5", -5, Some("neg")); // Go's %x of a negative int64
}

#[test]
fn locks_and_elections_are_found_and_read_in_create_revision_order() {
    let mut s = State::default();
    for lease in [0xa, 0xb, 0xc, 0xd, 0xe] {
        s.grant(lease, 60, 0);
    }
    // Lock "jobs": b queued first, then a.
    s.put("jobs/b", "", Some(0xb));
    s.put("jobs/a", "", Some(0xa));
    // Election "leader": d leads with a value, c waits.
    s.put("leader/d", "10.0.0.7:2379", Some(0xd));
    s.put("leader/c", "10.0.0.8:2379", Some(0xc));
    // Not queue keys: another lease's suffix, no lease, and a plain leased key.
    s.put("other/b", "", Some(0xe));
    s.put("free/a", "", None);
    s.put("session/e", "x", Some(0xe));
    let (names, _) = s.names(1_000);
    assert_eq!(text(&names), vec!["jobs", "leader", "session"]);

    let jobs = queue(&s.store, b"jobs").unwrap();
    assert!(!jobs.is_election());
    assert_eq!(jobs.holder.key, b"jobs/b");
    assert_eq!(jobs.holder.lease, Some(id(0xb)));
    assert_eq!(jobs.waiters.len(), 1);
    assert_eq!(jobs.waiters[0].key, b"jobs/a");
    assert!(jobs.holder.create_revision < jobs.waiters[0].create_revision);
    assert_eq!(jobs.waiters_len, 1);

    let leader = queue(&s.store, b"leader").unwrap();
    assert!(leader.is_election());
    assert_eq!(leader.holder.value, b"10.0.0.7:2379");
    assert_eq!(leader.holder.value_len, 13);

    // A queue whose keys are gone since its name was found is skipped.
    assert!(queue(&s.store, b"nothing").is_none());
}

#[test]
fn the_queue_scan_gives_the_same_names_in_small_steps_as_in_one() {
    let mut s = State::default();
    for lease in 1..=300 {
        s.grant(lease, 60, 0);
        let key = format!("lock-{}/{lease:x}", lease % 7);
        s.put(&key, "", Some(lease));
        s.put(&format!("plain/k{lease}"), "", Some(lease));
    }
    let (whole, steps) = s.names(usize::MAX);
    assert_eq!(steps, 1);
    let (stepped, steps) = s.names(10);
    assert_eq!(stepped, whole);
    assert!(steps >= 60, "600 keys in steps of about 10: {steps}");
    assert_eq!(whole.len(), 7);
}

#[test]
fn the_queue_scan_keeps_the_first_names_and_says_there_are_more() {
    let mut s = State::default();
    let n = i64::try_from(QUEUE_NAMES_MAX).unwrap() + 50;
    for lease in 1..=n {
        s.grant(lease, 60, 0);
        s.put(&format!("q{lease:05}/{lease:x}"), "", Some(lease));
    }
    let (names, _) = s.names(97);
    assert_eq!(names.len(), QUEUE_NAMES_MAX + 1, "one more than shown");
    assert_eq!(text(&names)[0], "q00001");
}

#[test]
fn long_queues_list_the_first_waiters_and_count_the_rest() {
    let mut s = State::default();
    let n = i64::try_from(WAITERS_SHOWN_MAX).unwrap() + 10;
    for lease in 1..=n {
        s.grant(lease, 60, 0);
        s.put(&format!("busy/{lease:x}"), "", Some(lease));
    }
    let busy = queue(&s.store, b"busy").unwrap();
    assert_eq!(busy.holder.lease, Some(id(1)));
    assert_eq!(busy.waiters.len(), WAITERS_SHOWN_MAX);
    assert_eq!(busy.waiters_len, usize::try_from(n).unwrap() - 1);
    assert_eq!(busy.waiters[0].lease, Some(id(2)));
}

#[test]
fn the_summary_keeps_a_bounded_ring_of_recent_ends_and_hides_values_unless_asked() {
    let mut s = State::default();
    for lease in 1..=100 {
        s.grant(lease, 5, 0);
    }
    for lease in 1..=50 {
        s.leases.revoke(id(lease)).unwrap();
    }
    for lease in 51..=100 {
        assert!(s.leases.expire(id(lease), 5_000).is_some());
    }
    s.grant(200, 60, 5_000);
    s.put("vote/c8", "secret-address", Some(200));
    let (revision, leases_len, histogram, first_page, recent) =
        lease_parts(&s.store, &s.leases, 6_000);
    assert_eq!(recent.len(), leasehold_raft::RECENT_ENDS_LEN_MAX, "bounded");
    assert_eq!(recent[0].id, id(100), "newest first");
    let summary = Summary {
        revision,
        now_ms: 6_000,
        at: std::time::Instant::now(),
        leases_len,
        histogram,
        first_page: first_page.clone(),
        queues: vec![queue(&s.store, b"vote").unwrap()],
        queue_names_len: 1,
        queue_names_more: false,
        recent,
        members: serde_json::json!({}),
    };
    let hidden: serde_json::Value =
        serde_json::from_str(&summary.to_json(&first_page, false)).unwrap();
    assert!(!hidden.to_string().contains("secret-address"));
    assert_eq!(
        hidden["elections"][0]["holder"]["value"],
        serde_json::Value::Null
    );
    assert_eq!(hidden["elections"][0]["holder"]["value_bytes"], 14);
    assert_eq!(hidden["recent"][0]["how"], "expired");
    assert!(hidden["recent"][0]["ago_ms"].as_u64().unwrap() >= 1_000);
    assert_eq!(hidden["leases"]["page"]["rows"][0]["id_dec"], "200");
    let shown: serde_json::Value =
        serde_json::from_str(&summary.to_json(&first_page, true)).unwrap();
    assert_eq!(shown["elections"][0]["holder"]["value"], "secret-address");
}

#[test]
fn bad_queries_are_refused_with_a_reason_and_never_panic() {
    let ok = |raw: &str| Query::parse(Some(raw)).unwrap();
    let bad = |raw: &str| Query::parse(Some(raw)).unwrap_err();
    assert_eq!(Query::parse(None).unwrap(), Query::default());
    assert!(Query::default().is_first_page());
    assert!(ok("values=1").values);
    assert!(ok("values").values);
    assert!(!ok("values=0&unknown=zz").values);
    assert_eq!(ok("lease=0x3E9").lease, Some(id(0x3e9)));
    assert_eq!(ok("lease=").lease, None);
    assert_eq!(ok("offset=10&limit=5").offset, 10);
    assert!(!ok("offset=10").is_first_page());
    for raw in [
        "offset=-1",
        "offset=x",
        "offset=99999999999999999999999",
        "limit=0",
        "limit=1001",
        "lease=zz",
        "lease=0",
        "lease=-",
        "lease=0x",
        "lease=10000000000000000",
        "lease=8000000000000000",
        "values=maybe",
    ] {
        assert!(!bad(raw).is_empty(), "{raw}");
    }
    assert_eq!(
        ok("lease=-8000000000000000").lease,
        LeaseId::from_wire(i64::MIN)
    );
    // Odd but harmless input: empty pairs, repeated names (the last wins), no '='.
    assert_eq!(ok("&&limit=3&&limit=4").limit, 4);
    assert_eq!(ok("=&=x&%%").limit, PAGE_LEN_DEFAULT);
}

/// 100,000 leases, one key each: what a view receives stays the size of one page, and each read
/// of the state is short. Prints the times (a debug build's, an upper bound).
#[test]
fn a_hundred_thousand_leases_give_one_bounded_page() {
    use std::time::Instant;
    let mut s = State::default();
    let n = 100_000;
    for lease in 1..=n {
        // Deadlines spread over 100 s: about 60 % fall in the chart's minute.
        s.grant(lease, 1 + lease % 100, 0);
        let key = if lease % 1_000 == 0 {
            format!("locks/l{}/{lease:x}", lease / 1_000)
        } else {
            format!("sessions/s{lease}")
        };
        assert!(s.leases.attach(key.as_bytes().into(), id(lease)));
    }
    let started = Instant::now();
    let (revision, leases_len, histogram, first_page, recent) = lease_parts(&s.store, &s.leases, 0);
    let parts = started.elapsed();
    assert_eq!(leases_len, 100_000);
    assert_eq!(first_page.rows.len(), PAGE_LEN_DEFAULT);
    assert_eq!(
        histogram.buckets.iter().sum::<usize>() + histogram.later + histogram.overdue,
        100_000
    );
    let started = Instant::now();
    let mut longest = std::time::Duration::ZERO;
    let (mut names, mut cursor) = (BTreeSet::new(), None);
    loop {
        let step = Instant::now();
        let next = scan_queue_names(&s.leases, cursor, 4_096, &mut names);
        longest = longest.max(step.elapsed());
        match next {
            Some(after) => cursor = Some(after),
            None => break,
        }
    }
    let scan = started.elapsed();
    assert_eq!(names.len(), 100);
    let summary = Summary {
        revision,
        now_ms: 0,
        at: Instant::now(),
        leases_len,
        histogram,
        first_page: first_page.clone(),
        queues: Vec::new(),
        queue_names_len: names.len(),
        queue_names_more: false,
        recent,
        members: serde_json::json!({}),
    };
    let json = summary.to_json(&first_page, false);
    assert!(json.len() < 64 * 1024, "{} bytes", json.len());
    println!(
        "100,000 leases: page, histogram, ring {parts:?}; queue scan {scan:?} in all, \
         longest step {longest:?}; {} bytes of JSON",
        json.len()
    );
}
