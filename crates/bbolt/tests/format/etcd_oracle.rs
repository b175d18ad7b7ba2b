//! The real bbolt as oracle, through etcd 3.4's `etcdctl`:
//!
//! - `etcdctl snapshot status` opens a file this crate wrote with Go's bbolt, runs `tx.Check()`
//!   (any page inconsistency fails it) and hashes every bucket; the hash, key count and revision
//!   must match what was written, with and without etcd's appended sha256.
//! - `etcdctl snapshot restore` has Go's bbolt rewrite a file this crate wrote (it adds the
//!   buckets and keys a new member needs, some of them inline); this crate must read the result.
//!
//! No server is started and no port is opened. etcdctl must be installed: scripts/test.sh does it.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{Entries, Model, bytes_of, named, read_model, revision_key};
use leasehold_bbolt::{Db, Writer};
use sha2::{Digest, Sha256};

/// Finds etcdctl on PATH, failing the test (never skipping it) when it is missing.
fn etcdctl() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("etcdctl"))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!("etcdctl (etcd 3.4) is not on PATH; run scripts/test.sh, which installs it")
        })
}

fn run_etcdctl(args: &[&str]) -> Output {
    let output = etcdctl_output(args);
    assert!(
        output.status.success(),
        "etcdctl {args:?} failed:\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn etcdctl_output(args: &[&str]) -> Output {
    Command::new(etcdctl())
        .env("ETCDCTL_API", "3")
        .args(args)
        .output()
        .expect("etcdctl runs")
}

/// Writes `model` to `path` with 4096-byte pages; appends etcd's sha256 trailer if asked.
fn write_file(path: &Path, model: &Model, txid: u64, with_sha256: bool) {
    let file = std::fs::File::create(path).unwrap();
    let mut writer = Writer::new(std::io::BufWriter::new(file));
    for (name, entries) in model {
        let mut bucket = writer.bucket(name).unwrap();
        for (key, value) in entries {
            bucket.put(key, value).unwrap();
        }
        bucket.finish().unwrap();
    }
    let file = writer.finish(txid).unwrap().into_inner().unwrap();
    drop(file);
    if with_sha256 {
        let bytes = std::fs::read(path).unwrap();
        let sum = Sha256::digest(&bytes);
        let mut with_sum = bytes;
        with_sum.extend_from_slice(&sum);
        std::fs::write(path, with_sum).unwrap();
    }
}

/// CRC-32C (Castagnoli), which etcd's snapshot status hashes the buckets with.
fn crc32c(chunks: impl IntoIterator<Item = impl AsRef<[u8]>>) -> u32 {
    let table: Vec<u32> = (0..256u32)
        .map(|n| {
            (0..8).fold(n, |c, _| {
                if c & 1 == 1 {
                    0x82F6_3B78 ^ (c >> 1)
                } else {
                    c >> 1
                }
            })
        })
        .collect();
    let mut crc = !0u32;
    for chunk in chunks {
        for &b in chunk.as_ref() {
            crc = table[((crc ^ u32::from(b)) & 0xFF) as usize] ^ (crc >> 8);
        }
    }
    !crc
}

/// The hash `etcdctl snapshot status` reports: over each bucket in name order, the name, then
/// each key and value.
fn expected_status_hash(model: &Model) -> u32 {
    let mut chunks: Vec<&[u8]> = Vec::new();
    for (name, entries) in model {
        chunks.push(name);
        for (key, value) in entries {
            chunks.push(key);
            chunks.push(value);
        }
    }
    crc32c(chunks)
}

/// Parses `etcdctl snapshot status -w json`.
fn status(path: &Path) -> serde_json::Value {
    let output = run_etcdctl(&["snapshot", "status", path.to_str().unwrap(), "-w", "json"]);
    serde_json::from_slice(&output.stdout).expect("status prints JSON")
}

/// An etcd-like file: the usual buckets with arbitrary contents, a "key" bucket with enough
/// revision-shaped keys for a three-level tree, and values that need overflow pages.
fn status_model() -> Model {
    let keys: Vec<_> = (1..=20_000u64)
        .map(|rev| {
            let len = if rev % 5000 == 0 {
                1_500_000
            } else {
                100 + (rev % 50) as usize
            };
            (revision_key(rev, 0), bytes_of(rev, len))
        })
        .collect();
    let leases = (1..=50u64)
        .map(|id| (id.to_be_bytes().to_vec(), bytes_of(id, 20)))
        .collect();
    vec![
        named("alarm", vec![]),
        named("auth", vec![(b"authEnabled".to_vec(), vec![0])]),
        named("authRoles", vec![]),
        named("authUsers", vec![]),
        named(
            "cluster",
            vec![(b"clusterVersion".to_vec(), b"3.4.0".to_vec())],
        ),
        named("key", keys),
        named("lease", leases),
        named(
            "members",
            vec![(b"8e9e05c52164694d".to_vec(), b"{\"id\":1}".to_vec())],
        ),
        named("members_removed", vec![]),
        named(
            "meta",
            vec![(
                b"consistent_index".to_vec(),
                12345u64.to_be_bytes().to_vec(),
            )],
        ),
    ]
}

#[test]
fn etcdctl_snapshot_status_accepts_written_files() {
    let dir = tempfile::tempdir().unwrap();
    let model = status_model();
    let total_keys: usize = model.iter().map(|(_, entries)| entries.len()).sum();

    let plain = dir.path().join("plain.db");
    write_file(&plain, &model, 9, false);
    let file_len = std::fs::metadata(&plain).unwrap().len();
    let db = Db::open(&plain).unwrap();
    db.check().unwrap();
    let root = db.bucket(b"key").unwrap().unwrap().root_page().unwrap();
    let bytes = std::fs::read(&plain).unwrap();
    assert!(
        common::tree_depth(&bytes, 4096, root) >= 3,
        "the key bucket has three levels"
    );

    let got = status(&plain);
    assert_eq!(got["totalKey"], total_keys as u64, "{got}");
    assert_eq!(got["revision"], 20_000, "{got}");
    assert_eq!(got["totalSize"], file_len, "{got}");
    assert_eq!(
        got["hash"],
        u64::from(expected_status_hash(&model)),
        "{got}"
    );

    let hashed = dir.path().join("hashed.db");
    write_file(&hashed, &model, 9, true);
    assert_eq!(std::fs::metadata(&hashed).unwrap().len(), file_len + 32);
    assert_eq!(status(&hashed), got, "the sha256 trailer changes nothing");
}

/// 64-bit FNV-1a, bbolt's meta checksum.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// The oracle is not lenient: a page below the high-water mark that nothing references fails
/// bbolt's check in etcdctl, and this crate's check too.
#[test]
fn etcdctl_snapshot_status_rejects_an_unreachable_page() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gap.db");
    let model = vec![named("key", vec![(revision_key(1, 0), b"v".to_vec())])];
    write_file(&path, &model, 3, false);
    status(&path);

    let mut bytes = std::fs::read(&path).unwrap();
    let extra_page = bytes.len() / 4096;
    bytes.extend_from_slice(&[0; 4096]);
    for meta in [16, 4096 + 16] {
        let pgid_at = meta + 40;
        let pages = u64::from_le_bytes(bytes[pgid_at..pgid_at + 8].try_into().unwrap());
        bytes[pgid_at..pgid_at + 8].copy_from_slice(&(pages + 1).to_le_bytes());
        let sum = fnv1a64(&bytes[meta..meta + 56]);
        bytes[meta + 56..meta + 64].copy_from_slice(&sum.to_le_bytes());
    }
    std::fs::write(&path, &bytes).unwrap();

    let err = Db::open(&path).unwrap().check().unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("page {extra_page}: unreachable and not free")
    );
    let output = etcdctl_output(&["snapshot", "status", path.to_str().unwrap(), "-w", "json"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "status accepted a file with a gap"
    );
    assert!(
        stderr.contains(&format!("page {extra_page}: unreachable unfreed")),
        "{stderr}"
    );
}

