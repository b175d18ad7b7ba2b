//! The `leasehold` client subcommands against etcdctl 3.4: the same scenario runs with
//! `etcdctl` against one fresh server and with `leasehold <command>` against a twin fresh server
//! of the same kind, and exit codes, stdout and stderr must agree after masking.
//!
//! The product under test is the CLI, so the twins are leasehold servers; where cheap the
//! scenarios also run on etcd twins (our CLI against etcd must match etcdctl against etcd).
//! `lock` and `elect` run against both servers' v3lock/v3election services
//! ([`LOCK_ELECT_SERVERS`]).
//!
//! Masking (see [`Masker`]): what legitimately differs between two servers (cluster and member
//! IDs, ports: the harness's `mask_etcdctl_output`), random lease IDs (each distinct one becomes
//! `<lease-N>` in order of appearance, in `%016x`, `%x` and decimal form, also inside base64
//! JSON keys, which are decoded first), remaining TTLs (masked, with a recorded fact that each
//! lies within 3 s of its granted TTL), and the order of a lease's attached keys (sorted).
//! Flag errors are compared on exit code and stderr: etcdctl also prints its usage page on
//! stdout, which we do not (docs/cli.md).
//!
//! Long-running commands (watch, keep-alive, lock, elect) run in the background ([`Bg`]); a test
//! waits (bounded) for the output it expects, then signals them and records how they ended.

use leasehold_testkit as common;
use leasehold_testkit::{find_remaining, sort_attached_keys};

use std::os::unix::process::ExitStatusExt as _;
use std::process::{ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{
    ETCDCTL_TIMEOUT, Etcd, Kind, Leasehold, Recorder, Server, assert_same_recordings,
    etcdctl_with_stdin, free_port, map_words, mask_etcdctl_output,
};
use etcd_client::{DeleteOptions, Txn, TxnOp};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt as _;

/// The binary under test.
const CLI: &str = env!("CARGO_BIN_EXE_leasehold");

/// Servers the `lock` and `elect` scenarios run against (both serve v3lock and v3election).
const LOCK_ELECT_SERVERS: &[Kind] = &[Kind::Leasehold, Kind::Etcd];

/// How long a background command may take to print what a test waits for, or to exit.
const OUTPUT_WAIT_MAX: Duration = Duration::from_secs(10);
/// How long a signalled background command may take to exit.
const EXIT_WAIT_MAX: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(20);

/// The client subcommands (where the global flags go on our side).
const COMMANDS: &[&str] = &["put", "get", "del", "watch", "lease", "lock", "elect"];

// ---------------------------------------------------------------------------------------------
// Running the two tools
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tool {
    Etcdctl,
    Cli,
}

async fn start(kind: Kind) -> Server {
    match kind {
        Kind::Leasehold => Leasehold::start().await,
        Kind::Etcd => Etcd::start().await,
    }
}

/// The CLI's command line: etcdctl's global flags (as the harness passes them to etcdctl) right
/// after the command word, so that they precede any `--`.
fn cli_args(endpoint: &str, args: &[String]) -> Vec<String> {
    let at = args
        .iter()
        .position(|a| COMMANDS.contains(&a.as_str()))
        .map_or(0, |i| i + 1);
    let mut out = args[..at].to_vec();
    out.push(format!("--endpoints={endpoint}"));
    out.push("--command-timeout=5s".to_string());
    out.push("--dial-timeout=3s".to_string());
    out.extend_from_slice(&args[at..]);
    out
}

fn command(tool: Tool, endpoint: &str, args: &[String]) -> tokio::process::Command {
    let mut c = match tool {
        Tool::Etcdctl => {
            let mut c = tokio::process::Command::new("etcdctl");
            c.env("ETCDCTL_API", "3")
                .arg(format!("--endpoints={endpoint}"))
                .args(["--command-timeout=5s", "--dial-timeout=3s"])
                .args(args);
            c
        }
        Tool::Cli => {
            let mut c = tokio::process::Command::new(CLI);
            c.args(cli_args(endpoint, args));
            c
        }
    };
    for var in [
        "ETCDCTL_ENDPOINTS",
        "ETCDCTL_WRITE_OUT",
        "ETCDCTL_HEX",
        "ETCDCTL_DIAL_TIMEOUT",
        "ETCDCTL_COMMAND_TIMEOUT",
        "ETCDCTL_WATCH_KEY",
        "ETCDCTL_WATCH_RANGE_END",
        "LEASEHOLD_LOG",
    ] {
        c.env_remove(var);
    }
    c.kill_on_drop(true);
    c
}

/// Runs one command to completion (bounded by [`ETCDCTL_TIMEOUT`]).
async fn run(tool: Tool, endpoint: &str, args: &[String], stdin: &str) -> Output {
    if tool == Tool::Etcdctl {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        return etcdctl_with_stdin(endpoint, &args, stdin).await;
    }
    use tokio::io::AsyncWriteExt as _;
    let mut child = command(tool, endpoint, args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn leasehold");
    let mut input = child.stdin.take().expect("stdin piped");
    input
        .write_all(stdin.as_bytes())
        .await
        .expect("write stdin");
    drop(input);
    match tokio::time::timeout(ETCDCTL_TIMEOUT, child.wait_with_output()).await {
        Ok(output) => output.expect("wait for leasehold"),
        Err(_) => panic!("leasehold {args:?} ran longer than {ETCDCTL_TIMEOUT:?}"),
    }
}

/// A command running in the background, its output collected as it comes.
struct Bg {
    child: tokio::process::Child,
    stdout: Arc<Mutex<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    readers: Vec<tokio::task::JoinHandle<()>>,
}

impl Bg {
    fn spawn(tool: Tool, endpoint: &str, args: &[String], env: &[(&str, String)]) -> Bg {
        let mut c = command(tool, endpoint, args);
        for (k, v) in env {
            c.env(k, v);
        }
        let mut child = c
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn background command");
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let mut readers = Vec::new();
        let out = child.stdout.take().expect("stdout piped");
        let err = child.stderr.take().expect("stderr piped");
        for (mut pipe, buf) in [
            (
                Box::new(out) as Box<dyn tokio::io::AsyncRead + Send + Unpin>,
                stdout.clone(),
            ),
            (Box::new(err), stderr.clone()),
        ] {
            readers.push(tokio::spawn(async move {
                let mut chunk = [0u8; 4096];
                while let Ok(n) = pipe.read(&mut chunk).await {
                    if n == 0 {
                        break;
                    }
                    buf.lock().unwrap().extend_from_slice(&chunk[..n]);
                }
            }));
        }
        Bg {
            child,
            stdout,
            stderr,
            readers,
        }
    }

    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout.lock().unwrap()).into_owned()
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits (bounded) until stdout satisfies `done`; false if it did not in time.
    async fn wait_stdout(&self, done: impl Fn(&str) -> bool) -> bool {
        let started = tokio::time::Instant::now();
        while started.elapsed() < OUTPUT_WAIT_MAX {
            if done(&self.stdout()) {
                return true;
            }
            tokio::time::sleep(POLL).await;
        }
        done(&self.stdout())
    }

    fn signal(&self, signal: &str) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args([&format!("-{signal}"), &pid.to_string()])
                .status();
        }
    }

    /// Waits (bounded) for the exit; SIGKILLs it if it does not exit in time.
    async fn finish(mut self) -> (Option<ExitStatus>, String, String) {
        let status = match tokio::time::timeout(EXIT_WAIT_MAX, self.child.wait()).await {
            Ok(status) => status.ok(),
            Err(_) => {
                let _ = self.child.kill().await;
                None
            }
        };
        for reader in self.readers.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
        }
        let stdout = self.stdout();
        let stderr = String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned();
        (status, stdout, stderr)
    }
}

