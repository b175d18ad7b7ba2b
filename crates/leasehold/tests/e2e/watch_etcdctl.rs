//! `etcdctl watch` (v3 API, Debian's 3.4) against leasehold, differentially against real etcd:
//! exit codes and outputs must agree after the harness's masking.
//!
//! `etcdctl watch` runs until it is killed, so each invocation runs in the background
//! ([`BackgroundWatch`]): the test reads its output until the line it expects last appears
//! (bounded by [`WATCH_OUTPUT_WAIT_MAX`]), then kills it and records exit status, stdout and
//! stderr. A watch that ends by itself (a compacted start revision) is waited for instead.
//!
//! Determinism: every watch is given `--rev`, so it replays from a known revision whether or
//! not it was established before the writes; live delivery is still exercised by waiting for
//! each write's output before the next write.

use leasehold_testkit as common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{Recorder, Server, etcdctl, mask_etcdctl_output, server_differential};
use serde_json::json;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

/// How long a background watch may take to print what a step waits for, or to exit by itself.
const WATCH_OUTPUT_WAIT_MAX: Duration = Duration::from_secs(10);
/// How long reading the rest of stderr and reaping may take after the kill.
const WATCH_REAP_MAX: Duration = Duration::from_secs(5);

/// A running `etcdctl watch`.
struct BackgroundWatch<'a> {
    server: &'a Server,
    label: String,
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    stdout: String,
    /// Set once stdout reached its end (the process is exiting).
    ended: bool,
}

