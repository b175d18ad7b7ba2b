//! etcd's JSON gateway (`/v3/...` on the client port), differentially: the same curl requests
//! go to a real etcd 3.4.23 and to leasehold, each started fresh, and the answers (HTTP status
//! and JSON) must be equal once the member's identity is masked (cluster and member ids, raft
//! term, URLs with their ports, status figures). Leases are granted with ids chosen here, so
//! lease ids, lock keys and election keys compare unmasked. The requests include the curl
//! commands of etcd's gateway guide (docs/dev-guide/api_grpc_gateway.md) as written there.

use leasehold_testkit as common;

use std::process::Stdio;
use std::time::Duration;

use common::{Etcd, Kind, Leasehold, Server, curl};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

/// Bound of one curl call, and of waiting for one line of a stream.
const CURL_TIME_MAX: Duration = Duration::from_secs(10);

/// Header fields that name the member rather than the data.
const IDENTITY: [&str; 3] = ["cluster_id", "member_id", "raft_term"];

/// One answer: the call, the HTTP status, and the body (JSON, masked; or text).
#[derive(Debug, PartialEq)]
struct Answer {
    call: String,
    status: u16,
    body: Value,
}

/// Replaces the value of every field named in `names`, at any depth, by `"<masked>"`.
fn mask(value: &mut Value, names: &[&str]) {
    match value {
        Value::Object(map) => {
            for (name, field) in map.iter_mut() {
                if names.contains(&name.as_str()) {
                    *field = Value::from("<masked>");
                } else {
                    mask(field, names);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| mask(v, names)),
        _ => {}
    }
}

/// The body as JSON with the identity (and `more`) masked, or as text if it is not JSON.
fn parse(body: &str, more: &[&str]) -> Value {
    match serde_json::from_str::<Value>(body) {
        Ok(mut json) => {
            mask(&mut json, &IDENTITY);
            mask(&mut json, more);
            json
        }
        Err(_) => Value::from(body),
    }
}

/// A server's answers, in the order asked.
struct Session<'a> {
    server: &'a Server,
    answers: Vec<Answer>,
}

impl Session<'_> {
    /// POSTs `body` to `path` and records the answer, masking `more` too; returns the JSON.
    fn post(&mut self, path: &str, body: &str, more: &[&str]) -> Value {
        let (status, text) = curl("POST", &self.server.endpoint(), path, Some(body));
        let json = serde_json::from_str(&text).unwrap_or(Value::Null);
        self.answers.push(Answer {
            call: format!("POST {path} {body}"),
            status,
            body: parse(&text, more),
        });
        json
    }

    /// Records only the status and the error code: for answers whose message is Go's or
    /// serde's own words about bad JSON.
    fn post_code_only(&mut self, path: &str, body: &str) {
        let (status, text) = curl("POST", &self.server.endpoint(), path, Some(body));
        let json: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        assert!(
            json["error"].as_str().is_some_and(|e| !e.is_empty())
                && json["error"] == json["message"],
            "{}: {text}",
            self.server.label()
        );
        self.answers.push(Answer {
            call: format!("POST {path} {body}"),
            status,
            body: json["code"].clone(),
        });
    }

    fn request(&mut self, method: &str, path: &str) {
        let (status, text) = curl(method, &self.server.endpoint(), path, None);
        self.answers.push(Answer {
            call: format!("{method} {path}"),
            status,
            body: Value::from(text),
        });
    }

    /// A lease's remaining TTL is a matter of timing: checked to be close to `granted`, then
    /// masked.
    fn time_to_live(&mut self, path: &str, body: &str, granted: i64) {
        let json = self.post(path, body, &["TTL"]);
        let ttl: i64 = json["TTL"].as_str().expect("TTL").parse().expect("number");
        assert!((granted - 5..=granted).contains(&ttl), "{json}");
    }
}

/// Asserts both servers gave the same answers, call by call.
fn assert_same(etcd: &[Answer], leasehold: &[Answer]) {
    for (e, l) in etcd.iter().zip(leasehold) {
        assert_eq!(e.call, l.call);
        assert_eq!(
            (e.status, &e.body),
            (l.status, &l.body),
            "{}\n  etcd:      {} {}\n  leasehold: {} {}",
            e.call,
            e.status,
            e.body,
            l.status,
            l.body
        );
    }
    assert_eq!(etcd.len(), leasehold.len());
}

