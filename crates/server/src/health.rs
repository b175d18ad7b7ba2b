//! etcd's HTTP endpoints on the client port, beside gRPC (HTTP/1.1 and HTTP/2 both): `/health`,
//! `/livez`, `/readyz` and `/version`, in etcd 3.5's shapes, and the `grpc.health.v1` service.
//!
//! - `/health`: `{"health":"true","reason":""}`, or 503 with `"false"` and why. It fails without
//!   a leader (unless `?serializable=true`) and when a read does not succeed in time: a
//!   linearizable one, or with `?serializable=true` a local one, and first while an alarm is
//!   raised (`ALARM NOSPACE`), unless `?exclude=NOSPACE` (or `CORRUPT`) names it.
//! - `/livez` (check `serializable_read`) and `/readyz` (`data_corruption`, `serializable_read`,
//!   `linearizable_read`, `non_learner`): `ok`, or with `?verbose` one line per check and
//!   `<path> check passed`; a failed check gives 503, one line per check and `<path> check
//!   failed`. `?exclude=NAME` skips a check.
//! - `/version`: `{"etcdserver":"3.7.3","etcdcluster":"3.7.0"}`.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use leasehold_raft::Alarm;

use crate::context::ServerContext;
use crate::error::{ApiError, Unimplemented};
use crate::version::ETCD_API_VERSION;

/// How long a check's read may take before the check fails.
const CHECK_READ_TIMEOUT: Duration = Duration::from_secs(2);
/// The cluster version `/version` reports (etcd reports major.minor.0).
const ETCD_CLUSTER_VERSION: &str = "3.7.0";

/// The HTTP routes, to merge with the gRPC services' (whose fallback [`not_found`] replaces).
pub(crate) fn router(ctx: Arc<ServerContext>) -> Router {
    Router::new()
        .route("/health", get(health).fallback(method_not_allowed))
        .route("/livez", get(livez).fallback(method_not_allowed))
        .route("/readyz", get(readyz).fallback(method_not_allowed))
        .route("/version", get(version).fallback(method_not_allowed))
        .route("/debug/vars", get(debug_vars).fallback(method_not_allowed))
        .route(
            "/metrics",
            get(crate::metrics::serve_metrics).fallback(method_not_allowed),
        )
        .with_state(ctx)
}

/// A query string's `name=value` pairs, in order (a bare `name` has an empty value).
fn query_pairs(query: Option<&str>) -> Vec<(&str, &str)> {
    query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
        .collect()
}

/// A response with the CORS headers etcd puts on every HTTP answer.
fn answer(status: StatusCode, content_type: &'static str, body: String) -> Response {
    let [allow_headers, allow_methods, allow_origin] = CORS_HEADERS;
    let headers = [
        (header::CONTENT_TYPE, content_type),
        allow_headers,
        allow_methods,
        allow_origin,
    ];
    (status, headers, body).into_response()
}

/// The CORS headers etcd puts on every HTTP answer (its gateway's too).
pub(crate) const CORS_HEADERS: [(header::HeaderName, &str); 3] = [
    (
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        "accept, content-type, authorization",
    ),
    (
        header::ACCESS_CONTROL_ALLOW_METHODS,
        "POST, GET, OPTIONS, PUT, DELETE",
    ),
    (header::ACCESS_CONTROL_ALLOW_ORIGIN, "*"),
];

fn json(status: StatusCode, body: String) -> Response {
    answer(status, "application/json", body)
}

/// etcd writes `/health`'s JSON without a content type, so Go names it plain text.
fn text(status: StatusCode, body: String) -> Response {
    answer(status, "text/plain; charset=utf-8", body)
}

async fn version() -> Response {
    // Built by hand: etcd's key order (serde_json's map would sort the keys).
    let body = format!(
        r#"{{"etcdserver":{},"etcdcluster":{}}}"#,
        serde_json::Value::from(ETCD_API_VERSION),
        serde_json::Value::from(ETCD_CLUSTER_VERSION),
    );
    json(StatusCode::OK, body)
}

