//! A full disk: the member stays up, refuses writes that add data with etcd's NOSPACE, serves
//! every acknowledged key, says why in its log and `/health`, and takes writes again once the
//! disk has room, without a restart; every write it acknowledged is there after a kill -9 and a
//! restart.
//!
//! The data dir is a small tmpfs this test mounts (as root, like the namespace tests) and grows
//! afterwards with a remount.

use leasehold_testkit as common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::Leasehold;
use etcd_client::Client;

/// Small enough to fill in a few seconds, large enough for redb to open the database and to
/// hold the write-ahead log's first segment (64 MiB, written out when it is made).
const TMPFS_SIZE_FULL: &str = "size=72m";
const TMPFS_SIZE_GROWN: &str = "size=256m";
const VALUE_LEN: usize = 32 * 1024;
/// Bounds of the filling loop.
const PUTS_MAX: usize = 1_000;
const FILL_TIME_MAX: Duration = Duration::from_secs(60);
/// How long the member is watched for an exit it must not make once the disk is full.
const STAYS_UP_FOR: Duration = Duration::from_secs(2);
/// How long writes may take to be admitted again once the disk has room.
const RESUMES_WITHIN: Duration = Duration::from_secs(15);
/// etcd's NOSPACE refusal.
const NOSPACE: &str = "etcdserver: mvcc: database space exceeded";

/// Every file under `dir` with its size, for failure messages.
fn files_and_sizes(dir: &Path) -> String {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            match entry.metadata() {
                Ok(m) if m.is_dir() => dirs.push(path),
                Ok(m) => out.push(format!("{} {} B", path.display(), m.len())),
                Err(_) => {}
            }
        }
    }
    out.sort();
    out.join(", ")
}

/// A tmpfs mounted on a temp dir, unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(options: &str) -> Tmpfs {
        let dir = tempfile::tempdir().expect("temp dir");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mount a tmpfs (this test needs root, as CI runs): {status}"
        );
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn remount(&self, options: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,{options}")])
            .arg(self.path())
            .status()
            .expect("run mount");
        assert!(status.success(), "remount the tmpfs: {status}");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.path()).status();
    }
}

fn value_of(n: usize) -> Vec<u8> {
    let mut v = format!("value-{n}-").into_bytes();
    v.resize(VALUE_LEN, b'x');
    v
}

/// Whether every acknowledged key (`{prefix}{n:05}`) is served with its value: the first one
/// that is not, and why.
async fn all_served(
    client: &mut Client,
    prefix: &str,
    acknowledged: &[usize],
) -> Result<(), String> {
    for n in acknowledged {
        let key = format!("{prefix}{n:05}");
        let got = client
            .get(key.as_str(), None)
            .await
            .map_err(|e| format!("get {key}: {e}"))?;
        match got.kvs().first() {
            Some(kv) if kv.value() == value_of(*n).as_slice() => {}
            Some(_) => return Err(format!("acknowledged {key} has another value")),
            None => return Err(format!("acknowledged {key} is not served")),
        }
    }
    Ok(())
}

/// A write that adds data, which a full disk must refuse at once with NOSPACE; what it got.
async fn refused_at_once(client: &mut Client) -> Result<(), String> {
    match tokio::time::timeout(Duration::from_secs(5), client.put("more", "x", None)).await {
        Err(_) => Err("a write on a full disk was left waiting".to_owned()),
        Ok(Err(e)) if e.to_string().contains(NOSPACE) => Ok(()),
        Ok(other) => Err(format!(
            "a write on a full disk did not get NOSPACE: {other:?}"
        )),
    }
}

