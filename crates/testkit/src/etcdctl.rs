//! Running real `etcdctl`, and etcdctl differentials (same invocations against etcd and
//! leasehold, masked outputs compared).

use std::process::{Output, Stdio};

use serde_json::json;

use crate::*;

// ---------------------------------------------------------------------------------------------
// etcdctl
// ---------------------------------------------------------------------------------------------

/// Runs `ETCDCTL_API=3 etcdctl --endpoints=<endpoint> --command-timeout=5s <args>`.
pub async fn etcdctl(endpoint: &str, args: &[&str]) -> Output {
    etcdctl_with_stdin(endpoint, args, "").await
}

/// [`etcdctl`], asserting that it exited 0 (the output is in the failure message).
pub async fn etcdctl_ok(endpoint: &str, args: &[&str]) -> Output {
    let output = etcdctl(endpoint, args).await;
    assert!(
        output.status.success(),
        "etcdctl {args:?} failed\n{}",
        describe_output(&output)
    );
    output
}

/// [`etcdctl`] with `stdin` written to its standard input (for `txn`).
pub async fn etcdctl_with_stdin(endpoint: &str, args: &[&str], stdin: &str) -> Output {
    use tokio::io::AsyncWriteExt as _;
    let mut child = tokio::process::Command::new(etcdctl_binary())
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        .arg("--command-timeout=5s")
        .arg("--dial-timeout=3s")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn etcdctl");
    let mut input = child.stdin.take().expect("stdin piped");
    input
        .write_all(stdin.as_bytes())
        .await
        .expect("write etcdctl stdin");
    drop(input);
    match tokio::time::timeout(ETCDCTL_TIMEOUT, child.wait_with_output()).await {
        Ok(output) => output.expect("wait for etcdctl"),
        Err(_) => panic!("etcdctl {args:?} against {endpoint} ran longer than {ETCDCTL_TIMEOUT:?}"),
    }
}

/// Output as text, for assertion messages.
pub fn describe_output(output: &Output) -> String {
    format!(
        "exit: {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// One `etcdctl` invocation of an etcdctl differential.
#[derive(Clone, Debug)]
pub struct Ctl {
    pub args: Vec<String>,
    pub stdin: String,
}

/// `etcdctl <args>`.
pub fn ctl(args: &[&str]) -> Ctl {
    Ctl {
        args: args.iter().map(|a| a.to_string()).collect(),
        stdin: String::new(),
    }
}

/// `etcdctl <args>` with `stdin` as its input.
pub fn ctl_stdin(args: &[&str], stdin: &str) -> Ctl {
    Ctl {
        stdin: stdin.to_string(),
        ..ctl(args)
    }
}

/// Replaces what legitimately differs between two servers in etcdctl output: endpoints,
/// `cluster_id`/`member_id`/`raft_term` numbers, hex member IDs; and drops the client's own
/// JSON log lines (timestamps, random balancer names), which carry nothing the `Error:` line
/// does not.
pub fn mask_etcdctl_output(text: &str, server: &Server) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        if line.starts_with("{\"level\":") {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    let out = out
        .replace(&server.endpoint(), "<client-url>")
        .replace(&server.peer_url(), "<peer-url>")
        .replace(
            &format!("127.0.0.1:{}", server.client_port),
            "<client-addr>",
        );
    let mut out = mask_json_numbers(&out, &["cluster_id", "member_id", "raft_term"]);
    out = mask_hex_ids(&out);
    out
}

/// `"field":123` / `"field": 123` -> `"field":"<masked>"` for each field.
pub(crate) fn mask_json_numbers(text: &str, fields: &[&str]) -> String {
    let mut text = text.to_string();
    for field in fields {
        let needle = format!("\"{field}\":");
        let mut out = String::with_capacity(text.len());
        let mut rest = text.as_str();
        while let Some(at) = rest.find(&needle) {
            let after = at + needle.len();
            out.push_str(&rest[..after]);
            let tail = &rest[after..];
            let spaces = tail.len() - tail.trim_start().len();
            let tail = &tail[spaces..];
            let digits = tail.chars().take_while(|c| c.is_ascii_digit()).count();
            if digits > 0 {
                out.push_str("\"<masked>\"");
            } else {
                out.push_str(&rest[after..after + spaces]);
            }
            rest = &tail[digits..];
        }
        out.push_str(rest);
        text = out;
    }
    text
}

/// Rewrites every alphanumeric word of `text` with `f`, keeping everything between words.
pub fn map_words(text: &str, mut f: impl FnMut(&str) -> String) -> String {
    let mut out = String::with_capacity(text.len());
    let mut word = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            word.push(c);
        } else {
            if !word.is_empty() {
                out.push_str(&f(&word));
                word.clear();
            }
            out.push(c);
        }
    }
    if !word.is_empty() {
        out.push_str(&f(&word));
    }
    out
}