/// Exit code, or the signal that ended the process, or that it had to be killed.
fn exit_json(status: Option<ExitStatus>) -> Value {
    match status {
        None => json!("did not exit in time"),
        Some(s) => match (s.code(), s.signal()) {
            (Some(code), _) => json!(code),
            (None, Some(signal)) => json!(format!("signal {signal}")),
            _ => json!(format!("{s}")),
        },
    }
}

// ---------------------------------------------------------------------------------------------
// Masking
// ---------------------------------------------------------------------------------------------

/// Masks one side's output; remembers the random lease IDs it has seen.
#[derive(Default)]
struct Masker {
    ids: Vec<i64>,
    /// Facts about masked remaining TTLs: each is within 3 s of its granted TTL.
    remaining_ok: Vec<bool>,
}

/// Only server-chosen (random, large) IDs are masked; small fixed IDs a test uses stay visible.
const RANDOM_ID_MIN: i64 = 1 << 32;

impl Masker {
    /// Lease IDs in `text`, in order: `lease <hex>`, a `lease list` line, `<name>/<hex>` (lock
    /// and elect keys), and the decimal `"ID":`, `"id":`, `"lease":` of JSON.
    fn discover(&mut self, text: &str) {
        let is_hex = |w: &str| !w.is_empty() && w.chars().all(|c| c.is_ascii_hexdigit());
        for line in text.lines() {
            let trimmed = line.trim();
            if trimmed.len() == 16 && is_hex(trimmed) {
                self.add(i64::from_str_radix(trimmed, 16).ok());
            }
            let mut previous_word = "";
            let mut start = None;
            let chars: Vec<(usize, char)> = line.char_indices().collect();
            for (i, &(at, c)) in chars.iter().enumerate() {
                let alnum = c.is_ascii_alphanumeric();
                if alnum && start.is_none() {
                    start = Some(at);
                }
                let last = i + 1 == chars.len();
                if let Some(s) = start
                    && (!alnum || last)
                {
                    let end = if alnum && last { at + c.len_utf8() } else { at };
                    let word = &line[s..end];
                    let before = &line[..s];
                    let key_suffix = before.ends_with('/') && word.len() >= 8;
                    let after_lease = previous_word == "lease" && before.ends_with(' ');
                    if is_hex(word) && (key_suffix || after_lease) {
                        self.add(i64::from_str_radix(word, 16).ok());
                    } else if word.chars().all(|c| c.is_ascii_digit())
                        && ["\"ID\":", "\"id\":", "\"lease\":"]
                            .iter()
                            .any(|p| before.ends_with(p))
                    {
                        self.add(word.parse().ok());
                    }
                    previous_word = word;
                    start = None;
                }
            }
        }
    }

    fn add(&mut self, id: Option<i64>) {
        if let Some(id) = id
            && id >= RANDOM_ID_MIN
            && !self.ids.contains(&id)
        {
            self.ids.push(id);
        }
    }

    /// `{N}` in an argument -> lease N as `%016x`.
    fn substitute(&self, arg: &str) -> String {
        let mut arg = arg.to_string();
        for (n, id) in self.ids.iter().enumerate() {
            arg = arg.replace(&format!("{{{n}}}"), &format!("{id:016x}"));
        }
        arg
    }

    fn mask_ids(&self, text: &str) -> String {
        map_words(text, |word| {
            let known = self.ids.iter().position(|id| {
                word == format!("{id:016x}") || word == format!("{id:x}") || word == id.to_string()
            });
            match known {
                Some(n) => format!("<lease-{n}>"),
                None => word.to_owned(),
            }
        })
    }

    /// The whole masking of one output: canonical form, IDs, then the harness's masking.
    fn mask(&mut self, text: &str, server_or_endpoint: Masking<'_>) -> String {
        let mut canonical = String::with_capacity(text.len());
        for line in text.lines() {
            canonical.push_str(&self.canonical_line(line));
            canonical.push('\n');
        }
        self.discover(&canonical);
        let masked = self.mask_ids(&canonical);
        match server_or_endpoint {
            Masking::Server(server) => mask_etcdctl_output(&masked, server),
            Masking::Endpoint(endpoint) => masked
                .lines()
                .filter(|l| !l.starts_with("{\"level\":"))
                .map(|l| l.replace(endpoint, "<endpoint>") + "\n")
                .collect(),
        }
    }