/// An mvccpb.KeyValue message: key (1), create_revision (2), mod_revision (3), version (4),
/// value (5).
fn key_value_proto(key: &[u8], create: u64, modified: u64, version: u64, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    put_bytes(&mut out, 1, key);
    put_varint_field(&mut out, 2, create);
    put_varint_field(&mut out, 3, modified);
    put_varint_field(&mut out, 4, version);
    put_bytes(&mut out, 5, value);
    out
}

fn put_varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn put_varint_field(out: &mut Vec<u8>, field: u64, n: u64) {
    put_varint(out, field << 3);
    put_varint(out, n);
}

fn put_bytes(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    put_varint(out, (field << 3) | 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// A "key" bucket etcd can load: one revision per user key, some values large.
fn restore_key_bucket() -> Entries {
    (1..=3000u64)
        .map(|rev| {
            let user_key = format!("k{rev:05}");
            let len = if rev % 1000 == 0 { 300_000 } else { 40 };
            let value = key_value_proto(user_key.as_bytes(), rev, rev, 1, &bytes_of(rev, len));
            (revision_key(rev, 0), value)
        })
        .collect()
}

/// Restores `snapshot` into `data_dir` with etcdctl (no server: it only rewrites files).
fn restore(snapshot: &Path, data_dir: &Path) {
    run_etcdctl(&[
        "snapshot",
        "restore",
        snapshot.to_str().unwrap(),
        "--data-dir",
        data_dir.to_str().unwrap(),
        "--name",
        "m1",
        "--initial-cluster",
        "m1=http://127.0.0.1:2380",
        "--initial-advertise-peer-urls",
        "http://127.0.0.1:2380",
        "--initial-cluster-token",
        "t",
    ]);
}

/// etcdctl 3.4's restore verifies the sha256 trailer, loads the "key" bucket into an MVCC store
/// (so its values must be valid KeyValue messages), creates the "lease" and "meta" buckets
/// (small, so Go's bbolt stores them inline) and records a consistent index. It also deletes,
/// as MVCC keys, the keys found in the "members" bucket: naming a live key there makes Go's
/// bbolt append a tombstone to the "key" bucket, rewriting its last leaf and its branch pages.
#[test]
fn reads_a_file_rewritten_by_etcdctl_restore() {
    let dir = tempfile::tempdir().unwrap();
    let keys = restore_key_bucket();
    let members = vec![(b"k00007".to_vec(), b"{}".to_vec())];
    let model = vec![
        named("key", keys.clone()),
        named("members", members.clone()),
    ];
    let snapshot = dir.path().join("snapshot.db");
    write_file(&snapshot, &model, 4, true);
    let written = Db::open(&snapshot).unwrap();
    let written_root = written
        .bucket(b"key")
        .unwrap()
        .unwrap()
        .root_page()
        .unwrap();

    let data_dir = dir.path().join("restored");
    restore(&snapshot, &data_dir);

    let db = Db::open(data_dir.join("member/snap/db")).unwrap();
    db.check().unwrap();
    assert!(
        db.txid() > 4,
        "Go's bbolt committed on top of the written file"
    );
    let names = db.bucket_names().unwrap();
    assert_eq!(names, [&b"key"[..], b"lease", b"members", b"meta"]);
    let restored = read_model(&db);

    let key_bucket = db.bucket(b"key").unwrap().unwrap();
    assert_ne!(
        key_bucket.root_page().unwrap(),
        written_root,
        "Go rewrote the key bucket's root"
    );
    let (_, restored_keys) = &restored[0];
    let (tombstone, rest) = restored_keys.split_last().unwrap();
    assert!(
        rest == keys.as_slice(),
        "the key bucket reads back as written"
    );
    let mut tombstone_key = revision_key(3001, 0);
    tombstone_key.push(b't');
    assert_eq!(tombstone.0, tombstone_key);
    let mut deleted_key = Vec::new();
    put_bytes(&mut deleted_key, 1, b"k00007");
    assert!(tombstone.1.starts_with(&deleted_key), "{:?}", tombstone.1);

    for inline in [&b"lease"[..], b"meta", b"members"] {
        assert!(
            db.bucket(inline).unwrap().unwrap().is_inline(),
            "{}",
            inline.escape_ascii()
        );
    }
    assert_eq!(restored[1].1, vec![], "lease is empty");
    assert_eq!(restored[2].1, members);
    let meta = &restored[3].1;
    let index = meta
        .iter()
        .find(|(k, _)| k == b"consistent_index")
        .expect("consistent index");
    assert_eq!(
        index.1,
        1u64.to_be_bytes(),
        "one member: consistent index 1"
    );
}
