//! Snapshots that migrate both ways between etcd and leasehold, with the standard tools:
//!
//! - `etcdctl snapshot save` from leasehold gives a file `etcdctl snapshot status` reads and
//!   `etcdctl snapshot restore` turns into a real etcd with the same keys, versions, revisions,
//!   history since the compaction point, compaction point, leases and auth store;
//! - `etcdctl snapshot save` from etcd gives a file `leasehold snapshot restore` turns into a
//!   leasehold with the same; and leasehold's own file restores into leasehold;
//! - bad files (a flipped byte, no hash, not a snapshot) and a data dir in use get etcd's
//!   errors, or a clear one, and leave nothing behind;
//! - writes go on while a snapshot is being sent.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use etcd_client::{
    Client, CompactionOptions, GetOptions, LeaseGrantOptions, LeaseTimeToLiveOptions,
};
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use leasehold_testkit as common;
use serde_json::Value;

use common::{Kind, Server, describe_output, etcdctl_ok};

const LEASE_SHORT: i64 = 0x51;
const LEASE_LONG: i64 = 0x52;
const LEASE_IDLE: i64 = 0x53;

/// The same history on any server: puts, overwrites, a delete, a txn, keys on leases, a value
/// of 100 KiB (several bbolt pages), a compaction, then more writes, users and roles. Returns
/// the compaction point.
async fn populate(client: &mut Client) -> i64 {
    for (id, ttl) in [(LEASE_SHORT, 300), (LEASE_LONG, 3000), (LEASE_IDLE, 900)] {
        client
            .lease_grant(ttl, Some(LeaseGrantOptions::new().with_id(id)))
            .await
            .expect("lease grant");
    }
    for i in 0..40 {
        let value = format!("value-{i}");
        client
            .put(format!("key/{:02}", i % 13), value, None)
            .await
            .expect("put");
    }
    client.delete("key/03", None).await.expect("delete");
    let big = "x".repeat(100 * 1024);
    client.put("big", big, None).await.expect("put big");
    let txn = Txn::new()
        .when([Compare::version("key/01", CompareOp::Greater, 0)])
        .and_then([
            TxnOp::put("txn/a", "1", None),
            TxnOp::put("txn/b", "2", None),
            TxnOp::delete("key/04", None),
        ]);
    client.txn(txn).await.expect("txn");
    let on = |id| Some(PutOptions::new().with_lease(id));
    client
        .put("leased/short", "s", on(LEASE_SHORT))
        .await
        .expect("put on lease");
    client
        .put("leased/long", "l", on(LEASE_LONG))
        .await
        .expect("put on lease");
    let compact = common::revision(client).await - 3;
    client
        .compact(compact, Some(CompactionOptions::new().with_physical()))
        .await
        .expect("compact");
    for i in 0..5 {
        client
            .put(format!("after/{i}"), format!("{i}"), None)
            .await
            .expect("put");
    }
    client.delete("key/05", None).await.expect("delete");
    client
        .user_add("alice", "pw", None)
        .await
        .expect("user add");
    client.role_add("reader").await.expect("role add");
    client
        .role_grant_permission(
            "reader",
            etcd_client::Permission::read("key/").with_prefix(),
        )
        .await
        .expect("grant");
    client
        .user_grant_role("alice", "reader")
        .await
        .expect("user grant");
    compact
}