    /// JSON: base64 keys and values decoded in place (field order kept), a lease's keys
    /// sorted, a remaining TTL masked. Simple: `remaining(Ns)` masked, attached keys sorted.
    fn canonical_line(&mut self, line: &str) -> String {
        if let Ok(Value::Object(object)) = serde_json::from_str::<Value>(line) {
            if object.contains_key("level") {
                return line.to_string();
            }
            let mut line = line.to_string();
            let mut encoded = Vec::new();
            collect_base64(&Value::Object(object.clone()), &mut encoded);
            for b64 in encoded {
                if let Some(text) = base64_decode(&b64).and_then(|b| String::from_utf8(b).ok()) {
                    line = line.replace(&format!("\"{b64}\""), &format!("\"b64({text})\""));
                }
            }
            if let Some(at) = line.find("\"keys\":[")
                && let Some(len) = line[at..].find(']')
            {
                let start = at + "\"keys\":[".len();
                let end = at + len;
                let mut keys: Vec<&str> = line[start..end].split(',').collect();
                keys.sort_unstable();
                let sorted = keys.join(",");
                line.replace_range(start..end, &sorted);
            }
            if let (Some(ttl), Some(granted)) = (
                object.get("ttl").and_then(Value::as_i64),
                object.get("granted-ttl").and_then(Value::as_i64),
            ) && ttl >= 0
            {
                self.remaining_ok.push(ttl <= granted && ttl >= granted - 3);
                line = line.replace(&format!("\"ttl\":{ttl},"), "\"ttl\":\"<remaining>\",");
            }
            return line;
        }
        let mut line = line.to_string();
        if let (Some(granted), Some((at, len, remaining))) = (
            number_between(&line, "granted with TTL(", "s)"),
            find_remaining(&line),
        ) {
            self.remaining_ok
                .push(remaining <= granted && remaining >= granted - 3);
            line.replace_range(at..at + len, "remaining(<n>s)");
        }
        sort_attached_keys(&mut line);
        line
    }
}

enum Masking<'a> {
    Server(&'a Server),
    Endpoint(&'a str),
}

fn contains_false(value: &Value) -> bool {
    match value {
        Value::Bool(b) => !b,
        Value::Array(items) => items.iter().any(contains_false),
        Value::Object(map) => map.values().any(contains_false),
        _ => false,
    }
}

fn collect_base64(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("key" | "value", Value::String(s)) => out.push(s.clone()),
                    ("keys", Value::Array(items)) => {
                        out.extend(items.iter().filter_map(|i| i.as_str().map(String::from)))
                    }
                    _ => collect_base64(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| collect_base64(i, out)),
        _ => {}
    }
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    if !s.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::new();
    for chunk in s.as_bytes().chunks(4) {
        let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        let mut n = 0u32;
        for &c in &chunk[..4 - pad] {
            n = (n << 6) | u32::from(value(c)?);
        }
        n <<= 6 * pad;
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    Some(out)
}

fn number_between(line: &str, before: &str, after: &str) -> Option<i64> {
    let at = line.find(before)? + before.len();
    let len = line[at..].find(after)?;
    line[at..at + len].parse().ok()
}

// ---------------------------------------------------------------------------------------------
// Step lists: the same command lines with both tools
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Step {
    /// A command; `{N}` in an argument stands for the N-th random lease ID seen.
    Run(&'static [&'static str]),
    /// A command with this on its standard input.
    Stdin(&'static [&'static str], &'static str),
    /// A flag error: exit code and stderr are compared; stdout is not (etcdctl prints its
    /// usage page there, we print nothing).
    FlagError(&'static [&'static str]),
}

/// One side of a differential: a tool against a server.
struct Side<'a> {
    tool: Tool,
    server: &'a Server,
    r: Recorder,
    m: Masker,
    /// Labels of recorded facts that are false (any `false` in a note is a fact that failed).
    failed: Vec<String>,
}