impl<'a> BackgroundWatch<'a> {
    fn spawn(server: &'a Server, args: &[&str]) -> BackgroundWatch<'a> {
        let mut child = tokio::process::Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", server.endpoint()))
            .args(["--command-timeout=5s", "--dial-timeout=3s"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn etcdctl watch");
        let lines = BufReader::new(child.stdout.take().expect("stdout piped")).lines();
        BackgroundWatch {
            server,
            label: format!("etcdctl {}", args.join(" ")),
            child,
            lines,
            stdout: String::new(),
            ended: false,
        }
    }

    /// Reads stdout until `done` holds for everything read so far, stdout ends, or
    /// [`WATCH_OUTPUT_WAIT_MAX`] passes; returns whether `done` held.
    async fn wait_for(&mut self, done: impl Fn(&str) -> bool) -> bool {
        let started = Instant::now();
        while !done(&self.stdout) {
            if self.ended {
                return false;
            }
            let left = WATCH_OUTPUT_WAIT_MAX.saturating_sub(started.elapsed());
            match tokio::time::timeout(left, self.lines.next_line()).await {
                Ok(Ok(Some(line))) => {
                    self.stdout.push_str(&line);
                    self.stdout.push('\n');
                }
                Ok(Ok(None)) | Ok(Err(_)) => self.ended = true,
                Err(_) => return false,
            }
        }
        true
    }

    /// Waits until the output has the line `line`.
    async fn wait_for_line(&mut self, line: &str) -> bool {
        self.wait_for(|out| out.lines().any(|l| l == line)).await
    }

    /// Kills the process if it still runs and records exit, stdout and stderr under its label
    /// (with `waited_for`, whether what the step waited for appeared).
    async fn finish(mut self, r: &mut Recorder, waited_for: bool) {
        let exit = match self.child.try_wait().expect("try_wait") {
            Some(status) => json!(status.code()),
            None if self.ended => {
                // stdout closed: the process is on its way out.
                match tokio::time::timeout(WATCH_REAP_MAX, self.child.wait()).await {
                    Ok(status) => json!(status.expect("wait").code()),
                    Err(_) => json!("stdout closed but the process did not exit"),
                }
            }
            None => {
                self.child.start_kill().expect("kill etcdctl watch");
                let _ = tokio::time::timeout(WATCH_REAP_MAX, self.child.wait()).await;
                json!("killed by the test")
            }
        };
        // Whatever stdout still holds (the process has exited, so this ends).
        while let Ok(Ok(Some(line))) =
            tokio::time::timeout(WATCH_REAP_MAX, self.lines.next_line()).await
        {
            self.stdout.push_str(&line);
            self.stdout.push('\n');
        }
        let mut stderr = String::new();
        if let Some(mut err) = self.child.stderr.take() {
            let _ = tokio::time::timeout(WATCH_REAP_MAX, err.read_to_string(&mut stderr)).await;
        }
        r.note(
            self.label,
            json!({
                "saw what it waited for": waited_for,
                "exit": exit,
                "stdout": mask_etcdctl_output(&mask_fields_header(&self.stdout), self.server),
                "stderr": mask_etcdctl_output(&stderr, self.server),
            }),
        );
    }
}

/// `-w fields` prints the header as `"ClusterID" : <n>` lines, which the harness's masking (of
/// JSON fields) does not cover: mask the numbers that differ between any two clusters.
fn mask_fields_header(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        match ["\"ClusterID\" : ", "\"MemberID\" : ", "\"RaftTerm\" : "]
            .into_iter()
            .find(|field| line.starts_with(field))
        {
            Some(field) => {
                out.push_str(field);
                out.push_str("<masked>");
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// Runs a one-shot etcdctl command and records it, like the harness's etcdctl differential.
async fn run(server: &Server, r: &mut Recorder, args: &[&str]) {
    let output = etcdctl(&server.endpoint(), args).await;
    r.note(
        format!("etcdctl {}", args.join(" ")),
        json!({
            "exit": output.status.code(),
            "stdout": mask_etcdctl_output(&String::from_utf8_lossy(&output.stdout), server),
            "stderr": mask_etcdctl_output(&String::from_utf8_lossy(&output.stderr), server),
        }),
    );
}

/// The store's revision.
async fn revision(server: &Server) -> i64 {
    common::revision(&mut server.client().await).await
}

/// `watch --rev=N` replays history: simple, `--prev-kv`, single key, `-w json` and
/// `-w fields` output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_replays_history_from_a_revision_same_as_etcd() {
    server_differential(
        "watch_replays_history_from_a_revision_same_as_etcd",
        |server, r| {
            Box::pin(async move {
                run(server, r, &["put", "a", "1"]).await;
                run(server, r, &["put", "b", "2"]).await;
                run(server, r, &["put", "a", "3"]).await;
                run(server, r, &["del", "b"]).await;
                run(server, r, &["put", "c", "two words"]).await;
                run(server, r, &["put", "fence", "end"]).await;

                for args in [
                    &["watch", "--rev=1", "--prefix", ""][..],
                    &["watch", "--rev=2", "--prev-kv", "--prefix", ""],
                    &["watch", "--rev=3", "--prefix", "", "--hex"],
                ] {
                    let mut watch = BackgroundWatch::spawn(server, args);
                    let seen = watch
                        .wait_for(|out| out.lines().any(|l| l == "end" || l == "\\x65\\x6e\\x64"))
                        .await;
                    watch.finish(r, seen).await;
                }
                // A single key: the last line is a's last value.
                let mut watch = BackgroundWatch::spawn(server, &["watch", "--rev=2", "a"]);
                let seen = watch.wait_for_line("3").await;
                watch.finish(r, seen).await;
                // JSON: one line per response; keys and values in base64 ("ZmVuY2U=" is "fence").
                let mut watch = BackgroundWatch::spawn(
                    server,
                    &["watch", "-w", "json", "--rev=1", "--prefix", ""],
                );
                let seen = watch.wait_for(|out| out.contains("ZmVuY2U=")).await;
                watch.finish(r, seen).await;
                let mut watch = BackgroundWatch::spawn(
                    server,
                    &["watch", "-w", "json", "--prev-kv", "--rev=4", "a"],
                );
                let seen = watch
                    .wait_for(|out| out.contains("\"mod_revision\":4"))
                    .await;
                watch.finish(r, seen).await;
                let mut watch = BackgroundWatch::spawn(
                    server,
                    &["watch", "-w", "fields", "--rev=1", "--prefix", ""],
                );
                let seen = watch
                    // The event's last line, so that the kill cannot cut the output short.
                    .wait_for(|out| out.contains("\"Value\" : \"end\"\n\"Lease\" : 0\n"))
                    .await;
                watch.finish(r, seen).await;
            })
        },
    )
    .await;
}

/// `watch k` running while puts, other keys' puts and a delete happen: each write's output
/// appears before the next write; with and without `--prev-kv`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_in_the_background_sees_writes_as_they_happen_same_as_etcd() {
    server_differential(
        "watch_in_the_background_sees_writes_as_they_happen_same_as_etcd",
        |server, r| {
            Box::pin(async move {
                run(server, r, &["put", "k", "v0"]).await;
                let from = format!("--rev={}", revision(server).await + 1);
                let mut plain = BackgroundWatch::spawn(server, &["watch", &from, "k"]);
                let mut prev = BackgroundWatch::spawn(server, &["watch", &from, "--prev-kv", "k"]);
                let mut prefix = BackgroundWatch::spawn(server, &["watch", &from, "--prefix", "k"]);
                let mut delivered = Vec::new();
                for (write, expect) in [
                    (&["put", "k", "v1"][..], "v1"),
                    (&["put", "other", "x"], ""),
                    (&["put", "k2", "w"], "w"),
                    (&["put", "k", "v2"], "v2"),
                    (&["del", "k"], "DELETE"),
                    (&["put", "k", "v3"], "v3"),
                ] {
                    run(server, r, write).await;
                    if expect.is_empty() {
                        continue;
                    }
                    // The prefix watcher sees every k* write; wait for it to show up there
                    // (live delivery) before the next write.
                    delivered.push(prefix.wait_for_line(expect).await);
                }
                r.note("each write showed up before the next", json!(delivered));
                let seen = plain.wait_for_line("v3").await;
                plain.finish(r, seen).await;
                let seen = prev.wait_for_line("v3").await;
                prev.finish(r, seen).await;
                let seen = prefix.wait_for_line("v3").await;
                prefix.finish(r, seen).await;
            })
        },
    )
    .await;
}

/// `watch --rev=<compacted>`: etcdctl reports the cancellation and exits by itself; at the
/// compaction point it replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_from_a_compacted_revision_fails_same_as_etcd() {
    server_differential(
        "watch_from_a_compacted_revision_fails_same_as_etcd",
        |server, r| {
            Box::pin(async move {
                for n in 1..=5 {
                    run(server, r, &["put", "k", &format!("v{n}")]).await;
                }
                run(server, r, &["compact", "4"]).await;
                for args in [
                    &["watch", "--rev=2", "k"][..],
                    &["watch", "--rev=3", "--prefix", ""],
                    &["watch", "-w", "json", "--rev=1", "k"],
                ] {
                    let mut watch = BackgroundWatch::spawn(server, args);
                    // Nothing to wait for: it must end by itself.
                    let exited = !watch.wait_for(|_| false).await && watch.ended;
                    watch.finish(r, exited).await;
                }
                let mut watch = BackgroundWatch::spawn(server, &["watch", "--rev=4", "k"]);
                let seen = watch.wait_for_line("v5").await;
                watch.finish(r, seen).await;
            })
        },
    )
    .await;
}
