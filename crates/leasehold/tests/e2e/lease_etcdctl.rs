//! etcdctl's lease commands (v3 API, Debian's 3.4) against leasehold, differentially against
//! real etcd: exit codes and outputs must agree after masking.
//!
//! etcdctl 3.4 cannot grant a lease with a chosen ID, so leases granted by `lease grant` have
//! random IDs. Scenarios that need such an ID later run step by step ([`server_differential`]):
//! each random ID is replaced, wherever it appears (as `%016x` hex or as decimal), by
//! `<lease-N>` with N its order of appearance, so a recording still shows *which* lease a line
//! names (the order of `lease list`, the lease of a key). The format of the ID itself is
//! checked as a recorded fact (16 lowercase hex digits, positive). Remaining TTLs depend on time
//! and are masked, with a recorded fact that they lie in the expected range; attached keys come
//! in unspecified order and are sorted.

use leasehold_testkit as common;
use leasehold_testkit::{find_remaining, sort_attached_keys, stdout_of};

use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use common::{
    Recorder, Server, ctl, describe_output, etcdctl, etcdctl_differential, mask_etcdctl_output,
    server_differential,
};
use etcd_client::LeaseGrantOptions;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, BufReader};

/// A fixed lease ID granted over gRPC: `000000001234abcd` in etcdctl's hex.
const FIXED_ID: i64 = 0x1234_abcd;
/// A lease ID no scenario grants.
const UNKNOWN_HEX: &str = "1234";

/// How long the background `lease keep-alive` may take to print its first line, and to exit
/// after the revoke.
const KEEP_ALIVE_FIRST_LINE_MAX: Duration = Duration::from_secs(10);
const KEEP_ALIVE_EXIT_MAX: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_commands_on_unknown_leases_same_as_etcd() {
    etcdctl_differential(
        "lease_commands_on_unknown_leases_same_as_etcd",
        &[
            ctl(&["lease", "list"]),
            ctl(&["lease", "grant", "9000000001"]),
            ctl(&["lease", "revoke", UNKNOWN_HEX]),
            ctl(&["lease", "timetolive", "1234abcd"]),
            ctl(&["lease", "timetolive", "--keys", "1234abcd"]),
            ctl(&["lease", "timetolive", "-w", "json", "1234abcd"]),
            ctl(&["lease", "keep-alive", "--once", UNKNOWN_HEX]),
            // Not --once: an unknown lease ends the keep-alive at once, with exit code 0.
            ctl(&["lease", "keep-alive", UNKNOWN_HEX]),
            ctl(&["put", &format!("--lease={UNKNOWN_HEX}"), "k", "v"]),
            ctl(&["get", "k"]),
            ctl(&["lease", "list", "-w", "json"]),
        ],
    )
    .await;
}

/// Random lease IDs seen so far, and the recording.
struct Session<'a> {
    server: &'a Server,
    r: &'a mut Recorder,
    ids: Vec<i64>,
}