impl<'a> Side<'a> {
    fn new(tool: Tool, server: &'a Server) -> Side<'a> {
        Side {
            tool,
            server,
            r: Recorder::default(),
            m: Masker::default(),
            failed: Vec::new(),
        }
    }

    /// Runs `args` (with `{N}` substituted), records exit code and masked output under a
    /// label that is the same for both tools, and returns the raw output.
    async fn run(&mut self, args: &[&str], stdin: &str, compare_stdout: bool) -> Output {
        let real: Vec<String> = args.iter().map(|a| self.m.substitute(a)).collect();
        let output = run(self.tool, &self.server.endpoint(), &real, stdin).await;
        let raw_stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stdout = self.m.mask(&raw_stdout, Masking::Server(self.server));
        let stderr = self.m.mask(
            &String::from_utf8_lossy(&output.stderr),
            Masking::Server(self.server),
        );
        let mut value = json!({ "exit": output.status.code(), "stderr": stderr });
        if compare_stdout {
            value["stdout"] = json!(stdout);
        }
        if !self.m.remaining_ok.is_empty() {
            value["remaining TTLs within 3 s of the granted TTL"] =
                json!(self.m.remaining_ok.drain(..).all(|ok| ok));
        }
        self.note(&format!("ctl {}", args.join(" ")), value);
        output
    }

    async fn step(&mut self, step: Step) {
        match step {
            Step::Run(args) => {
                self.run(args, "", true).await;
            }
            Step::Stdin(args, stdin) => {
                self.run(args, stdin, true).await;
            }
            Step::FlagError(args) => {
                self.run(args, "", false).await;
            }
        }
    }

    /// Records a step; a `false` anywhere in it is a fact that failed.
    fn note(&mut self, label: &str, value: Value) {
        if contains_false(&value) {
            self.failed.push(label.to_string());
        }
        self.r.note(label, value);
    }

    /// Panics unless every fact this side recorded holds.
    fn assert_facts(&self, name: &str) {
        assert!(
            self.failed.is_empty(),
            "{name}: with {:?}, these facts are false: {:?}",
            self.tool,
            self.failed
        );
    }

    fn mask(&mut self, text: &str) -> String {
        self.m.mask(text, Masking::Server(self.server))
    }

    fn bg(&self, args: &[&str]) -> Bg {
        self.bg_env(args, &[])
    }

    fn bg_env(&self, args: &[&str], env: &[(&str, String)]) -> Bg {
        let real: Vec<String> = args.iter().map(|a| self.m.substitute(a)).collect();
        Bg::spawn(self.tool, &self.server.endpoint(), &real, env)
    }

    /// Records how a background command ended: exit, masked stdout and stderr.
    async fn finish(&mut self, label: &str, bg: Bg) {
        let (status, stdout, stderr) = bg.finish().await;
        let value = json!({
            "exit": exit_json(status),
            "stdout": self.mask(&stdout),
            "stderr": self.mask(&stderr),
        });
        self.note(label, value);
    }
}

/// Runs `steps` with etcdctl against one fresh `kind` server and with the CLI against another
/// (in parallel), and asserts both recordings agree (`-` etcdctl, `+` leasehold CLI).
async fn steps_differential(name: &str, kind: Kind, steps: &[Step]) {
    let (a, b) = tokio::join!(start(kind), start(kind));
    let record = |tool, server| async move {
        let mut side = Side::new(tool, server);
        for step in steps {
            side.step(*step).await;
        }
        side
    };
    let (expected, actual) = tokio::join!(record(Tool::Etcdctl, &a), record(Tool::Cli, &b));
    assert_same_recordings(name, &a, &expected.r, &b, &actual.r);
    expected.assert_facts(name);
    actual.assert_facts(name);
}

/// A scenario's future; it borrows its side.
type Scenario<'a> = std::pin::Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Runs `scenario` for etcdctl against one fresh `kind` server and for the CLI against
/// another (in parallel) and asserts both recordings agree.
async fn scenario_differential<F>(name: &str, kind: Kind, scenario: F)
where
    F: for<'a> Fn(&'a mut Side<'_>) -> Scenario<'a>,
{
    let (a, b) = tokio::join!(start(kind), start(kind));
    let mut etcdctl = Side::new(Tool::Etcdctl, &a);
    let mut cli = Side::new(Tool::Cli, &b);
    let limit = Duration::from_secs(90);
    let (x, y) = tokio::join!(
        tokio::time::timeout(limit, scenario(&mut etcdctl)),
        tokio::time::timeout(limit, scenario(&mut cli))
    );
    assert!(
        x.is_ok() && y.is_ok(),
        "{name}: scenario ran longer than {limit:?}"
    );
    assert_same_recordings(name, &a, &etcdctl.r, &b, &cli.r);
    etcdctl.assert_facts(name);
    cli.assert_facts(name);
}

// ---------------------------------------------------------------------------------------------
// put, get, del
// ---------------------------------------------------------------------------------------------

const KV_STEPS: &[Step] = &[
    Step::Run(&["put", "foo", "bar"]),
    Step::Run(&["put", "foo", "bar2", "--prev-kv"]),
    Step::Run(&["put", "foo", "bar3", "--prev-kv", "-w", "json"]),
    Step::Run(&["put", "-w", "json", "foo2", "x"]),
    Step::Run(&["put", "foo3", "--", "-dash"]),
    Step::Stdin(&["put", "stdin-key"], "from stdin\nsecond line\n"),
    Step::Run(&["get", "stdin-key", "-w", "json"]),
    Step::Run(&["get", "foo"]),
    Step::Run(&["get", "foo", "-w", "json"]),
    Step::Run(&["get", "foo", "--print-value-only"]),
    Step::Run(&["get", "foo", "--keys-only"]),
    Step::Run(&["get", "foo", "--keys-only", "-w", "json"]),
    Step::Run(&["get", "", "--prefix"]),
    Step::Run(&["get", "foo", "--prefix", "--limit=1", "-w", "json"]),
    Step::Run(&[
        "get",
        "foo",
        "--prefix",
        "--sort-by=value",
        "--order=descend",
    ]),
    Step::Run(&[
        "get",
        "foo",
        "--prefix",
        "--sort-by=CREATE",
        "--order=ascend",
        "-w",
        "json",
    ]),
    Step::Run(&[
        "get",
        "foo",
        "--prefix",
        "--sort-by=modify",
        "--order=DESCEND",
        "--keys-only",
    ]),
    Step::Run(&["get", "foo", "--prefix", "--sort-by=version"]),
    Step::Run(&["get", "foo2", "--from-key"]),
    Step::Run(&["get", "foo", "foo3"]),
    Step::Run(&["get", "foo", "foo3", "extra-argument"]),
    Step::Run(&["get", "foo", "--rev=2"]),
    Step::Run(&["get", "foo", "--rev", "3", "-w", "json"]),
    Step::Run(&["get", "foo", "--consistency=s"]),
    Step::Run(&["get", "foo", "--hex"]),
    Step::Run(&["get", "missing", "-w", "json"]),
    Step::Run(&["get", "missing"]),
    Step::Run(&["put", "foo", "--ignore-value", "--prev-kv"]),
    Step::Run(&["get", "foo", "-w", "json"]),
    Step::Run(&["put", "missing", "--ignore-value"]),
    Step::Run(&["put", "foo", "x", "--ignore-value"]),
    Step::Run(&["put", "foo", "--ignore-lease", "y"]),
    Step::Run(&["del", "foo3"]),
    Step::Run(&["del", "foo3", "-w", "json"]),
    Step::Run(&["del", "foo", "--prev-kv", "-w", "json"]),
    Step::Run(&["put", "foo", "again"]),
    Step::Run(&["del", "foo", "foo3", "--prev-kv"]),
    Step::Run(&["put", "a1", "1"]),
    Step::Run(&["put", "a2", "2"]),
    Step::Run(&["del", "a", "--prefix"]),
    Step::Run(&["put", "b1", "1"]),
    Step::Run(&["del", "b", "--from-key", "--prev-kv", "-w", "json"]),
    Step::Run(&["get", "", "--prefix", "-w", "json"]),
    Step::Run(&["del", "", "--prefix"]),
    Step::Run(&["get", "", "--from-key"]),
    // Errors: etcdctl's checks, messages and exit codes.
    Step::Run(&["get"]),
    Step::Run(&["put"]),
    Step::Run(&["put", "only-key"]),
    Step::Run(&["del"]),
    Step::Run(&["del", "a", "b", "c"]),
    Step::Run(&["get", "a", "--prefix", "--from-key"]),
    Step::Run(&["del", "a", "--prefix", "--from-key"]),
    Step::Run(&["get", "a", "b", "--prefix"]),
    Step::Run(&["del", "a", "b", "--from-key"]),
    Step::Run(&["get", "a", "--order=up"]),
    Step::Run(&["get", "a", "--sort-by=size"]),
    Step::Run(&["get", "a", "--consistency=x"]),
    Step::Run(&["get", "a", "--rev=100"]),
    Step::Run(&["get", "a", "--print-value-only", "-w", "json"]),
    Step::Run(&["get", "a", "-w", "table"]),
    Step::Run(&["put", "a", "b", "-w", "yaml"]),
    Step::Run(&["get", ""]),
    Step::Run(&["del", ""]),
    Step::Run(&["put", "a", "b", "--lease=zz"]),
    Step::Run(&["put", "a", "b", "--lease=0x10"]),
    Step::Run(&["put", "a", "b", "--lease=1234"]),
    Step::Run(&["put", "a", "b", "--ignore-value"]),
    Step::FlagError(&["get", "a", "--bogus"]),
    Step::FlagError(&["get", "a", "--rev=x"]),
    Step::FlagError(&["get", "a", "--limit"]),
    Step::FlagError(&["get", "a", "-w"]),
    Step::FlagError(&["get", "a", "-x"]),
    Step::FlagError(&["del", "a", "--prefix=maybe"]),
    Step::FlagError(&["put", "-5", "a"]),
    Step::FlagError(&["get", "a", "--command-timeout=1"]),
    Step::FlagError(&["get", "a", "--dial-timeout=soon"]),
    Step::Run(&["get", "a", "--prefix=false", "--keys-only=true"]),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_get_del_same_as_etcdctl_on_leasehold() {
    steps_differential(
        "put_get_del_same_as_etcdctl_on_leasehold",
        Kind::Leasehold,
        KV_STEPS,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_get_del_same_as_etcdctl_on_etcd() {
    steps_differential("put_get_del_same_as_etcdctl_on_etcd", Kind::Etcd, KV_STEPS).await;
}

// ---------------------------------------------------------------------------------------------
// lease
// ---------------------------------------------------------------------------------------------

const LEASE_STEPS: &[Step] = &[
    Step::Run(&["lease", "list"]),
    Step::Run(&["lease", "list", "-w", "json"]),
    Step::Run(&["lease", "grant", "100"]),
    Step::Run(&["lease", "grant", "60", "-w", "json"]),
    Step::Run(&["lease", "list"]),
    Step::Run(&["lease", "list", "-w", "json"]),
    Step::Run(&["put", "--lease={0}", "k1", "v1"]),
    Step::Run(&["put", "--lease={0}", "k2", "v2"]),
    Step::Run(&["put", "--lease={1}", "k3", "v3", "-w", "json"]),
    Step::Run(&["get", "k", "--prefix", "-w", "json"]),
    Step::Run(&["lease", "timetolive", "{0}"]),
    Step::Run(&["lease", "timetolive", "{0}", "--keys"]),
    Step::Run(&["lease", "timetolive", "--keys", "-w", "json", "{0}"]),
    Step::Run(&["lease", "timetolive", "{1}", "-w", "json"]),
    Step::Run(&["lease", "keep-alive", "--once", "{0}"]),
    Step::Run(&["lease", "keep-alive", "--once", "-w", "json", "{1}"]),
    Step::Run(&["put", "--ignore-lease", "k1", "v1b"]),
    Step::Run(&["put", "k2", "detached"]),
    Step::Run(&["lease", "timetolive", "{0}", "--keys"]),
    Step::Run(&["lease", "revoke", "{0}"]),
    Step::Run(&["lease", "revoke", "{0}"]),
    Step::Run(&["lease", "revoke", "{1}", "-w", "json"]),
    Step::Run(&["get", "k", "--prefix"]),
    Step::Run(&["lease", "timetolive", "{0}"]),
    Step::Run(&["lease", "timetolive", "{0}", "--keys", "-w", "json"]),
    Step::Run(&["lease", "keep-alive", "--once", "{0}"]),
    // Not --once: a lease that is gone ends the keep-alive at once, exit code 0.
    Step::Run(&["lease", "keep-alive", "{0}"]),
    Step::Run(&["lease", "keep-alive", "-w", "json", "{0}"]),
    Step::Run(&["put", "--lease={0}", "k4", "v"]),
    Step::Run(&["lease", "list"]),
    // Errors.
    Step::Run(&["lease", "grant"]),
    Step::Run(&["lease", "grant", "x"]),
    Step::Run(&["lease", "grant", "1", "2"]),
    Step::Run(&["lease", "grant", "9000000001"]),
    Step::Run(&["lease", "revoke"]),
    Step::Run(&["lease", "revoke", "zz"]),
    Step::Run(&["lease", "revoke", "1234"]),
    Step::Run(&["lease", "revoke", "ffffffffffffffff"]),
    Step::Run(&["lease", "timetolive"]),
    Step::Run(&["lease", "timetolive", "xyz"]),
    Step::Run(&["lease", "timetolive", "1234", "-w", "table"]),
    Step::Run(&["lease", "keep-alive"]),
    Step::Run(&["lease", "keep-alive", "--once", "1234"]),
    Step::Run(&["lease", "keep-alive", "--once", "-w", "json", "1234"]),
    Step::FlagError(&["lease", "grant", "-5"]),
    Step::FlagError(&["lease", "timetolive", "1", "--keys=2"]),
    Step::FlagError(&["lease"]),
    Step::FlagError(&["lease", "bogus"]),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_commands_same_as_etcdctl_on_leasehold() {
    steps_differential(
        "lease_commands_same_as_etcdctl_on_leasehold",
        Kind::Leasehold,
        LEASE_STEPS,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_commands_same_as_etcdctl_on_etcd() {
    steps_differential(
        "lease_commands_same_as_etcdctl_on_etcd",
        Kind::Etcd,
        LEASE_STEPS,
    )
    .await;
}

/// `lease keep-alive <id>` prints a line per renewal until the lease is revoked, then (simple
/// output) `lease <id> expired or revoked.`, exit 0.
fn keep_alive_scenario<'a>(s: &'a mut Side<'_>) -> Scenario<'a> {
    Box::pin(async move {
        for json_output in [false, true] {
            // TTL 3: renewals every second, so the revoke is noticed within about a second.
            s.run(&["lease", "grant", "3"], "", true).await;
            let n = s.m.ids.len().saturating_sub(1);
            let id = format!("{{{n}}}");
            let mut args = vec!["lease", "keep-alive", id.as_str()];
            if json_output {
                args.extend(["-w", "json"]);
            }
            let bg = s.bg(&args);
            let first_line = bg.wait_stdout(|out| out.contains('\n')).await;
            s.note("a first renewal was printed", json!(first_line));
            s.run(&["lease", "revoke", &id], "", true).await;
            let (status, stdout, stderr) = bg.finish().await;
            let mut lines: Vec<String> = s.mask(&stdout).lines().map(String::from).collect();
            let stderr = s.mask(&stderr);
            let last = if json_output { None } else { lines.pop() };
            let first = lines.first().cloned();
            s.note(
                &format!("lease keep-alive (json: {json_output}) after the revoke"),
                json!({
                    "exit": exit_json(status),
                    "first line": first,
                    "every renewal line is the first line": lines.iter().all(|l| Some(l) == first.as_ref()),
                    "last line": last,
                    "stderr": stderr,
                }),
            );
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_keep_alive_until_revoked_same_as_etcdctl() {
    scenario_differential(
        "lease_keep_alive_until_revoked_same_as_etcdctl",
        Kind::Leasehold,
        keep_alive_scenario,
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// watch
// ---------------------------------------------------------------------------------------------

/// Watches that replay from known revisions (so they are deterministic however fast they are
/// established) and follow live writes; stopped with SIGINT once the last write showed up.
fn watch_scenario<'a>(s: &'a mut Side<'_>) -> Scenario<'a> {
    Box::pin(async move {
        let mut client = s.server.client().await;
        let put = |k: &'static str, v: &'static str| (k, v);
        for (k, v) in [put("w1", "a"), put("w2", "b"), put("x", "c")] {
            let ok = client.put(k, v, None).await.is_ok();
            s.note(&format!("put {k}"), json!(ok));
        }
        let exec = "echo \"$ETCD_WATCH_EVENT_TYPE $ETCD_WATCH_KEY $ETCD_WATCH_VALUE $ETCD_WATCH_REVISION\"";
        // Five watches, each replaying history from a known revision. Deterministic batching:
        // every watch shows its replay before the first live write, and every live write
        // before the next one, so each write is one response (one header, one exec run).
        let watches: [&[&str]; 5] = [
            &["watch", "w", "--prefix", "--prev-kv", "--rev=2"],
            &["watch", "w", "--prefix", "-w", "json", "--rev=2"],
            &["watch", "w1", "w3", "--rev=1"],
            &["watch", "--rev=1", "x", "--prev-kv", "-w", "json"],
            &["watch", "w1", "--rev=2", "--", "sh", "-c", exec],
        ];
        // What each watch shows once it has seen the replay, then each live write (simple
        // text, base64 in JSON, the exec command's quoted values; None: not its keys).
        let shown: [[Option<&str>; 5]; 6] = [
            [
                Some("w2\nb\n"),
                Some("Yg=="),
                Some("w2\nb\n"),
                Some("Yw=="),
                Some("\"a\" "),
            ],
            [
                Some("\nd\n"),
                Some("ZA=="),
                Some("\nd\n"),
                None,
                Some("\"d\" "),
            ],
            [
                Some("DELETE\nw2"),
                Some("\"type\":1"),
                Some("DELETE\nw2"),
                None,
                Some("\"DELETE\""),
            ],
            [
                Some("\nf\n"),
                Some("Zg=="),
                Some("\nf\n"),
                None,
                Some("\"e\" "),
            ],
            [None, None, None, Some("eDI="), None],
            [
                Some("done"),
                Some("ZG9uZQ=="),
                Some("done"),
                None,
                Some("\"done\" "),
            ],
        ];
        let running: Vec<Bg> = watches.iter().map(|args| s.bg(args)).collect();
        let mut writes_ok = Vec::new();
        for (phase, markers) in shown.iter().enumerate() {
            match phase {
                0 => {}
                1 => writes_ok.push(client.put("w1", "d", None).await.is_ok()),
                2 => writes_ok.push(
                    client
                        .delete("w", Some(DeleteOptions::new().with_prefix()))
                        .await
                        .is_ok(),
                ),
                3 => {
                    writes_ok.push(
                        client
                            .txn(Txn::new().and_then([
                                TxnOp::put("w1", "e", None),
                                TxnOp::put("w2", "f", None),
                            ]))
                            .await
                            .is_ok(),
                    )
                }
                4 => writes_ok.push(client.put("x", "x2", None).await.is_ok()),
                _ => writes_ok.push(client.put("w1", "done", None).await.is_ok()),
            }
            let mut seen = Vec::new();
            for (bg, marker) in running.iter().zip(markers) {
                if let Some(marker) = marker {
                    seen.push(bg.wait_stdout(|out| out.contains(marker)).await);
                }
            }
            s.note(
                &format!("phase {phase}: every watch showed it"),
                json!(seen),
            );
        }
        s.note("live writes", json!(writes_ok));
        for (args, bg) in watches.iter().zip(running) {
            bg.signal("INT");
            s.finish(&format!("ctl {} (SIGINT)", args.join(" ")), bg)
                .await;
        }
        // A watch from a compacted revision is canceled by the server: exit 5.
        let compacted = client.compact(6, None).await.is_ok();
        s.note("compact 6", json!(compacted));
        s.run(&["watch", "w1", "--rev=2"], "", true).await;
        s.run(&["watch", "w1", "--rev=2", "-w", "json"], "", true)
            .await;
        // Argument errors.
        s.run(&["watch"], "", true).await;
        s.run(&["watch", "a", "b", "--prefix"], "", true).await;
        s.run(&["watch", "a", "--"], "", true).await;
        s.run(&["watch", "-w", "yaml", "a"], "", true).await;
        s.step(Step::FlagError(&["watch", "--rev=x", "a"])).await;
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_same_as_etcdctl_on_leasehold() {
    scenario_differential(
        "watch_same_as_etcdctl_on_leasehold",
        Kind::Leasehold,
        watch_scenario,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_same_as_etcdctl_on_etcd() {
    scenario_differential("watch_same_as_etcdctl_on_etcd", Kind::Etcd, watch_scenario).await;
}

// ---------------------------------------------------------------------------------------------
// Unreachable endpoint
// ---------------------------------------------------------------------------------------------

/// Nothing listens: the short commands end in `context deadline exceeded` after the command
/// timeout (etcdctl keeps retrying until then), `lease keep-alive` gives up after the dial
/// timeout plus a second with exit code 0. (etcdctl waits forever in timetolive, list,
/// keep-alive --once, watch, lock and elect; ours give up: docs/cli.md.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_endpoint_same_as_etcdctl() {
    let endpoint = format!("http://127.0.0.1:{}", free_port());
    let steps: &[&[&str]] = &[
        &["get", "a", "--command-timeout=1s"],
        &["put", "a", "b", "--command-timeout=1s"],
        &["del", "a", "--command-timeout=1s"],
        &["lease", "grant", "10", "--command-timeout=1s"],
        &["lease", "revoke", "1", "--command-timeout=1s"],
        &["lease", "keep-alive", "1", "--dial-timeout=1s"],
        &["get", "a", "--command-timeout=0s"],
    ];
    let record = |tool: Tool| {
        let endpoint = endpoint.clone();
        async move {
            let mut r = Recorder::default();
            let mut m = Masker::default();
            for args in steps {
                let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
                let started = tokio::time::Instant::now();
                let output = run(tool, &endpoint, &args, "").await;
                let took = started.elapsed();
                r.note(
                    format!("ctl {}", args.join(" ")),
                    json!({
                        "exit": output.status.code(),
                        "stdout": m.mask(&String::from_utf8_lossy(&output.stdout), Masking::Endpoint(&endpoint)),
                        "stderr": m.mask(&String::from_utf8_lossy(&output.stderr), Masking::Endpoint(&endpoint)),
                        "took less than 4 s": took < Duration::from_secs(4),
                    }),
                );
            }
            r
        }
    };
    let (expected, actual) = tokio::join!(record(Tool::Etcdctl), record(Tool::Cli));
    if let Some(diff) = common::diff_recordings("etcdctl", &expected, "leasehold", &actual) {
        panic!("unreachable_endpoint_same_as_etcdctl failed\n{diff}");
    }
    for (tool, recorded) in [("etcdctl", &expected), ("leasehold", &actual)] {
        let failed: Vec<&str> = recorded
            .steps()
            .iter()
            .filter(|(_, value)| contains_false(value))
            .map(|(label, _)| label.as_str())
            .collect();
        assert!(failed.is_empty(), "{tool} took too long: {failed:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// lock
// ---------------------------------------------------------------------------------------------

/// Both lines of a `lock`/`elect` winner in simple output (key, value).
fn two_lines(out: &str) -> bool {
    out.matches('\n').count() >= 2
}

fn lock_scenario<'a>(s: &'a mut Side<'_>) -> Scenario<'a> {
    Box::pin(async move {
        // Held until SIGINT: the key printed like a get of it (key, empty value).
        let holder = s.bg(&["lock", "L1"]);
        let printed = holder.wait_stdout(two_lines).await;
        s.note("lock L1 printed its key", json!(printed));
        s.run(&["get", "L1", "--prefix", "-w", "json"], "", true)
            .await;
        holder.signal("INT");
        s.finish("ctl lock L1 (SIGINT)", holder).await;
        s.run(&["get", "L1", "--prefix", "-w", "json"], "", true)
            .await;

        // -w json, and SIGTERM.
        let holder = s.bg(&["lock", "L1", "-w", "json"]);
        let printed = holder.wait_stdout(|o| o.contains('\n')).await;
        s.note("lock L1 -w json printed", json!(printed));
        holder.signal("TERM");
        s.finish("ctl lock L1 -w json (SIGTERM)", holder).await;

        // With a command: ETCD_LOCK_KEY and ETCD_LOCK_REV, and a get of the key from inside.
        let get = match s.tool {
            Tool::Etcdctl => format!("etcdctl --endpoints={} get", s.server.endpoint()),
            Tool::Cli => format!("{CLI} get --endpoints={}", s.server.endpoint()),
        };
        let script = "echo \"$ETCD_LOCK_KEY $ETCD_LOCK_REV\"; $CTL_GET \"$ETCD_LOCK_KEY\" -w json";
        let with_command = s.bg_env(
            &["lock", "L2", "--", "sh", "-c", script],
            &[("CTL_GET", get), ("ETCDCTL_API", "3".to_string())],
        );
        let (status, stdout, stderr) = with_command.finish().await;
        let (masked_stdout, masked_stderr) = (s.mask(&stdout), s.mask(&stderr));
        let mut lines = stdout.lines();
        let env_line = lines.next().unwrap_or_default().to_string();
        let got: Value = lines
            .next()
            .and_then(|l| serde_json::from_str(l).ok())
            .unwrap_or(Value::Null);
        let (key, rev) = env_line.split_once(' ').unwrap_or_default();
        let kv = &got["kvs"][0];
        let same_key = kv["key"]
            .as_str()
            .and_then(base64_decode)
            .is_some_and(|k| k == key.as_bytes());
        s.note(
            "lock L2 -- sh -c ...",
            json!({
                "exit": exit_json(status),
                "stdout": masked_stdout,
                "stderr": masked_stderr,
                "ETCD_LOCK_KEY is the lock key": same_key && key.starts_with("L2/"),
                "ETCD_LOCK_REV is the key's create revision": rev.parse::<i64>().ok().is_some_and(|r| Some(r) == kv["create_revision"].as_i64()),
            }),
        );
        s.run(&["get", "L2", "--prefix"], "", true).await;

        // A second lock waits until the first is released.
        let first = s.bg(&["lock", "L3"]);
        let first_printed = first.wait_stdout(two_lines).await;
        let mut second = s.bg(&["lock", "L3"]);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let waiting = second.running() && second.stdout().is_empty();
        s.note(
            "a second lock L3 waits while the first holds it",
            json!({ "first printed": first_printed, "second waiting": waiting }),
        );
        first.signal("INT");
        s.finish("ctl lock L3 (first, SIGINT)", first).await;
        let acquired = second.wait_stdout(two_lines).await;
        s.note(
            "the second lock L3 acquired it after the release",
            json!(acquired),
        );
        second.signal("INT");
        s.finish("ctl lock L3 (second, SIGINT)", second).await;

        // Interrupted while waiting: `Error: context canceled`, exit 1.
        let holder = s.bg(&["lock", "L4"]);
        holder.wait_stdout(two_lines).await;
        let waiter = s.bg(&["lock", "L4"]);
        tokio::time::sleep(Duration::from_secs(1)).await;
        waiter.signal("INT");
        s.finish("ctl lock L4 (waiting, SIGINT)", waiter).await;
        holder.signal("INT");
        s.finish("ctl lock L4 (holder, SIGINT)", holder).await;

        // The session lease lost while holding: `Error: session expired`, exit 1.
        let holder = s.bg(&["lock", "L5", "--ttl=3"]);
        holder.wait_stdout(two_lines).await;
        let mut client = s.server.client().await;
        let leases = client.leases().await.map(|r| r.leases().to_vec());
        let mut revoked = false;
        for lease in leases.unwrap_or_default() {
            revoked |= client.lease_revoke(lease.id()).await.is_ok();
        }
        s.note("revoked the session lease", json!(revoked));
        s.finish("ctl lock L5 --ttl=3 (lease revoked)", holder)
            .await;

        // Argument errors.
        s.run(&["lock"], "", true).await;
        s.run(&["lock", "L6", "-w", "yaml"], "", true).await;
        s.step(Step::FlagError(&["lock", "L6", "--ttl=x"])).await;
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_same_as_etcdctl() {
    for kind in LOCK_ELECT_SERVERS {
        scenario_differential(
            &format!("lock_same_as_etcdctl_on_{kind:?}"),
            *kind,
            lock_scenario,
        )
        .await;
    }
}

/// Where we deliberately differ from etcdctl: the command's exit code is passed on (etcdctl
/// exits 1), and a missing program is reported in Go's words with exit 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_passes_on_the_command_exit_code() {
    for kind in LOCK_ELECT_SERVERS {
        let server = start(*kind).await;
        let endpoint = server.endpoint();
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let output = run(
            Tool::Cli,
            &endpoint,
            &args(&["lock", "L", "--", "sh", "-c", "echo held; exit 3"]),
            "",
        )
        .await;
        assert_eq!(output.status.code(), Some(3), "{output:?}");
        assert_eq!(String::from_utf8_lossy(&output.stdout), "held\n");
        assert_eq!(
            String::from_utf8_lossy(&output.stderr),
            "Error: exit status 3\n"
        );
        let output = run(
            Tool::Cli,
            &endpoint,
            &args(&["lock", "L", "--", "leasehold-no-such-program"]),
            "",
        )
        .await;
        assert_eq!(output.status.code(), Some(1), "{output:?}");
        assert_eq!(
            String::from_utf8_lossy(&output.stderr),
            "Error: exec: \"leasehold-no-such-program\": executable file not found in $PATH\n"
        );
        // Released and its lease revoked: nothing left behind.
        let mut client = server.client().await;
        let keys = client
            .get("L", Some(etcd_client::GetOptions::new().with_prefix()))
            .await
            .map(|r| r.kvs().len());
        assert_eq!(keys.ok(), Some(0));
        let leases = client.leases().await.map(|r| r.leases().len());
        assert_eq!(leases.ok(), Some(0), "the session leases were revoked");
    }
}

// ---------------------------------------------------------------------------------------------
// elect
// ---------------------------------------------------------------------------------------------

fn elect_scenario<'a>(s: &'a mut Side<'_>) -> Scenario<'a> {
    Box::pin(async move {
        // An observer sees each leader in turn.
        let observer = s.bg(&["elect", "-l", "E1"]);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let one = s.bg(&["elect", "E1", "one"]);
        let one_won = one.wait_stdout(two_lines).await;
        let mut two = s.bg(&["elect", "E1", "two"]);
        let observed_one = observer.wait_stdout(two_lines).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let two_waiting = two.running() && two.stdout().is_empty();
        s.note(
            "one leads, two waits, the observer saw one",
            json!({ "one won": one_won, "two waiting": two_waiting, "observed": observed_one }),
        );
        one.signal("INT");
        s.finish("ctl elect E1 one (SIGINT: resign)", one).await;
        let two_won = two.wait_stdout(two_lines).await;
        let observed_two = observer.wait_stdout(|o| o.matches('\n').count() >= 4).await;
        s.note(
            "two leads after one resigned, the observer saw it",
            json!({ "two won": two_won, "observed": observed_two }),
        );
        two.signal("INT");
        s.finish("ctl elect E1 two (SIGINT: resign)", two).await;
        observer.signal("INT");
        s.finish("ctl elect -l E1 (SIGINT)", observer).await;
        s.run(&["get", "E1", "--prefix"], "", true).await;

        // JSON: the winner's get, and an observer's leader (header and kvs, no count).
        let leader = s.bg(&["elect", "E2", "proposal", "-w", "json"]);
        let won = leader.wait_stdout(|o| o.contains('\n')).await;
        let observer = s.bg(&["elect", "-l", "E2", "-w", "json"]);
        let observed = observer.wait_stdout(|o| o.contains('\n')).await;
        s.note("E2 won and observed", json!([won, observed]));
        observer.signal("TERM");
        s.finish("ctl elect -l E2 -w json (SIGTERM)", observer)
            .await;
        leader.signal("TERM");
        s.finish("ctl elect E2 proposal -w json (SIGTERM)", leader)
            .await;

        // Interrupted while campaigning behind a leader: `Error: context canceled`, exit 1.
        let leader = s.bg(&["elect", "E3", "first"]);
        leader.wait_stdout(two_lines).await;
        let waiter = s.bg(&["elect", "E3", "second"]);
        tokio::time::sleep(Duration::from_secs(1)).await;
        waiter.signal("INT");
        s.finish("ctl elect E3 second (waiting, SIGINT)", waiter)
            .await;
        leader.signal("INT");
        s.finish("ctl elect E3 first (SIGINT)", leader).await;

        // Argument errors.
        s.run(&["elect"], "", true).await;
        s.run(&["elect", "E4"], "", true).await;
        s.run(&["elect", "-l", "E4", "p"], "", true).await;
        s.run(&["elect", "a", "b", "c"], "", true).await;
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_same_as_etcdctl() {
    for kind in LOCK_ELECT_SERVERS {
        scenario_differential(
            &format!("elect_same_as_etcdctl_on_{kind:?}"),
            *kind,
            elect_scenario,
        )
        .await;
    }
}