/// `/debug/vars`: what etcd publishes through Go's expvar that a program of another language
/// can say truthfully: `cmdline` (the process's arguments) and `raft.status` (this member's id,
/// term, leader, role, commit and apply indexes, under etcd's names; ids in hex). Go's
/// `memstats` has no counterpart here.
async fn debug_vars(State(ctx): State<Arc<ServerContext>>) -> Response {
    let replica = &ctx.replica;
    let status = replica.status();
    let role = match (replica.is_leader(), replica.is_learner()) {
        (true, _) => "StateLeader",
        (false, true) => "StateLearner",
        (false, false) => "StateFollower",
    };
    let raft = serde_json::json!({
        "id": format!("{:x}", replica.member_id()),
        "term": status.term,
        "lead": format!("{:x}", status.leader.unwrap_or(0)),
        "raftState": role,
        "commit": replica.telemetry().committed_index,
        "applied": status.applied_index,
    });
    let cmdline: Vec<String> = std::env::args().collect();
    // Built by hand: expvar's key order (serde_json's map would sort the keys).
    let body = format!(
        "{{\n\"cmdline\": {},\n\"raft.status\": {}\n}}\n",
        serde_json::Value::from(cmdline),
        raft
    );
    json(StatusCode::OK, body)
}

/// Any method but GET on an endpoint: etcd's 405 (the dashboard's routes answer it too).
pub(crate) async fn method_not_allowed() -> Response {
    let mut response = text(
        StatusCode::METHOD_NOT_ALLOWED,
        "Method Not Allowed\n".to_owned(),
    );
    response
        .headers_mut()
        .insert(header::ALLOW, header::HeaderValue::from_static("GET"));
    response
}

/// What a path that is neither an HTTP endpoint nor a gRPC method gets: gRPC's Unimplemented
/// for a gRPC request (as tonic answers), etcd's 404 page for anything else.
pub(crate) async fn not_found(request: axum::extract::Request) -> Response {
    let grpc = request
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if grpc {
        let status = tonic::Status::from(ApiError::from(Unimplemented::UnknownMethod));
        return status.into_http::<axum::body::Body>().into_response();
    }
    text(StatusCode::NOT_FOUND, "404 page not found\n".to_owned())
}

/// A read of the applied state, bounded by [`CHECK_READ_TIMEOUT`]; why it failed if it did.
async fn read_check(ctx: &ServerContext, linearizable: bool) -> Result<(), String> {
    let read = ctx.replica.read(linearizable, |s| s.current_revision());
    match tokio::time::timeout(CHECK_READ_TIMEOUT, read).await {
        Ok(Ok(_)) => Ok(()),
        // etcd's words: its check prints the error its read got.
        Ok(Err(e)) => Err(tonic::Status::from(ApiError::from(e)).message().to_owned()),
        Err(_) => Err(format!("no answer within {CHECK_READ_TIMEOUT:?}")),
    }
}

async fn health(State(ctx): State<Arc<ServerContext>>, RawQuery(query): RawQuery) -> Response {
    let answer = health_answer(&ctx, query).await;
    ctx.metrics
        .health_checked(answer.status() == StatusCode::OK);
    answer
}

async fn health_answer(ctx: &ServerContext, query: Option<String>) -> Response {
    let pairs = query_pairs(query.as_deref());
    let serializable = pairs
        .iter()
        .any(|(k, v)| *k == "serializable" && *v == "true");
    let unhealthy = |reason: String| {
        let body = serde_json::json!({ "health": "false", "reason": reason });
        text(StatusCode::SERVICE_UNAVAILABLE, body.to_string())
    };
    // A raised alarm fails the check first, unless `exclude` names its type.
    let excluded = |name: &str| pairs.iter().any(|(k, v)| *k == "exclude" && *v == name);
    for alarm in ctx.replica.alarms() {
        let name = crate::maintenance::alarm_name(alarm.alarm);
        if !excluded(name) {
            return unhealthy(format!("ALARM {name}"));
        }
    }
    if !serializable && ctx.replica.status().leader.is_none() {
        return unhealthy("RAFT NO LEADER".to_owned());
    }
    if let Err(why) = read_check(ctx, !serializable).await {
        return unhealthy(format!("RANGE ERROR:{why}"));
    }
    text(
        StatusCode::OK,
        serde_json::json!({ "health": "true", "reason": "" }).to_string(),
    )
}