impl Session<'_> {
    /// `<lease-N>` for a known random ID, hex or decimal; every other word unchanged.
    fn mask_ids(&self, text: &str) -> String {
        common::map_words(text, |word| {
            let known = self
                .ids
                .iter()
                .position(|id| word == format!("{id:016x}") || word == id.to_string());
            match known {
                Some(n) => format!("<lease-{n}>"),
                None => word.to_owned(),
            }
        })
    }

    /// Runs etcdctl with `args` (`{N}` stands for random lease N, as `%016x` like etcdctl prints it) and records exit code
    /// and masked output; returns the raw output.
    async fn run(&mut self, args: &[&str]) -> Output {
        self.run_granting(args, |_| None).await
    }

    /// Like [`Session::run`] for a command that grants a lease: `granted` extracts the new
    /// lease's ID from the output, which then is masked as the next `<lease-N>` already in this
    /// step's recording.
    async fn run_granting(
        &mut self,
        args: &[&str],
        granted: impl Fn(&Output) -> Option<i64>,
    ) -> Output {
        let args: Vec<String> = args
            .iter()
            .map(|arg| {
                let mut arg = arg.to_string();
                for (n, id) in self.ids.iter().enumerate() {
                    arg = arg.replace(&format!("{{{n}}}"), &format!("{id:016x}"));
                }
                arg
            })
            .collect();
        let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = etcdctl(&self.server.endpoint(), &arg_refs).await;
        if let Some(id) = granted(&output) {
            self.ids.push(id);
        }
        let label = self.mask_ids(&format!("etcdctl {}", args.join(" ")));
        let stdout = self.mask(&String::from_utf8_lossy(&output.stdout));
        let stderr = self.mask(&String::from_utf8_lossy(&output.stderr));
        self.r.note(
            label,
            json!({ "exit": output.status.code(), "stdout": stdout, "stderr": stderr }),
        );
        output
    }

    /// Time and order first (on the raw output): `remaining(NNs)` and a JSON `ttl` next to a
    /// `granted-ttl` are masked, attached keys sorted; then known random IDs; then the
    /// harness's masking.
    fn mask(&self, text: &str) -> String {
        let mut canonical = String::with_capacity(text.len());
        for line in text.lines() {
            let line = match serde_json::from_str::<Value>(line) {
                // etcdctl's own log lines are left for the harness to drop.
                Ok(Value::Object(mut object)) if !object.contains_key("level") => {
                    if object.contains_key("granted-ttl")
                        && object
                            .get("ttl")
                            .and_then(Value::as_i64)
                            .is_some_and(|t| t >= 0)
                    {
                        object.insert("ttl".into(), json!("<remaining>"));
                    }
                    if let Some(Value::Array(keys)) = object.get_mut("keys") {
                        keys.sort_by_key(Value::to_string);
                    }
                    Value::Object(object).to_string()
                }
                _ => mask_remaining_and_sort_keys(line),
            };
            canonical.push_str(&line);
            canonical.push('\n');
        }
        mask_etcdctl_output(&self.mask_ids(&canonical), self.server)
    }

    fn note(&mut self, label: &str, value: Value) {
        self.r.note(label, value);
    }
}

/// `remaining(99s)` -> `remaining(<n>s)`; `attached keys([b a])` -> `attached keys([a b])`.
fn mask_remaining_and_sort_keys(line: &str) -> String {
    let mut line = line.to_string();
    if let Some((at, len, _)) = find_remaining(&line) {
        line.replace_range(at..at + len, "remaining(<n>s)");
    }
    sort_attached_keys(&mut line);
    line
}

/// The remaining seconds of a `lease timetolive` line.
fn remaining_seconds(stdout: &str) -> Option<i64> {
    let (at, len, _) = find_remaining(stdout)?;
    stdout[at + "remaining(".len()..at + len - 2].parse().ok()
}

