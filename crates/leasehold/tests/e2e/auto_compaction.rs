//! `--auto-compaction-mode` / `--auto-compaction-retention`, against real etcd: with periodic
//! retention of one second, both servers compact history on their own, and etcdctl's read of an
//! old revision then fails the same way on both. (The schedules' timing is tested with a manual
//! clock in `leasehold_server::compactor`; this only waits, bounded, for a compaction to show.)

use std::time::{Duration, Instant};

use leasehold_testkit as common;

use common::{Etcd, Leasehold, Server, Setup, etcdctl, etcdctl_ok};

/// How long a one-second retention may take to show: a compaction comes one retention after the
/// start and then every retention, to the revision sampled one retention before.
const WAIT_MAX: Duration = Duration::from_secs(20);

fn one_second_retention() -> Setup {
    Setup {
        args: vec![
            "--auto-compaction-mode=periodic".into(),
            "--auto-compaction-retention=1s".into(),
        ],
        ..Setup::default()
    }
}

/// Writes three revisions of `k`, then waits until revision 2 (the first put) is compacted away;
/// returns etcdctl's error for reading it, and what reading the newest value gives.
async fn compacted_read(server: &Server) -> (String, String) {
    let e = server.endpoint();
    for v in ["1", "2", "3"] {
        etcdctl_ok(&e, &["put", "k", v]).await;
    }
    let started = Instant::now();
    loop {
        let old = etcdctl(&e, &["get", "k", "--rev=2"]).await;
        if !old.status.success() {
            // etcdctl's last line (before it, a client log line with times and addresses).
            let stderr = String::from_utf8_lossy(&old.stderr);
            let err = stderr.trim().lines().last().unwrap_or_default().to_owned();
            let now = etcdctl_ok(&e, &["get", "k", "--print-value-only"]).await;
            return (err, String::from_utf8_lossy(&now.stdout).trim().to_owned());
        }
        assert!(
            started.elapsed() < WAIT_MAX,
            "{}: revision 2 still readable {WAIT_MAX:?} after the writes\n{}",
            server.label(),
            server.log_tail()
        );
        // Bounded poll for the compaction to appear; the timing itself is not asserted.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_auto_compaction_matches_etcd() {
    let etcd = Etcd::start_with(one_second_retention()).await;
    let leasehold = Leasehold::start_with(one_second_retention()).await;
    let want = compacted_read(&etcd).await;
    let got = compacted_read(&leasehold).await;
    assert_eq!(got, want, "leasehold vs etcd");
    assert!(
        want.0.contains("required revision has been compacted"),
        "{want:?}"
    );
    assert_eq!(want.1, "3");
    let log = leasehold.log_tail();
    assert!(log.contains("completed auto compaction"), "{log}");
}