/// Lowercase hex words of 10 to 16 digits (member IDs as etcdctl prints them) -> `<id>`.
pub(crate) fn mask_hex_ids(text: &str) -> String {
    map_words(text, |word| {
        let is_id = (10..=16).contains(&word.len())
            && word
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
            && word.chars().any(|c| c.is_ascii_digit());
        if is_id {
            "<id>".to_owned()
        } else {
            word.to_owned()
        }
    })
}

/// Runs the same etcdctl invocations, in order, against a fresh etcd and a fresh leasehold and
/// asserts that exit codes and masked stdout/stderr agree.
pub async fn etcdctl_differential(name: &str, steps: &[Ctl]) {
    let (etcd, leasehold) = tokio::join!(Etcd::start(), Leasehold::start());
    etcdctl_differential_between(name, &etcd, &leasehold, steps).await;
}

/// [`etcdctl_differential`] against servers the caller started (with TLS, say: each server's
/// [`Server::etcdctl_flags`] come before the steps' own).
pub async fn etcdctl_differential_between(
    name: &str,
    etcd: &Server,
    leasehold: &Server,
    steps: &[Ctl],
) {
    let expected = record_etcdctl(etcd, steps).await;
    let actual = record_etcdctl(leasehold, steps).await;
    assert_same_recordings(name, etcd, &expected, leasehold, &actual);
}

/// Like [`etcdctl_differential`] for scenarios whose later invocations depend on earlier output
/// (for example an ID a command printed): `scenario` runs once against a fresh etcd and once
/// against a fresh leasehold (it gets the server, to run etcdctl or open a client), and both
/// recordings must agree.
pub async fn server_differential<F>(name: &str, scenario: F)
where
    F: for<'a> Fn(&'a Server, &'a mut Recorder) -> ScenarioFuture<'a>,
{
    let (etcd, leasehold) = tokio::join!(Etcd::start(), Leasehold::start());
    let mut recordings = Vec::with_capacity(2);
    for server in [&etcd, &leasehold] {
        let mut recorder = Recorder::default();
        if tokio::time::timeout(SCENARIO_TIMEOUT, scenario(server, &mut recorder))
            .await
            .is_err()
        {
            server.fail(&format!(
                "scenario ran longer than {SCENARIO_TIMEOUT:?} (after {} steps)",
                recorder.steps.len()
            ));
        }
        recordings.push(recorder);
    }
    assert_same_recordings(name, &etcd, &recordings[0], &leasehold, &recordings[1]);
}

pub(crate) async fn record_etcdctl(server: &Server, steps: &[Ctl]) -> Recorder {
    let mut recorder = Recorder::default();
    for step in steps {
        let flags = server.etcdctl_flags();
        let args: Vec<&str> = flags.iter().chain(&step.args).map(String::as_str).collect();
        let output = etcdctl_with_stdin(&server.endpoint(), &args, &step.stdin).await;
        let label = format!("etcdctl {}", step.args.join(" "));
        recorder.note(
            label,
            json!({
                "exit": output.status.code(),
                "stdout": mask_etcdctl_output(&String::from_utf8_lossy(&output.stdout), server),
                "stderr": mask_etcdctl_output(&String::from_utf8_lossy(&output.stderr), server),
            }),
        );
    }
    recorder
}