/// Puts `after` until it is taken, while it gets NOSPACE and for at most [`RESUMES_WITHIN`];
/// how long that took.
async fn taken_again(client: &mut Client) -> Result<Duration, String> {
    let resumed = Instant::now();
    loop {
        match client.put("after", "room", None).await {
            Ok(_) => return Ok(resumed.elapsed()),
            Err(e) if resumed.elapsed() < RESUMES_WITHIN && e.to_string().contains(NOSPACE) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => {
                return Err(format!(
                    "writes not taken {:?} after the disk had room: {e}",
                    resumed.elapsed()
                ));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_serves_reads_and_recovers_without_restart() {
    let tmpfs = Tmpfs::mount(TMPFS_SIZE_FULL);
    let data_dir: PathBuf = tmpfs.path().join("data");
    let mut server = Leasehold::start_in(&data_dir).await;
    let mut client = server.client().await;

    let mut acknowledged = Vec::new();
    let started = Instant::now();
    let mut failed = None;
    for n in 0..PUTS_MAX {
        if started.elapsed() > FILL_TIME_MAX {
            break;
        }
        match client.put(format!("k{n:05}"), value_of(n), None).await {
            Ok(_) => acknowledged.push(n),
            Err(e) => {
                failed = Some(e.to_string());
                break;
            }
        }
    }
    let failed = failed.unwrap_or_else(|| {
        server.fail(&format!(
            "{} puts of {VALUE_LEN} bytes fit a {TMPFS_SIZE_FULL} tmpfs",
            acknowledged.len()
        ))
    });
    assert!(
        !acknowledged.is_empty(),
        "the very first put failed ({failed}): the disk was full before the test began"
    );
    eprintln!("{} puts acknowledged, then: {failed}", acknowledged.len());
    assert!(
        failed.contains(NOSPACE),
        "a full disk refuses writes with NOSPACE: {failed}"
    );

    // Up, and says why, in its log and in /health.
    if let Some(status) = server.wait_exit(STAYS_UP_FOR).await {
        server.fail(&format!("exited on a full disk: {status}"));
    }
    let log = server.log_tail();
    assert!(log.contains("the disk is full"), "the log says why:\n{log}");
    let (code, health) = common::curl("GET", &server.endpoint(), "/health", None);
    assert!(
        code == 503 && health.contains("NOSPACE"),
        "/health says NOSPACE: {code} {health}"
    );
    // Every acknowledged key is served, linearizably; a write is refused at once.
    if let Err(e) = all_served(&mut client, "k", &acknowledged).await {
        server.fail(&format!("on the full disk: {e}"));
    }
    if let Err(e) = refused_at_once(&mut client).await {
        server.fail(&e);
    }

    // Killed and started again on the still-full disk, it comes up and serves the same way.
    server.kill9();
    server.restart().await;
    let mut client = server.client().await;
    if let Err(e) = all_served(&mut client, "k", &acknowledged).await {
        server.fail(&format!("after a restart on the full disk: {e}"));
    }
    if let Err(e) = refused_at_once(&mut client).await {
        server.fail(&format!("after a restart on the full disk: {e}"));
    }

    // A compaction (it adds nothing) is taken on the full disk, and the member stays up and
    // serves. It comes after the restart checks, as removing a compaction's rows can free room;
    // the keys compacted here have no history to remove.
    let revision = client
        .get("k00000", None)
        .await
        .unwrap_or_else(|e| server.fail(&format!("a read on the full disk: {e}")))
        .header()
        .expect("a header")
        .revision();
    if let Err(e) = client.compact(revision, None).await {
        server.fail(&format!("a compaction on the full disk: {e}"));
    }
    if let Some(status) = server.wait_exit(STAYS_UP_FOR).await {
        server.fail(&format!(
            "exited after a compaction on a full disk: {status}"
        ));
    }
    if let Err(e) = all_served(&mut client, "k", &acknowledged).await {
        server.fail(&format!("after a compaction on the full disk: {e}"));
    }

    // With room again, writes are taken without a restart.
    tmpfs.remount(TMPFS_SIZE_GROWN);
    let took = taken_again(&mut client)
        .await
        .unwrap_or_else(|e| server.fail(&e));
    eprintln!("writes taken again {took:?} after the disk had room");
    let (code, health) = common::curl("GET", &server.endpoint(), "/health", None);
    assert_eq!(code, 200, "healthy again: {health}");

    // And nothing acknowledged was lost: kill -9, restart, read everything back.
    server.kill9();
    server.restart().await;
    let mut client = server.client().await;
    if let Err(e) = all_served(&mut client, "k", &acknowledged).await {
        server.fail(&format!("after a kill -9 and a restart with room: {e}"));
    }
    let after = client.get("after", None).await.expect("get after");
    assert_eq!(
        after.kvs().len(),
        1,
        "the write taken after the remount was lost"
    );
}

/// The write-ahead log's side of a full disk: a member whose log cannot make its next segment
/// behaves as one whose redb file is full. The tmpfs holds the log's segment and its spare (made
/// ahead, 64 MiB each) and a little more; one key is put again and again with a big value and
/// compacted behind, so the redb file stays small and the log, never compacted here
/// (`--snapshot-count`), is what fills the disk. The spare becomes the next segment; the one
/// after it cannot be made, and once a quarter of a segment is left the member refuses writes
/// with NOSPACE rather than exit when the log cannot grow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_that_cannot_grow_refuses_writes_serves_reads_and_recovers_without_restart() {
    // Values just under 256 KiB, compacted every 8 puts: the redb file keeps few versions, each in
    // one allocation, so it stays far below the room the log leaves. (With 256 KiB values
    // compacted every 16, a run of the whole suite once had the redb file fill the disk first,
    // after 205 puts, where alone it never did.)
    const VALUE: usize = 255 * 1024;
    const COMPACT_EVERY: usize = 8;
    let value = |n: usize| {
        let mut v = format!("log-{n}-").into_bytes();
        v.resize(VALUE, b'w');
        v
    };
    let tmpfs = Tmpfs::mount("size=150m");
    let data_dir: PathBuf = tmpfs.path().join("data");
    let setup = common::Setup {
        args: vec!["--snapshot-count".into(), "1000000".into()],
        ..common::Setup::default()
    };
    let mut server = Leasehold::start_in_with(&data_dir, setup).await;
    let mut client = server.client().await;

    let mut acknowledged = None;
    let started = Instant::now();
    let mut failed = None;
    for n in 0..PUTS_MAX {
        if started.elapsed() > FILL_TIME_MAX {
            break;
        }
        match client.put("w", value(n), None).await {
            Ok(put) => {
                acknowledged = Some(n);
                if n % COMPACT_EVERY == COMPACT_EVERY - 1 {
                    let revision = put.header().expect("header").revision();
                    if let Err(e) = client.compact(revision, None).await {
                        failed = Some(format!("compact: {e}"));
                        break;
                    }
                }
            }
            Err(e) => {
                failed = Some(e.to_string());
                break;
            }
        }
    }
    let Some(last) = acknowledged else {
        server.fail(&format!("the first put failed: {failed:?}"));
    };
    let failed = failed.unwrap_or_else(|| {
        server.fail(&format!("{last} puts of {VALUE} bytes fit a 150 MiB tmpfs"))
    });
    eprintln!("{} puts acknowledged, then: {failed}", last + 1);
    assert!(
        failed.contains(NOSPACE),
        "writes are refused with NOSPACE: {failed}"
    );
    if let Some(status) = server.wait_exit(STAYS_UP_FOR).await {
        server.fail(&format!("exited when its log could not grow: {status}"));
    }
    let log = server.log_tail();
    assert!(
        log.contains("the raft log has no room"),
        "the log, not the redb file, is what filled the disk, and the member says so \
         (files: {}):\n{log}",
        files_and_sizes(&data_dir)
    );
    let (code, health) = common::curl("GET", &server.endpoint(), "/health", None);
    assert!(
        code == 503 && health.contains("NOSPACE"),
        "/health says NOSPACE: {code} {health}"
    );
    let served = |got: etcd_client::GetResponse| {
        got.kvs().first().map(|kv| kv.value().to_vec()) == Some(value(last))
    };
    assert!(
        served(client.get("w", None).await.expect("get")),
        "the last acknowledged value is served"
    );
    if let Err(e) = refused_at_once(&mut client).await {
        server.fail(&e);
    }

    // Killed and started again on the still-full disk: it serves, and still refuses.
    server.kill9();
    server.restart().await;
    let mut client = server.client().await;
    assert!(
        served(client.get("w", None).await.expect("get after a restart")),
        "the last acknowledged value is served after a kill -9 and a restart"
    );
    if let Err(e) = refused_at_once(&mut client).await {
        server.fail(&format!("after a restart on the full disk: {e}"));
    }

    // Room again: the log makes its spare, and writes are taken without a restart.
    tmpfs.remount("size=400m");
    let took = taken_again(&mut client)
        .await
        .unwrap_or_else(|e| server.fail(&e));
    eprintln!("writes taken again {took:?} after the disk had room");
    server.kill9();
    server.restart().await;
    let mut client = server.client().await;
    assert!(
        served(client.get("w", None).await.expect("get")),
        "the last acknowledged value survives"
    );
    let after = client.get("after", None).await.expect("get after");
    assert_eq!(
        after.kvs().len(),
        1,
        "the write taken after the remount was lost"
    );
}

/// Fills the file system under `dir` with a file of its own, in 1 MiB writes until one fails;
/// returns the file, whose removal gives the room back.
fn fill_up(dir: &Path) -> PathBuf {
    use std::io::Write as _;
    let path = dir.join("ballast");
    let mut file = std::fs::File::create(&path).expect("create the ballast file");
    let chunk = vec![0u8; 1 << 20];
    // Bounded by the tmpfs's size.
    for _ in 0..1024 {
        if file
            .write_all(&chunk)
            .and_then(|()| file.sync_all())
            .is_err()
        {
            return path;
        }
    }
    panic!("1 GiB fit under {}: not a small tmpfs", dir.display());
}

/// A leader whose disk is full refuses what its followers forward that adds data (NOSPACE, as
/// their own disks would), renews their leases, and takes their writes again once it has room.
/// Members run in this process, each on a tmpfs of its own; the leader's is filled by a file of
/// the test's, not by the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_with_a_full_disk_refuses_forwarded_writes_until_it_has_room() {
    use leasehold_testkit::InProcessCluster;
    let disks: Vec<Tmpfs> = (0..3).map(|_| Tmpfs::mount("size=96m")).collect();
    let root = tempfile::tempdir().expect("temp dir");
    let cluster =
        InProcessCluster::start_on(disks.iter().map(|d| d.path().join("data")).collect(), root)
            .await;
    let leader = cluster.leader().await;
    let follower = (leader + 1) % 3;
    let mut client = cluster.members[follower].client().await;
    let lease = client.lease_grant(60, None).await.expect("grant").id();

    let ballast = fill_up(disks[leader].path());
    // The first writes may still go in: the leader learns its disk is full at its next
    // checkpoint (every 100 ms). Bounded by the store's own writes filling nothing further.
    let mut acknowledged = Vec::new();
    let started = Instant::now();
    let refused = loop {
        let n = acknowledged.len();
        match client.put(format!("f{n:05}"), value_of(n), None).await {
            Ok(_) => acknowledged.push(n),
            Err(e) => break e.to_string(),
        }
        assert!(
            started.elapsed() < FILL_TIME_MAX && n < PUTS_MAX,
            "a follower's writes went on {:?} after its leader's disk filled ({n} puts)",
            started.elapsed()
        );
    };
    assert!(
        refused.contains(NOSPACE),
        "a forwarded write gets NOSPACE: {refused}"
    );
    eprintln!(
        "{} forwarded puts taken after the leader's disk filled, then: {refused}",
        acknowledged.len()
    );
    // Renewals through the follower go on (they add nothing).
    let (mut keeper, mut renewals) = client.lease_keep_alive(lease).await.expect("keepalive");
    keeper.keep_alive().await.expect("renew");
    let renewed = renewals
        .message()
        .await
        .expect("renewal answer")
        .expect("an answer");
    assert!(renewed.ttl() > 0, "the lease was renewed: {renewed:?}");

    std::fs::remove_file(&ballast).expect("remove the ballast file");
    if let Err(e) = taken_again(&mut client).await {
        panic!("forwarded, once the leader had room: {e}");
    }
    if let Err(e) = all_served(&mut client, "f", &acknowledged).await {
        panic!("{e}");
    }
    cluster.shutdown().await;
    drop(disks);
}