/// One of the checks `/livez` and `/readyz` run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Check {
    DataCorruption,
    SerializableRead,
    LinearizableRead,
    NonLearner,
}

impl Check {
    fn name(self) -> &'static str {
        match self {
            Check::DataCorruption => "data_corruption",
            Check::SerializableRead => "serializable_read",
            Check::LinearizableRead => "linearizable_read",
            Check::NonLearner => "non_learner",
        }
    }

    async fn run(self, ctx: &ServerContext) -> Result<(), String> {
        match self {
            // The CORRUPT alarm, for any member, is what fails etcd's check.
            Check::DataCorruption => {
                let alarms = ctx.replica.alarms();
                if alarms.iter().any(|a| a.alarm == Alarm::Corrupt) {
                    Err("alarm activated: CORRUPT".to_owned())
                } else {
                    Ok(())
                }
            }
            Check::SerializableRead => read_check(ctx, false).await,
            Check::LinearizableRead => read_check(ctx, true).await,
            Check::NonLearner => {
                let learner = ctx
                    .replica
                    .members()
                    .iter()
                    .find(|m| m.id == ctx.member_id)
                    .is_none_or(|m| m.learner);
                if learner {
                    Err("this member is a learner".to_owned())
                } else {
                    Ok(())
                }
            }
        }
    }
}

async fn livez(State(ctx): State<Arc<ServerContext>>, RawQuery(query): RawQuery) -> Response {
    probe(&ctx, "livez", &[Check::SerializableRead], query.as_deref()).await
}

async fn readyz(State(ctx): State<Arc<ServerContext>>, RawQuery(query): RawQuery) -> Response {
    let checks = [
        Check::DataCorruption,
        Check::SerializableRead,
        Check::LinearizableRead,
        Check::NonLearner,
    ];
    probe(&ctx, "readyz", &checks, query.as_deref()).await
}

/// Runs `checks` (less those excluded) and answers as Kubernetes-style probes do.
async fn probe(ctx: &ServerContext, path: &str, checks: &[Check], query: Option<&str>) -> Response {
    let pairs = query_pairs(query);
    let verbose = pairs.iter().any(|(k, _)| *k == "verbose");
    let excluded = |c: &Check| pairs.iter().any(|(k, v)| *k == "exclude" && *v == c.name());
    let mut lines = String::new();
    let mut failed = false;
    for check in checks {
        if excluded(check) {
            lines.push_str(&format!("[+]{} excluded: ok\n", check.name()));
            continue;
        }
        match check.run(ctx).await {
            Ok(()) => lines.push_str(&format!("[+]{} ok\n", check.name())),
            Err(why) => {
                failed = true;
                lines.push_str(&format!("[-]{} failed: {why}\n", check.name()));
            }
        }
    }
    if failed {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{lines}{path} check failed\n"),
        );
    }
    if verbose {
        text(StatusCode::OK, format!("{lines}{path} check passed\n"))
    } else {
        text(StatusCode::OK, "ok".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_pairs_take_bare_names_repeats_and_empty_parts() {
        assert_eq!(
            query_pairs(Some("verbose&exclude=a&exclude=b&&serializable=true")),
            vec![
                ("verbose", ""),
                ("exclude", "a"),
                ("exclude", "b"),
                ("serializable", "true")
            ]
        );
        assert!(query_pairs(None).is_empty());
    }
}
