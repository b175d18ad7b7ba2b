//! `etcdctl lock` and `etcdctl elect` (Debian's etcdctl 3.4) against leasehold, differentially
//! against real etcd. etcdctl runs these recipes itself (a session lease kept alive, a queue key
//! per session, range + watch to wait), so this checks that leasehold's KV, Lease and Watch
//! serve etcd's own client-side mutex and election; the server-side services are tested in
//! `lock_election_differential.rs`.
//!
//! Session lease IDs are random and appear in keys: the harness masks 10–16 digit hex words as
//! `<id>`. Blocking commands run in the background; every wait for a line or an exit is bounded.

use leasehold_testkit as common;

use std::process::Stdio;
use std::time::Duration;

use common::{
    Recorder, Server, ctl, etcdctl_differential, mask_etcdctl_output, server_differential,
};
use serde_json::json;
use tokio::io::{AsyncBufReadExt as _, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

/// How long a background etcdctl may take to print its next line.
const LINE_WAIT_MAX: Duration = Duration::from_secs(10);
/// How long a background etcdctl may take to exit after SIGINT.
const EXIT_WAIT_MAX: Duration = Duration::from_secs(10);
/// How long to poll for a queued key.
const QUEUED_WAIT_MAX: Duration = Duration::from_secs(10);

/// A background etcdctl, killed on drop.
struct Background {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Background {
    fn spawn(server: &Server, args: &[&str]) -> Background {
        let mut child = tokio::process::Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", server.endpoint()))
            .arg("--dial-timeout=3s")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn etcdctl");
        let lines = BufReader::new(child.stdout.take().expect("stdout piped")).lines();
        Background { child, lines }
    }

    /// The next line of output, or why there is none, masked like every etcdctl output.
    async fn next_line(&mut self, server: &Server) -> String {
        match tokio::time::timeout(LINE_WAIT_MAX, self.lines.next_line()).await {
            Ok(Ok(Some(line))) => mask_etcdctl_output(&line, server).trim_end().to_owned(),
            Ok(Ok(None)) => "<end of output>".to_owned(),
            Ok(Err(e)) => format!("<read error: {e}>"),
            Err(_) => format!("<no line within {LINE_WAIT_MAX:?}>"),
        }
    }

    /// True if the process printed nothing yet and is still running.
    fn still_waiting(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends SIGINT (etcdctl then releases what it holds) and waits for the exit code.
    async fn interrupt(&mut self) -> Option<i32> {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-INT", &pid.to_string()])
                .status();
        }
        match tokio::time::timeout(EXIT_WAIT_MAX, self.child.wait()).await {
            Ok(Ok(status)) => status.code(),
            _ => None,
        }
    }

    async fn exit_code(&mut self) -> Option<i32> {
        match tokio::time::timeout(EXIT_WAIT_MAX, self.child.wait()).await {
            Ok(Ok(status)) => status.code(),
            _ => None,
        }
    }
}

/// Polls until `count` keys exist under `prefix`, bounded.
async fn until_keys(server: &Server, prefix: &str, count: i64) -> bool {
    let mut client = server.client().await;
    let start = std::time::Instant::now();
    while start.elapsed() < QUEUED_WAIT_MAX {
        let options = etcd_client::GetOptions::new()
            .with_prefix()
            .with_count_only();
        if let Ok(r) = client.get(prefix, Some(options)).await
            && r.count() == count
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// `lock NAME -- COMMAND`: the command runs holding the lock, sees the lock key and revision in
/// its environment, its failure becomes etcdctl's error and exit code; the lock is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_with_a_command_same_as_etcd() {
    etcdctl_differential(
        "lock_with_a_command_same_as_etcd",
        &[
            ctl(&["put", "counter", "1"]),
            ctl(&[
                "lock",
                "mylock",
                "--",
                "sh",
                "-c",
                "echo ${ETCD_LOCK_KEY%/*}; test \"$ETCD_LOCK_REV\" -gt 1 && echo rev-after-put",
            ]),
            ctl(&["lock", "mylock", "--", "sh", "-c", "exit 3"]),
            ctl(&["get", "--prefix", "mylock/", "-w", "json"]),
        ],
    )
    .await;
}

/// A second `lock` blocks while the first holds the lock and acquires when the first is
/// interrupted (which unlocks and revokes its session).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_lock_acquires_after_holder_exits_same_as_etcd() {
    server_differential(
        "blocked_lock_acquires_after_holder_exits_same_as_etcd",
        |server, r: &mut Recorder| {
            Box::pin(async move {
                let mut holder = Background::spawn(server, &["lock", "L"]);
                r.note(
                    "holder prints its key",
                    json!(holder.next_line(server).await),
                );
                let mut waiter =
                    Background::spawn(server, &["lock", "L", "--", "echo", "acquired"]);
                r.fact("waiter queued", until_keys(server, "L/", 2).await);
                r.fact("waiter still waiting", waiter.still_waiting());
                r.note("holder exit after SIGINT", json!(holder.interrupt().await));
                r.note(
                    "waiter runs its command",
                    json!(waiter.next_line(server).await),
                );
                r.note("waiter exit", json!(waiter.exit_code().await));
                r.fact("no key left", until_keys(server, "L/", 0).await);
            })
        },
    )
    .await;
}

/// `elect NAME PROPOSAL` wins and prints its key and proposal; `elect -l` prints the leader and
/// each change; a second candidate waits and takes over when the leader is interrupted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_and_listen_same_as_etcd() {
    server_differential(
        "elect_and_listen_same_as_etcd",
        |server, r: &mut Recorder| {
            Box::pin(async move {
                let mut leader = Background::spawn(server, &["elect", "el", "v1"]);
                r.note("leader key", json!(leader.next_line(server).await));
                r.note("leader proposal", json!(leader.next_line(server).await));
                let mut listener = Background::spawn(server, &["elect", "-l", "el"]);
                r.note("listener: key", json!(listener.next_line(server).await));
                r.note("listener: value", json!(listener.next_line(server).await));
                let mut candidate = Background::spawn(server, &["elect", "el", "v2"]);
                r.fact("candidate queued", until_keys(server, "el/", 2).await);
                r.fact("candidate still waiting", candidate.still_waiting());
                r.note("leader exit after SIGINT", json!(leader.interrupt().await));
                r.note("candidate key", json!(candidate.next_line(server).await));
                r.note(
                    "candidate proposal",
                    json!(candidate.next_line(server).await),
                );
                r.note("listener: new key", json!(listener.next_line(server).await));
                r.note(
                    "listener: new value",
                    json!(listener.next_line(server).await),
                );
                r.note(
                    "candidate exit after SIGINT",
                    json!(candidate.interrupt().await),
                );
                r.note(
                    "listener exit after SIGINT",
                    json!(listener.interrupt().await),
                );
            })
        },
    )
    .await;
}