/// What a client sees of a server's state, as lines to compare: the current keys with their
/// revisions, versions and leases; every revision's view from the compaction point on; the
/// error below it; the leases with their keys and granted TTLs; users and roles.
async fn observe(client: &mut Client, compact: i64) -> Vec<String> {
    let mut out = Vec::new();
    let current = common::revision(client).await;
    out.push(format!("revision {current}"));
    let everything = || GetOptions::new().with_from_key();
    for rev in compact..=current {
        let got = client
            .get("\0", Some(everything().with_revision(rev)))
            .await
            .unwrap_or_else(|e| panic!("get at {rev}: {e}"));
        for kv in got.kvs() {
            out.push(format!(
                "at {rev}: {} = {} bytes, created {} modified {} version {} lease {:x}",
                kv.key_str().expect("utf-8 key"),
                kv.value().len(),
                kv.create_revision(),
                kv.mod_revision(),
                kv.version(),
                kv.lease()
            ));
        }
    }
    match client
        .get("\0", Some(everything().with_revision(compact - 1)))
        .await
    {
        Ok(r) => out.push(format!(
            "below the compaction point: {} keys",
            r.kvs().len()
        )),
        Err(e) => out.push(format!("below the compaction point: {e}")),
    }
    let mut leases: Vec<i64> = client
        .leases()
        .await
        .expect("lease list")
        .leases()
        .iter()
        .map(|l| l.id())
        .collect();
    leases.sort();
    for id in leases {
        let ttl = client
            .lease_time_to_live(id, Some(LeaseTimeToLiveOptions::new().with_keys()))
            .await
            .expect("time to live");
        let mut keys: Vec<String> = ttl
            .keys()
            .iter()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect();
        keys.sort();
        out.push(format!(
            "lease {id:x}: granted {} keys {keys:?}",
            ttl.granted_ttl()
        ));
    }
    let users = client.user_list().await.expect("user list");
    out.push(format!("users {:?}", users.users()));
    let alice = client.user_get("alice").await.expect("user get");
    out.push(format!("alice's roles {:?}", alice.roles()));
    let reader = client.role_get("reader").await.expect("role get");
    for p in reader.permissions() {
        out.push(format!(
            "reader: {:?} {:?} {:?}",
            p.get_type(),
            String::from_utf8_lossy(p.key()),
            String::from_utf8_lossy(p.range_end())
        ));
    }
    out
}

/// Each lease's remaining TTL.
async fn remaining(client: &mut Client) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    for id in [LEASE_SHORT, LEASE_LONG, LEASE_IDLE] {
        let ttl = client
            .lease_time_to_live(id, None)
            .await
            .expect("time to live");
        out.push((id, ttl.ttl()));
    }
    out
}

fn run(program: &Path, args: &[&str]) -> Output {
    std::process::Command::new(program)
        .env("ETCDCTL_API", "3")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()))
}

/// A one-member server of `kind` started on a data dir restored from `file` by `kind`'s tool.
async fn start_restored(kind: Kind, file: &Path) -> Server {
    let mut members = common::spawn_restored_members(kind, &[file], &[vec![]]);
    let mut server = members.pop().expect("one member");
    server.wait_ready().await;
    server
}

/// `etcdctl snapshot save` from `server` into `dir`; the file's path.
async fn save(server: &Server, dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    etcdctl_ok(
        &server.endpoint(),
        &["snapshot", "save", path.to_str().expect("utf-8 path")],
    )
    .await;
    path
}

/// `etcdctl snapshot status -w json`.
async fn status(file: &Path) -> Value {
    let out = etcdctl_ok(
        "http://127.0.0.1:1",
        &[
            "snapshot",
            "status",
            file.to_str().expect("utf-8"),
            "-w",
            "json",
        ],
    )
    .await;
    serde_json::from_slice(&out.stdout).expect("status prints JSON")
}

