//! A full disk ends the member with a clear message and a non-zero exit, instead of leaving a
//! process that is up but serves nothing (which no supervisor would restart); and every write it
//! acknowledged before is there after a restart with room on the disk.
//!
//! The data dir is a small tmpfs this test mounts (as root, like the namespace tests) and grows
//! afterwards with a remount.

use leasehold_testkit as common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::Leasehold;

/// Small enough to fill in a few seconds, large enough for redb to open the database and to
/// hold the write-ahead log's first segment (64 MiB, written out when it is made).
const TMPFS_SIZE_FULL: &str = "size=72m";
const TMPFS_SIZE_GROWN: &str = "size=256m";
const VALUE_LEN: usize = 32 * 1024;
/// Bounds of the filling loop.
const PUTS_MAX: usize = 1_000;
const FILL_TIME_MAX: Duration = Duration::from_secs(60);
/// How long the member may take to exit once a write failed.
const EXIT_WITHIN: Duration = Duration::from_secs(15);

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_ends_the_member_and_loses_no_acknowledged_write() {
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
    // Not up-but-useless: the process ends, non-zero, saying why.
    let status = match server.wait_exit(EXIT_WITHIN).await {
        Some(status) => status,
        None => server.fail(&format!(
            "still running {EXIT_WITHIN:?} after a write failed ({failed})"
        )),
    };
    assert!(
        !status.success(),
        "a storage failure exits non-zero: {status}"
    );
    let log = server.log_tail();
    assert!(
        log.contains("storage failed"),
        "the log says why it stopped:\n{log}"
    );

    // With room again, every acknowledged write is there.
    tmpfs.remount(TMPFS_SIZE_GROWN);
    server.restart().await;
    let mut client = server.client().await;
    for n in &acknowledged {
        let got = client
            .get(format!("k{n:05}"), None)
            .await
            .unwrap_or_else(|e| server.fail(&format!("get k{n:05}: {e}")));
        let kv = got
            .kvs()
            .first()
            .unwrap_or_else(|| server.fail(&format!("acknowledged k{n:05} was lost")));
        assert_eq!(kv.value(), value_of(*n).as_slice(), "k{n:05}");
    }
    // And it serves writes again.
    client
        .put("after", "room", None)
        .await
        .unwrap_or_else(|e| server.fail(&format!("put after remount: {e}")));
}