/// The ID of a `lease <16 hex> granted with TTL(<ttl>s)` line, if the whole output is exactly
/// that line.
fn granted_id(stdout: &str, ttl: i64) -> Option<i64> {
    let line = stdout.strip_suffix('\n')?;
    let hex = line
        .strip_prefix("lease ")?
        .strip_suffix(&format!(" granted with TTL({ttl}s)"))?;
    let well_formed = hex.len() == 16
        && hex
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c));
    if !well_formed {
        return None;
    }
    i64::from_str_radix(hex, 16).ok().filter(|id| *id > 0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_grant_timetolive_list_keepalive_revoke_same_as_etcd() {
    server_differential(
        "lease_grant_timetolive_list_keepalive_revoke_same_as_etcd",
        |server, r| {
            Box::pin(async move {
                let mut s = Session {
                    server,
                    r,
                    ids: Vec::new(),
                };
                s.run(&["lease", "list"]).await;

                // lease grant: `lease <%016x> granted with TTL(60s)`.
                let grant = s
                    .run_granting(&["lease", "grant", "60"], |o| granted_id(&stdout_of(o), 60))
                    .await;
                let first = granted_id(&stdout_of(&grant), 60);
                s.note(
                    "lease grant 60 printed `lease <16 hex digits> granted with TTL(60s)`",
                    json!(first.is_some()),
                );
                let Some(first) = first else {
                    s.note("stopped: no lease ID", json!(describe_output(&grant)));
                    return;
                };

                // -w json: the header flattened, ID in decimal.
                let json_id = |o: &Output| {
                    serde_json::from_slice::<Value>(&o.stdout)
                        .ok()
                        .and_then(|v| v["ID"].as_i64())
                };
                let grant = s
                    .run_granting(&["lease", "grant", "-w", "json", "30"], json_id)
                    .await;
                let second = json_id(&grant);
                s.note(
                    "lease grant -w json 30 printed a positive ID",
                    json!(second.is_some_and(|id| id > 0 && id != first)),
                );
                if second.is_none() {
                    s.note("stopped: no lease ID", json!(describe_output(&grant)));
                    return;
                }

                // Ascending remaining time: the TTL-30 lease first.
                s.run(&["lease", "list"]).await;
                s.run(&["lease", "list", "-w", "json"]).await;

                s.run(&["put", "--lease={0}", "foo2", "b"]).await;
                s.run(&["put", "--lease={0}", "foo", "a"]).await;
                s.run(&["put", "bar", "c"]).await;

                let ttl = s.run(&["lease", "timetolive", "{0}"]).await;
                let remaining = remaining_seconds(&stdout_of(&ttl));
                s.note(
                    "remaining of the TTL-60 lease is in 57..=59",
                    json!(remaining.is_some_and(|r| (57..=59).contains(&r))),
                );
                let ttl = s.run(&["lease", "timetolive", "--keys", "{0}"]).await;
                let remaining = remaining_seconds(&stdout_of(&ttl));
                s.note(
                    "remaining (with --keys) is in 57..=59",
                    json!(remaining.is_some_and(|r| (57..=59).contains(&r))),
                );
                let ttl = s
                    .run(&["lease", "timetolive", "--keys", "-w", "json", "{0}"])
                    .await;
                let remaining = serde_json::from_slice::<Value>(&ttl.stdout)
                    .ok()
                    .and_then(|v| v["ttl"].as_i64());
                s.note(
                    "remaining (-w json) is in 57..=59",
                    json!(remaining.is_some_and(|r| (57..=59).contains(&r))),
                );
                s.run(&["lease", "timetolive", "{1}"]).await;

                // The key's lease, in decimal.
                s.run(&["get", "-w", "json", "foo"]).await;
                s.run(&["get", "--prefix", "foo"]).await;

                s.run(&["lease", "keep-alive", "--once", "{0}"]).await;
                s.run(&["lease", "keep-alive", "--once", "-w", "json", "{1}"])
                    .await;

                // put --ignore-lease keeps the lease; a plain put detaches.
                s.run(&["put", "--ignore-lease", "foo", "a2"]).await;
                s.run(&["put", "--ignore-lease", "missing", "x"]).await;
                s.run(&["put", "foo2", "detached"]).await;
                s.run(&["lease", "timetolive", "--keys", "{0}"]).await;

                s.run(&["lease", "revoke", "{0}"]).await;
                s.run(&["get", "--prefix", ""]).await;
                s.run(&["lease", "revoke", "{0}"]).await;
                s.run(&["lease", "timetolive", "{0}"]).await;
                s.run(&["lease", "timetolive", "--keys", "-w", "json", "{0}"])
                    .await;
                s.run(&["lease", "keep-alive", "--once", "{0}"]).await;
                s.run(&["put", "--lease={0}", "foo", "x"]).await;
                s.run(&["lease", "list"]).await;
                s.run(&["lease", "revoke", "-w", "json", "{1}"]).await;
                s.run(&["lease", "list"]).await;

                // A lease with a known ID, granted over gRPC: its decimal ID shows in JSON.
                let mut client = server.client().await;
                let granted = client
                    .lease_grant(100, Some(LeaseGrantOptions::new().with_id(FIXED_ID)))
                    .await;
                s.note("grant 0x1234abcd over gRPC", json!(granted.is_ok()));
                s.run(&["put", "--lease=1234abcd", "fixed", "v"]).await;
                s.run(&["get", "-w", "json", "fixed"]).await;
                s.run(&["lease", "list", "-w", "json"]).await;
                s.run(&["lease", "timetolive", "--keys", "1234abcd"]).await;
                s.run(&["lease", "keep-alive", "--once", "1234abcd"]).await;
                s.run(&["lease", "revoke", "1234abcd"]).await;
                s.run(&["get", "fixed"]).await;
            })
        },
    )
    .await;
}

/// `lease keep-alive <id>` (not --once) keeps printing `keepalived` lines until the lease is
/// revoked, then prints `lease <id> expired or revoked.` and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_keep_alive_ends_when_the_lease_is_revoked_same_as_etcd() {
    server_differential(
        "lease_keep_alive_ends_when_the_lease_is_revoked_same_as_etcd",
        |server, r| {
            Box::pin(async move {
                const ID: i64 = 0xabc;
                let mut client = server.client().await;
                // TTL 6: etcdctl renews every TTL/3 = 2 s, so the revoke is noticed within ~2 s.
                r.record(
                    "grant 0xabc TTL 6 over gRPC",
                    client
                        .lease_grant(6, Some(LeaseGrantOptions::new().with_id(ID)))
                        .await,
                );
                let mut child = tokio::process::Command::new("etcdctl")
                    .env("ETCDCTL_API", "3")
                    .arg(format!("--endpoints={}", server.endpoint()))
                    .args(["--command-timeout=5s", "--dial-timeout=3s"])
                    .args(["lease", "keep-alive", "abc"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .kill_on_drop(true)
                    .spawn()
                    .expect("spawn etcdctl lease keep-alive");
                let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
                let first =
                    tokio::time::timeout(KEEP_ALIVE_FIRST_LINE_MAX, lines.next_line()).await;
                let first = match first {
                    Ok(Ok(Some(line))) => line,
                    other => {
                        r.note("first line", json!(format!("none: {other:?}")));
                        return;
                    }
                };
                r.note("first line", json!(first));
                r.record("revoke 0xabc over gRPC", client.lease_revoke(ID).await);

                let started = Instant::now();
                let mut rest = Vec::new();
                let exit = loop {
                    let left = KEEP_ALIVE_EXIT_MAX.saturating_sub(started.elapsed());
                    match tokio::time::timeout(left, lines.next_line()).await {
                        Ok(Ok(Some(line))) => rest.push(line),
                        Ok(Ok(None)) => {
                            let status = tokio::time::timeout(left, child.wait()).await;
                            break json!(format!("{:?}", status.map(|s| s.map(|s| s.code()))));
                        }
                        Ok(Err(e)) => break json!(format!("read error: {e}")),
                        Err(_) => break json!("still running after the revoke"),
                    }
                };
                let last = rest.pop();
                r.note(
                    "after the revoke",
                    json!({
                        "exit": exit,
                        "last line": last,
                        "lines before it are all the first line": rest.iter().all(|l| *l == first),
                    }),
                );
                let mut stderr = String::new();
                if let Some(mut err) = child.stderr.take() {
                    use tokio::io::AsyncReadExt as _;
                    let _ = tokio::time::timeout(
                        Duration::from_secs(5),
                        err.read_to_string(&mut stderr),
                    )
                    .await;
                }
                r.note("stderr", json!(mask_etcdctl_output(&stderr, server)));
            })
        },
    )
    .await;
}
