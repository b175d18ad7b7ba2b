//! Plain HTTP requests with real `curl`, as operators and HTTP clients send them.

use std::process::Command;

/// Bound of one curl call.
const CURL_TIME_MAX_SECS: &str = "10";

/// `curl -X <method> <endpoint><path> [-d <body>]` over HTTP/1.1: the status code and the body.
/// A body starting with `@` is read from that file, as curl reads it.
pub fn curl(method: &str, endpoint: &str, path: &str, body: Option<&str>) -> (u16, String) {
    curl_with(method, endpoint, path, body, &[])
}

/// [`curl`] with more headers (`-H "Name: value"`), such as `Authorization: <token>`.
pub fn curl_with(
    method: &str,
    endpoint: &str,
    path: &str,
    body: Option<&str>,
    headers: &[&str],
) -> (u16, String) {
    let mut command = Command::new("curl");
    for header in headers {
        command.args(["-H", header]);
    }
    command
        .args(["-sS", "--http1.1", "-w", "\n%{http_code}"])
        .args(["--max-time", CURL_TIME_MAX_SECS])
        .args(["-X", method]);
    if let Some(body) = body {
        command.args(["-d", body]);
    }
    let out = command
        .arg(format!("{endpoint}{path}"))
        .output()
        .expect("run curl");
    assert!(out.status.success(), "curl {path}: {out:?}");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let (body, code) = text.rsplit_once('\n').expect("status line");
    (code.parse().expect("status code"), body.to_owned())
}