/// The unary calls, on a fresh server.
fn unary_scenario(server: &Server) -> Vec<Answer> {
    let mut s = Session {
        server,
        answers: Vec::new(),
    };
    // etcd's gateway guide, as written there ("foo" is Zm9v, "bar" YmFy, "baz" YmF6).
    s.post("/v3/kv/put", r#"{"key": "Zm9v", "value": "YmFy"}"#, &[]);
    s.post("/v3/kv/range", r#"{"key": "Zm9v"}"#, &[]);
    s.post(
        "/v3/kv/range",
        r#"{"key": "Zm9v", "range_end": "Zm9w"}"#,
        &[],
    );
    s.post(
        "/v3/kv/txn",
        r#"{"compare":[{"target":"CREATE","key":"Zm9v","createRevision":"2"}],"success":[{"requestPut":{"key":"Zm9v","value":"YmFy"}}]}"#,
        &[],
    );
    s.post(
        "/v3/kv/txn",
        r#"{"compare":[{"version":"4","result":"EQUAL","target":"VERSION","key":"Zm9v"}],"success":[{"requestRange":{"key":"Zm9v"}}]}"#,
        &[],
    );
    s.post(
        "/v3/kv/txn",
        r#"{"compare":[{"version":"2","result":"EQUAL","target":"VERSION","key":"Zm9v"}],"success":[{"requestRange":{"key":"Zm9v"}}],"failure":[{"request_delete_range":{"key":"Zm9v"}}]}"#,
        &[],
    );

    // KV with options, snake_case and camelCase names, enums by name, unknown fields ignored.
    s.post(
        "/v3/kv/put",
        r#"{"key":"Zm9v","value":"YmF6","prev_kv":true}"#,
        &[],
    );
    s.post("/v3/kv/put", r#"{"key":"Zm9vMg==","value":"eA=="}"#, &[]);
    s.post(
        "/v3/kv/range",
        r#"{"key":"AA==","range_end":"AA==","sort_order":"DESCEND","sort_target":"KEY","keys_only":true}"#,
        &[],
    );
    s.post(
        "/v3/kv/range",
        r#"{"key":"Zm9v","rangeEnd":"Zm9w","countOnly":true,"bogus":1}"#,
        &[],
    );
    s.post(
        "/v3/kv/range",
        r#"{"key":"Zm9v","limit":"1","range_end":"Zm9w"}"#,
        &[],
    );
    s.post(
        "/v3/kv/deleterange",
        r#"{"key":"Zm9vMg==","prev_kv":true}"#,
        &[],
    );
    s.post("/v3/kv/compaction", r#"{"revision":"3"}"#, &[]);
    s.post("/v3/kv/range", r#"{"key":"Zm9v","revision":"2"}"#, &[]);
    s.post("/v3/kv/range", r#"{"key":"bm9uZQ=="}"#, &[]);

    // Leases, with ids chosen here; the /v3/kv/lease/ aliases.
    s.post("/v3/lease/grant", r#"{"TTL":"60","ID":"1000"}"#, &[]);
    s.post(
        "/v3/kv/put",
        r#"{"key":"bGVhc2Vk","value":"eA==","lease":"1000"}"#,
        &[],
    );
    s.time_to_live("/v3/lease/timetolive", r#"{"ID":"1000","keys":true}"#, 60);
    s.time_to_live("/v3/kv/lease/timetolive", r#"{"ID":"1000"}"#, 60);
    s.post("/v3/lease/leases", "{}", &[]);
    s.post("/v3/kv/lease/leases", "", &[]);
    s.post("/v3/kv/lease/revoke", r#"{"ID":"1000"}"#, &[]);
    s.post("/v3/lease/revoke", r#"{"ID":"1000"}"#, &[]);
    s.post("/v3/lease/timetolive", r#"{"ID":"1000"}"#, &[]);
    s.post("/v3/kv/range", r#"{"key":"bGVhc2Vk"}"#, &[]);

    // Lock and election, each on a lease of its own.
    s.post("/v3/lease/grant", r#"{"TTL":"60","ID":"2000"}"#, &[]);
    let locked = s.post(
        "/v3/lock/lock",
        r#"{"name":"bXlsb2Nr","lease":"2000"}"#,
        &[],
    );
    let key = locked["key"].as_str().expect("lock key").to_owned();
    s.post("/v3/lock/unlock", &format!(r#"{{"key":"{key}"}}"#), &[]);
    s.post("/v3/lock/unlock", "{}", &[]);
    s.post("/v3/lease/grant", r#"{"TTL":"60","ID":"3000"}"#, &[]);
    let campaign = s.post(
        "/v3/election/campaign",
        r#"{"name":"ZWxlY3Rpb24=","lease":"3000","value":"djE="}"#,
        &[],
    );
    let leader = campaign["leader"].to_string();
    s.post("/v3/election/leader", r#"{"name":"ZWxlY3Rpb24="}"#, &[]);
    s.post(
        "/v3/election/proclaim",
        &format!(r#"{{"leader":{leader},"value":"djI="}}"#),
        &[],
    );
    s.post("/v3/election/leader", r#"{"name":"ZWxlY3Rpb24="}"#, &[]);
    s.post(
        "/v3/election/resign",
        &format!(r#"{{"leader":{leader}}}"#),
        &[],
    );
    s.post("/v3/election/leader", r#"{"name":"ZWxlY3Rpb24="}"#, &[]);

    // Cluster and maintenance.
    s.post(
        "/v3/cluster/member/list",
        "{}",
        &["ID", "peerURLs", "clientURLs"],
    );
    s.post("/v3/cluster/member/promote", r#"{"ID":"1"}"#, &[]);
    s.post(
        "/v3/cluster/member/add",
        r#"{"peerURLs":["not a url"]}"#,
        &[],
    );
    let status = s.post(
        "/v3/maintenance/status",
        "{}",
        &[
            "version",
            "dbSize",
            "dbSizeInUse",
            "leader",
            "raftIndex",
            "raftTerm",
            "raftAppliedIndex",
        ],
    );
    // etcd 3.6 added these (3.7 answers as leasehold does; the etcd here is 3.4): kept apart
    // from the comparison, checked below.
    if let Some(last) = s.answers.last_mut()
        && let Some(body) = last.body.as_object_mut()
    {
        body.remove("storageVersion");
        body.remove("dbSizeQuota");
    }
    if server.kind() == Kind::Leasehold {
        assert_eq!(
            (&status["storageVersion"], &status["dbSizeQuota"]),
            (&Value::from("3.7.0"), &Value::from("2147483648")),
            "storageVersion and the default quota (2 GiB), as etcd 3.7 reports them"
        );
    }

    // The /v3beta/ prefix, which etcd 3.4 and 3.5 still accept.
    s.post("/v3beta/kv/range", r#"{"key":"Zm9v"}"#, &[]);
    s.post("/v3beta/lease/grant", r#"{"TTL":"60","ID":"4000"}"#, &[]);
    s.post("/v3beta/kv/lease/leases", "{}", &[]);

    // Errors: etcd's codes and HTTP statuses, grpc-gateway's bodies.
    s.post("/v3/kv/range", r#"{"key":""}"#, &[]);
    s.post("/v3/kv/range", "", &[]);
    s.post("/v3/kv/put", r#"{"key":"Zm9v","lease":"999"}"#, &[]);
    s.post("/v3/lease/grant", r#"{"TTL":"9000000001"}"#, &[]);
    s.post_code_only("/v3/kv/range", "{bad");
    s.post_code_only("/v3/kv/range", r#"{"key":1}"#);
    s.post("/v3/kv/nothing", "{}", &[]);
    s.post("/v3/", "{}", &[]);
    s.post("/v3alpha/kv/range", r#"{"key":"Zm9v"}"#, &[]);
    s.request("GET", "/v3/kv/range");
    s.request("PUT", "/v3beta/lease/grant");
    s.answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_calls_answer_as_etcds_gateway() {
    let etcd = Etcd::start().await;
    let etcd_answers = unary_scenario(&etcd);
    drop(etcd);
    let leasehold = Leasehold::start().await;
    let leasehold_answers = unary_scenario(&leasehold);
    assert_same(&etcd_answers, &leasehold_answers);
    // A few absolute facts, so that two servers agreeing on something wrong cannot pass.
    let find = |call: &str| {
        leasehold_answers
            .iter()
            .find(|a| a.call == call)
            .unwrap_or_else(|| panic!("no answer to {call}"))
    };
    let range = find(r#"POST /v3/kv/range {"key": "Zm9v"}"#);
    assert_eq!(range.status, 200);
    assert_eq!(range.body["kvs"][0]["value"], "YmFy");
    assert_eq!(range.body["count"], "1");
    let empty = find(r#"POST /v3/kv/range {"key":""}"#);
    assert_eq!(
        (empty.status, &empty.body),
        (
            400,
            &serde_json::json!({"error":"etcdserver: key is not provided","message":"etcdserver: key is not provided","code":3})
        )
    );
    let unknown = find("POST /v3/kv/nothing {}");
    assert_eq!(
        (unknown.status, &unknown.body),
        (404, &Value::from("Not Found\n"))
    );
}

/// The auth calls of etcd's gateway guide: add root, enable auth, authenticate; then a put
/// without a token is refused and one with the token (`Authorization`) is taken.
fn auth_scenario(server: &Server) -> Vec<Answer> {
    let e = server.endpoint();
    let mut answers = Vec::new();
    let mut call = |path: &str, body: &str, token: Option<&str>| {
        let header = token.map(|t| format!("Authorization: {t}"));
        let headers: Vec<&str> = header.iter().map(String::as_str).collect();
        let (status, text) = common::curl_with("POST", &e, path, Some(body), &headers);
        answers.push(Answer {
            call: format!("POST {path} {body} (token: {})", token.is_some()),
            status,
            body: parse(&text, &["token"]),
        });
        serde_json::from_str::<Value>(&text).unwrap_or(Value::Null)
    };
    call(
        "/v3/auth/user/add",
        r#"{"name": "root", "password": "pass"}"#,
        None,
    );
    call("/v3/auth/role/add", r#"{"name": "root"}"#, None);
    call(
        "/v3/auth/user/grant",
        r#"{"user": "root", "role": "root"}"#,
        None,
    );
    call("/v3/auth/enable", "{}", None);
    call(
        "/v3/auth/authenticate",
        r#"{"name": "root", "password": "nope"}"#,
        None,
    );
    let login = call(
        "/v3/auth/authenticate",
        r#"{"name": "root", "password": "pass"}"#,
        None,
    );
    let token = login["token"].as_str().expect("a token").to_owned();
    let put = r#"{"key": "Zm9v", "value": "YmFy"}"#;
    call("/v3/kv/put", put, None);
    call("/v3/kv/put", put, Some(&token));
    call("/v3/kv/range", r#"{"key": "Zm9v"}"#, Some(&token));
    call("/v3/auth/user/list", "{}", Some(&token));
    // A watch stream's first answer: created for the token's user, refused without a token.
    let mut watches = Vec::new();
    for token in [None, Some(token.as_str())] {
        let mut curl = std::process::Command::new("curl");
        curl.args(["-sS", "-N", "--http1.1", "--max-time", "2", "-X", "POST"])
            .args(["-d", r#"{"create_request": {"key": "Zm9v"}}"#]);
        if let Some(token) = token {
            curl.args(["-H", &format!("Authorization: {token}")]);
        }
        let out = curl
            .arg(format!("{e}/v3/watch"))
            .output()
            .expect("run curl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let first = text.lines().next().unwrap_or_default().to_owned();
        watches.push(Answer {
            call: format!("POST /v3/watch (token: {})", token.is_some()),
            status: 0,
            body: parse(&first, &["watch_id"]),
        });
    }
    call("/v3/auth/disable", "{}", Some(&token));
    answers.extend(watches);
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_calls_answer_as_etcds_gateway() {
    let etcd = Etcd::start().await;
    let etcd_answers = auth_scenario(&etcd);
    drop(etcd);
    let leasehold = Leasehold::start().await;
    let leasehold_answers = auth_scenario(&leasehold);
    assert_same(&etcd_answers, &leasehold_answers);
    let (refused, taken) = (&leasehold_answers[6], &leasehold_answers[7]);
    assert_ne!(refused.status, 200, "a put without a token: {refused:?}");
    assert_eq!(taken.status, 200, "{taken:?}");
    let watches = &leasehold_answers[leasehold_answers.len() - 2..];
    assert_eq!(watches[0].body["result"]["canceled"], true, "{watches:?}");
    assert_eq!(watches[1].body["result"]["created"], true, "{watches:?}");
    assert_eq!(
        watches[1].body["result"].get("canceled"),
        None,
        "{watches:?}"
    );
}

/// A response stream read with `curl -N`, one line at a time, killed on drop.
struct StreamReader {
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl StreamReader {
    fn open(endpoint: &str, path: &str, body: &str) -> StreamReader {
        let mut child = tokio::process::Command::new("curl")
            .args(["-sS", "-N", "--http1.1", "-X", "POST", "-d", body])
            .arg(format!("{endpoint}{path}"))
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("run curl");
        let stdout = child.stdout.take().expect("stdout");
        StreamReader {
            child,
            lines: BufReader::new(stdout).lines(),
        }
    }

    /// The next line, masked; `None` when the server ended the stream.
    async fn line(&mut self, more: &[&str]) -> Option<Value> {
        let line = tokio::time::timeout(CURL_TIME_MAX, self.lines.next_line())
            .await
            .expect("a line within the bound")
            .expect("read curl's output")?;
        Some(parse(&line, more))
    }

    async fn close(mut self) {
        let _ = self.child.kill().await;
    }
}

/// The streams, on a fresh server: each line of each stream.
async fn stream_scenario(server: &Server) -> Vec<Answer> {
    let ep = server.endpoint();
    let mut s = Session {
        server,
        answers: Vec::new(),
    };
    let mut record = |call: &str, line: Option<Value>| {
        s.answers.push(Answer {
            call: call.to_owned(),
            status: 200,
            body: line.unwrap_or(Value::Null),
        });
    };

    // The guide's watch: created, then the put's event.
    let call = r#"POST /v3/watch {"create_request": {"key":"Zm9v"} }"#;
    let mut watch = StreamReader::open(&ep, "/v3/watch", r#"{"create_request": {"key":"Zm9v"} }"#);
    record(call, watch.line(&[]).await);
    let (status, _) = curl(
        "POST",
        &ep,
        "/v3/kv/put",
        Some(r#"{"key": "Zm9v", "value": "YmFy"}"#),
    );
    assert_eq!(status, 200);
    record(call, watch.line(&[]).await);
    watch.close().await;

    // History from revision 1 with prev_kv, after a second put; the /v3beta/ prefix.
    curl(
        "POST",
        &ep,
        "/v3/kv/put",
        Some(r#"{"key":"Zm9v","value":"YmF6"}"#),
    );
    let body =
        r#"{"create_request":{"key":"Zm9v","start_revision":"1","prev_kv":true,"watch_id":"7"}}"#;
    let call = format!("POST /v3beta/watch {body}");
    let mut watch = StreamReader::open(&ep, "/v3beta/watch", body);
    record(&call, watch.line(&[]).await);
    record(&call, watch.line(&[]).await);
    watch.close().await;

    // Keepalive: one answer per request in the body, then the stream ends.
    curl(
        "POST",
        &ep,
        "/v3/lease/grant",
        Some(r#"{"TTL":"60","ID":"5000"}"#),
    );
    let body = r#"{"ID":"5000"} {"ID":"12345"}"#;
    let call = format!("POST /v3/lease/keepalive {body}");
    let mut keepalive = StreamReader::open(&ep, "/v3/lease/keepalive", body);
    record(&call, keepalive.line(&[]).await);
    record(&call, keepalive.line(&[]).await);
    record(&call, keepalive.line(&[]).await);
    keepalive.close().await;

    // Observe: the current leader at once.
    curl(
        "POST",
        &ep,
        "/v3/lease/grant",
        Some(r#"{"TTL":"60","ID":"6000"}"#),
    );
    curl(
        "POST",
        &ep,
        "/v3/election/campaign",
        Some(r#"{"name":"b2JzZXJ2ZWQ=","lease":"6000","value":"djE="}"#),
    );
    let body = r#"{"name":"b2JzZXJ2ZWQ="}"#;
    let call = format!("POST /v3/election/observe {body}");
    let mut observe = StreamReader::open(&ep, "/v3/election/observe", body);
    record(&call, observe.line(&[]).await);
    observe.close().await;

    // A stream whose first request does not decode fails as a whole (code Unknown, 500).
    s.post_code_only("/v3/watch", "{bad");
    s.post_code_only("/v3/lease/keepalive", r#"{"ID":true}"#);
    s.answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_answer_as_etcds_gateway() {
    let etcd = Etcd::start().await;
    let etcd_answers = stream_scenario(&etcd).await;
    drop(etcd);
    let leasehold = Leasehold::start().await;
    let leasehold_answers = stream_scenario(&leasehold).await;
    assert_same(&etcd_answers, &leasehold_answers);
    // The guide's watch event, in full (identity masked).
    assert_eq!(
        leasehold_answers[1].body["result"]["events"][0]["kv"],
        serde_json::json!({"key":"Zm9v","create_revision":"2","mod_revision":"2","version":"1","value":"YmFy"})
    );
    // The keepalive stream ended after its two answers.
    assert_eq!(leasehold_answers[6].body, Value::Null);
}

/// A body larger than a message may be is refused with grpc-go's ResourceExhausted (429); a
/// put above `--max-request-bytes` gets etcd's "request is too large".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_size_limits_hold_on_the_gateway() {
    let args = ["--max-request-bytes", "1024"];
    let setup = common::Setup {
        args: args.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    };
    let leasehold = Leasehold::start_with(setup).await;
    let ep = leasehold.endpoint();
    // 2,000 value bytes: above the limit, within gRPC's allowance.
    let value = "QUFB".repeat(2000 / 3);
    let (status, body) = curl(
        "POST",
        &ep,
        "/v3/kv/put",
        Some(&format!(r#"{{"key":"Zm9v","value":"{value}"}}"#)),
    );
    if leasehold.kind() == common::Kind::Etcd {
        return; // LEASEHOLD_DIFF_AGAINST_ETCD: the rest is leasehold's own bound.
    }
    assert_eq!(
        (status, body.as_str()),
        (
            400,
            r#"{"error":"etcdserver: request is too large","message":"etcdserver: request is too large","code":3}"#
        )
    );
    // Far beyond what a message may be: refused before it is decoded.
    let huge = "QUFB".repeat(1_000_000);
    let body_file = leasehold.root_dir().join("huge.json");
    std::fs::write(&body_file, format!(r#"{{"key":"Zm9v","value":"{huge}"}}"#)).unwrap();
    let (status, body) = curl(
        "POST",
        &ep,
        "/v3/kv/put",
        Some(&format!("@{}", body_file.display())),
    );
    assert_eq!(status, 429, "{body}");
    assert!(
        body.contains("grpc: received message larger than max"),
        "{body}"
    );
    // Within the body limit, but a decoded message above what gRPC takes (1,024 bytes plus
    // etcd's 512 KiB allowance): refused as the gRPC transport refuses it, for every call.
    let name = "QUFB".repeat(600_000 / 3);
    for path in ["/v3/lock/lock", "/v3/kv/range"] {
        let field = if path.ends_with("lock") {
            "name"
        } else {
            "key"
        };
        std::fs::write(&body_file, format!(r#"{{"{field}":"{name}"}}"#)).unwrap();
        let (status, body) = curl(
            "POST",
            &ep,
            path,
            Some(&format!("@{}", body_file.display())),
        );
        let head = &body[..body.len().min(300)];
        assert_eq!(status, 429, "{path}: {head}");
        assert!(
            body.contains("grpc: received message larger than max"),
            "{path}: {head}"
        );
    }
    // The member still serves.
    let (status, _) = curl("POST", &ep, "/v3/kv/range", Some(r#"{"key":"Zm9v"}"#));
    assert_eq!(status, 200);
}

/// `--enable-grpc-gateway=false`: the gateway's paths get the 404 page etcd answers then, and
/// the member's other HTTP endpoints still serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_can_be_turned_off_as_in_etcd() {
    let mut answers = Vec::new();
    for kind in [common::Kind::Etcd, common::Kind::Leasehold] {
        let cluster = common::Cluster::start_with(kind, 1, &["--enable-grpc-gateway=false"]).await;
        let ep = cluster.endpoints()[0].clone();
        let range = curl("POST", &ep, "/v3/kv/range", Some(r#"{"key":"Zm9v"}"#));
        let health = curl("GET", &ep, "/health", None);
        answers.push((range, health.0));
    }
    assert_eq!(answers[0], answers[1], "etcd, then leasehold");
    assert_eq!(answers[1].0.0, 404, "{:?}", answers[1]);
    assert_eq!(answers[1].1, 200);
}