/// A leasehold with [`populate`]'s history, saved with `etcdctl snapshot save` into `dir`: the
/// server, a client of it, the compaction point, what [`observe`] sees, and the file.
async fn leasehold_source(dir: &Path) -> (Server, Client, i64, Vec<String>, PathBuf) {
    let source = common::Leasehold::start().await;
    let mut client = source.client().await;
    let compact = populate(&mut client).await;
    let want = observe(&mut client, compact).await;
    let file = save(&source, dir, "leasehold.db").await;
    (source, client, compact, want, file)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leasehold_snapshot_restores_into_etcd_and_leasehold() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_source, mut client, compact, want, file) = leasehold_source(dir.path()).await;
    let left_at_save = remaining(&mut client).await;
    // What is compared holds what the history made.
    for line in [
        "lease 52: granted 3000 keys [\"leased/long\"]",
        "reader: 0 \"key/\" \"key0\"",
        "alice's roles [\"reader\"]",
    ] {
        assert!(want.iter().any(|l| l == line), "no {line:?} in {want:#?}");
    }
    assert!(
        want.iter()
            .any(|l| l.contains("below the compaction point") && l.contains("compacted")),
        "{want:#?}"
    );
    assert!(
        want.iter().any(|l| l.contains("big = 102400 bytes")),
        "{want:#?}"
    );

    let status = status(&file).await;
    assert_eq!(
        status["revision"].as_i64(),
        Some(common::revision(&mut client).await),
        "{status}"
    );
    assert!(
        status["totalKey"].as_i64().is_some_and(|n| n > 24),
        "{status}"
    );

    for kind in [Kind::Etcd, Kind::Leasehold] {
        let restored = start_restored(kind, &file).await;
        let mut restored_client = restored.client().await;
        let got = observe(&mut restored_client, compact).await;
        assert_eq!(got, want, "restored into {kind:?}");
        // Remaining time is carried, not reset to the TTL (nor extended; the file holds whole
        // seconds, rounded up, and TimeToLive rounds down).
        for ((id, left), (_, before)) in remaining(&mut restored_client)
            .await
            .into_iter()
            .zip(&left_at_save)
        {
            assert!(
                left <= before + 1 && left >= before - 60,
                "{kind:?}: lease {id:x} has {left} s left, had {before} s at the save"
            );
        }
        // It takes writes at the next revision.
        let next = restored_client.put("new", "1", None).await.expect("put");
        let before = got[0].strip_prefix("revision ").expect("first line");
        assert_eq!(
            next.header().expect("header").revision(),
            before.parse::<i64>().expect("a revision") + 1
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_restored_from_one_file_form_a_cluster() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_source, _client, compact, want, file) = leasehold_source(dir.path()).await;

    let mut members =
        common::spawn_restored_members(Kind::Leasehold, &[&file, &file, &file], &vec![vec![]; 3]);
    for member in &mut members {
        member.wait_ready().await;
    }
    // Every member holds the state, and a write through one reaches the others.
    for member in &members {
        let mut member_client = member.client().await;
        assert_eq!(
            observe(&mut member_client, compact).await,
            want,
            "{}",
            member.label()
        );
    }
    let mut first = members[0].client().await;
    let put = first.put("after-restore", "1", None).await.expect("put");
    let at = put.header().expect("header").revision();
    for member in &members[1..] {
        let mut member_client = member.client().await;
        let got = member_client.get("after-restore", None).await.expect("get");
        assert_eq!(got.kvs().len(), 1, "{}", member.label());
        assert_eq!(got.kvs()[0].mod_revision(), at);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_snapshot_restores_into_leasehold() {
    let dir = tempfile::tempdir().expect("temp dir");
    let source = common::Etcd::start().await;
    let mut client = source.client().await;
    let compact = populate(&mut client).await;
    let want = observe(&mut client, compact).await;
    let file = save(&source, dir.path(), "etcd.db").await;

    let restored = start_restored(Kind::Leasehold, &file).await;
    let mut restored_client = restored.client().await;
    assert_eq!(observe(&mut restored_client, compact).await, want);
    // etcd 3.4 records no remaining time (no checkpoints): the TTL, as etcd's own restore.
    for (id, left) in remaining(&mut restored_client).await {
        let granted = match id {
            LEASE_SHORT => 300,
            LEASE_LONG => 3000,
            _ => 900,
        };
        assert!(
            left <= granted && left >= granted - 60,
            "lease {id:x}: {left}"
        );
    }
    // A leased key still goes with its lease.
    restored_client
        .lease_revoke(LEASE_SHORT)
        .await
        .expect("revoke");
    let gone = restored_client
        .get("leased/short", None)
        .await
        .expect("get");
    assert!(gone.kvs().is_empty());
}

/// Runs a restore of `file` with both tools into fresh dirs under `dir` (named after the file);
/// their outputs and data dirs.
fn restore_both(dir: &Path, file: &Path, extra: &[&str]) -> [(Output, PathBuf); 2] {
    let name = file.file_stem().expect("a file name").to_string_lossy();
    [Kind::Etcd, Kind::Leasehold].map(|kind| {
        let data_dir = dir.join(format!("{kind:?}-{name}"));
        let mut args = vec![
            "snapshot",
            "restore",
            file.to_str().expect("utf-8"),
            "--data-dir",
            data_dir.to_str().expect("utf-8"),
        ];
        args.extend(extra);
        let program = match kind {
            Kind::Etcd => common::etcdctl_binary(),
            Kind::Leasehold => common::leasehold_binary(),
        };
        (run(&program, &args), data_dir)
    })
}

/// The line that says why (`Error: ...`), from a failed restore's output.
fn error_line(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "expected a failure\n{}",
        describe_output(out)
    );
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .find(|l| l.starts_with("Error: "))
        .unwrap_or_else(|| panic!("no error line\n{}", describe_output(out)))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_snapshot_files_get_etcds_errors_and_leave_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let source = common::Leasehold::start().await;
    let mut client = source.client().await;
    client.put("k", "v", None).await.expect("put");
    let good = save(&source, dir.path(), "good.db").await;
    let bytes = std::fs::read(&good).expect("read snapshot");

    // A flipped byte: the hash does not match.
    let flipped = dir.path().join("flipped.db");
    let mut damaged = bytes.clone();
    damaged[4096 * 2 + 100] ^= 0xff;
    std::fs::write(&flipped, &damaged).expect("write");
    let [(etcd, etcd_dir), (ours, our_dir)] = restore_both(dir.path(), &flipped, &[]);
    assert!(
        error_line(&etcd).contains("expected sha256"),
        "{}",
        error_line(&etcd)
    );
    assert_eq!(error_line(&ours), error_line(&etcd));
    assert!(!our_dir.exists(), "etcd's left {}", etcd_dir.exists());

    // No hash (a copy of a data dir's database, or not a snapshot at all).
    let unhashed = dir.path().join("unhashed.db");
    std::fs::write(&unhashed, &bytes[..bytes.len() - 32]).expect("write");
    let [(etcd, _), (ours, our_dir)] = restore_both(dir.path(), &unhashed, &[]);
    assert_eq!(error_line(&ours), error_line(&etcd));
    assert!(!our_dir.exists());

    // Garbage with the hash check skipped: etcdctl 3.4 panics ("cannot open database ...
    // (invalid database)"); leasehold says why, and leaves nothing behind.
    let garbage = dir.path().join("garbage.db");
    std::fs::write(&garbage, vec![7u8; 8192]).expect("write");
    let [(etcd, _), (ours, our_dir)] = restore_both(dir.path(), &garbage, &["--skip-hash-check"]);
    assert!(!etcd.status.success(), "{}", describe_output(&etcd));
    let why = error_line(&ours);
    assert!(why.contains("bbolt"), "{why}");
    assert!(!our_dir.exists());

    // A data dir that holds something is refused, and kept as it was.
    let used = dir.path().join("used");
    std::fs::create_dir_all(&used).expect("mkdir");
    std::fs::write(used.join("keep"), "x").expect("write");
    let out = run(
        &common::leasehold_binary(),
        &[
            "snapshot",
            "restore",
            good.to_str().expect("utf-8"),
            "--data-dir",
            used.to_str().expect("utf-8"),
        ],
    );
    assert!(
        error_line(&out).contains("not empty"),
        "{}",
        error_line(&out)
    );
    assert_eq!(std::fs::read_dir(&used).expect("read dir").count(), 1);

    // The good file restores (the errors above were about the files).
    let [(etcd, _), (ours, _)] = restore_both(dir.path(), &good, &[]);
    assert!(etcd.status.success(), "{}", describe_output(&etcd));
    assert!(ours.status.success(), "{}", describe_output(&ours));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_go_on_while_a_snapshot_is_sent() {
    let server = common::Leasehold::start().await;
    let mut client = server.client().await;
    let value = "v".repeat(1024);
    for i in 0..2_000 {
        client
            .put(format!("k{i:05}"), value.as_str(), None)
            .await
            .expect("put");
    }
    let at_snapshot = common::revision(&mut client).await;
    let mut stream = client.snapshot().await.expect("snapshot");
    let first = stream
        .message()
        .await
        .expect("first piece")
        .expect("a piece");
    assert!(first.remaining_bytes() > 0, "more than one piece");
    // The stream is open and not read on: writes still commit.
    let mut writer = server.client().await;
    for i in 0..50 {
        tokio::time::timeout(
            Duration::from_secs(5),
            writer.put(format!("during/{i}"), "x", None),
        )
        .await
        .expect("a write during the snapshot finished in time")
        .expect("put");
    }
    let mut bytes = first.blob().to_vec();
    while let Some(piece) = stream.message().await.expect("piece") {
        bytes.extend_from_slice(piece.blob());
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("snap.db");
    std::fs::write(&file, &bytes).expect("write");
    // The snapshot is the state when it was asked for, without the writes made during it.
    let status = status(&file).await;
    assert_eq!(status["revision"].as_i64(), Some(at_snapshot), "{status}");
    assert_eq!(status["totalKey"].as_i64().map(|n| n >= 2_000), Some(true));
}
