//! etcd's JSON gateway on the client port: `POST /v3/<service>/<call>` with a JSON body, as
//! etcd 3.4/3.5 serve it through grpc-gateway, and the same under `/v3beta/` (etcd rewrites that
//! prefix to `/v3/` before routing).
//!
//! ```text
//!   POST /v3/kv/range {"key":"Zm9v"} ─► body.rs: JSON (pbjson, from the protos) ─► RangeRequest
//!     ─► the gRPC service's own trait method, in-process (same validation, same errors)
//!     ─► 200 + RangeResponse as JSON   |   error: grpc-gateway's HTTP code + {"error","message","code"}
//!   POST /v3/watch {"create_request":{..}} {..}  ─► the body's values feed the service's request
//!     stream ─► each response written as it comes: {"result":{..}}\n ; a failure: {"error":{..}}
//! ```
//!
//! Nothing here has semantics of its own: every call goes to the service that serves it over
//! gRPC, so the two can never disagree. What is here is grpc-gateway's: paths, the JSON shapes
//! of answers and errors, the HTTP status of each gRPC code, and when headers are written (a
//! stream's status waits for its first message, so a stream that fails at once gets the
//! failure's status). Bodies are bounded: a message may be as long as a gRPC message may
//! (`--max-request-bytes` plus grpc-go's allowance) times two for base64, and the services
//! then make their own size checks on the decoded message.

mod body;

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, any, post};
use futures::stream::BoxStream as FuturesBoxStream;
use leasehold_api::etcdserverpb::{
    auth_server::Auth, cluster_server::Cluster, kv_server::Kv, lease_server::Lease,
    maintenance_server::Maintenance,
};
use leasehold_api::v3electionpb::election_server::Election;
use leasehold_api::v3lockpb::lock_server::Lock;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::BoxStream;
use tonic::metadata::MetadataMap;
use tonic::{Code, Status};

use crate::context::ServerContext;
use crate::error::ApiError;
use body::{BodyError, JsonMessages, go_json, unary_request};

/// Requests of a client stream (watch, keepalive) decoded ahead of the service.
const STREAM_REQUEST_QUEUE_LEN: usize = 16;
/// The prefixes etcd routes to its gateway (`/v3beta/` is rewritten to `/v3/` by etcd).
const PREFIXES: [&str; 2] = ["/v3", "/v3beta"];

/// What each handler needs: the member and the longest JSON message a body may carry.
#[derive(Clone)]
struct Gateway {
    ctx: Arc<ServerContext>,
    message_bytes_max: usize,
}

/// The gateway's routes, to merge with the gRPC services' router.
pub(crate) fn router(ctx: Arc<ServerContext>) -> Router {
    let gw = Gateway {
        // base64 makes bytes a third longer; JSON's names and quotes add a little.
        message_bytes_max: ctx.limits.grpc_message_bytes_max().saturating_mul(2),
        ctx: ctx.clone(),
    };
    let kv = Arc::new(crate::kv::KvService::new(ctx.clone()));
    let lease = Arc::new(crate::lease::LeaseService::new(ctx.clone()));
    let watch = Arc::new(crate::watch::WatchService::new(ctx.clone()));
    let cluster = Arc::new(crate::cluster::ClusterService::new(ctx.clone()));
    let maintenance = Arc::new(crate::maintenance::MaintenanceService::new(ctx.clone()));
    let lock = Arc::new(crate::lock::LockService::new(ctx.clone()));
    let election = Arc::new(crate::election::ElectionService::new(ctx.clone()));
    let auth = Arc::new(crate::auth::AuthService::new(ctx.clone()));

    // One unary call: decode the body, call the service's trait method, answer.
    macro_rules! unary {
        ($trait:ident, $svc:expr, $method:ident) => {{
            let svc = $svc.clone();
            gw.unary(move |req| {
                let svc = svc.clone();
                async move { $trait::$method(&*svc, req).await }
            })
        }};
    }
    // A call whose answer is a stream, with a unary request (Observe, Snapshot).
    macro_rules! server_stream {
        ($trait:ident, $svc:expr, $method:ident) => {{
            let svc = $svc.clone();
            gw.server_stream(move |req| {
                let svc = svc.clone();
                async move { $trait::$method(&*svc, req).await }
            })
        }};
    }

    let watch_route = {
        let watch = watch.clone();
        gw.clone().client_stream(move |required, token, inbound| {
            watch.open(required, (token, None), inbound)
        })
    };
    let keepalive_route = {
        let lease = lease.clone();
        gw.clone().client_stream(move |required, _token, inbound| {
            lease.open_keep_alive(required, inbound)
        })
    };
    let calls: Vec<(&str, MethodRouter)> = vec![
        ("/kv/range", unary!(Kv, kv, range)),
        ("/kv/put", unary!(Kv, kv, put)),
        ("/kv/deleterange", unary!(Kv, kv, delete_range)),
        ("/kv/txn", unary!(Kv, kv, txn)),
        ("/kv/compaction", unary!(Kv, kv, compact)),
        ("/watch", watch_route),
        ("/lease/grant", unary!(Lease, lease, lease_grant)),
        ("/lease/revoke", unary!(Lease, lease, lease_revoke)),
        ("/kv/lease/revoke", unary!(Lease, lease, lease_revoke)),
        ("/lease/keepalive", keepalive_route),
        (
            "/lease/timetolive",
            unary!(Lease, lease, lease_time_to_live),
        ),
        (
            "/kv/lease/timetolive",
            unary!(Lease, lease, lease_time_to_live),
        ),
        ("/lease/leases", unary!(Lease, lease, lease_leases)),
        ("/kv/lease/leases", unary!(Lease, lease, lease_leases)),
        ("/cluster/member/add", unary!(Cluster, cluster, member_add)),
        (
            "/cluster/member/remove",
            unary!(Cluster, cluster, member_remove),
        ),
        (
            "/cluster/member/update",
            unary!(Cluster, cluster, member_update),
        ),
        (
            "/cluster/member/list",
            unary!(Cluster, cluster, member_list),
        ),
        (
            "/cluster/member/promote",
            unary!(Cluster, cluster, member_promote),
        ),
        (
            "/maintenance/alarm",
            unary!(Maintenance, maintenance, alarm),
        ),
        (
            "/maintenance/status",
            unary!(Maintenance, maintenance, status),
        ),
        (
            "/maintenance/defragment",
            unary!(Maintenance, maintenance, defragment),
        ),
        ("/maintenance/hash", unary!(Maintenance, maintenance, hash)),
        (
            "/maintenance/hashkv",
            unary!(Maintenance, maintenance, hash_kv),
        ),
        (
            "/maintenance/snapshot",
            server_stream!(Maintenance, maintenance, snapshot),
        ),
        (
            "/maintenance/transfer-leadership",
            unary!(Maintenance, maintenance, move_leader),
        ),
        (
            "/maintenance/downgrade",
            unary!(Maintenance, maintenance, downgrade),
        ),
        ("/lock/lock", unary!(Lock, lock, lock)),
        ("/lock/unlock", unary!(Lock, lock, unlock)),
        ("/election/campaign", unary!(Election, election, campaign)),
        ("/election/proclaim", unary!(Election, election, proclaim)),
        ("/election/leader", unary!(Election, election, leader)),
        (
            "/election/observe",
            server_stream!(Election, election, observe),
        ),
        ("/election/resign", unary!(Election, election, resign)),
        ("/auth/enable", unary!(Auth, auth, auth_enable)),
        ("/auth/disable", unary!(Auth, auth, auth_disable)),
        ("/auth/status", unary!(Auth, auth, auth_status)),
        ("/auth/authenticate", unary!(Auth, auth, authenticate)),
        ("/auth/user/add", unary!(Auth, auth, user_add)),
        ("/auth/user/get", unary!(Auth, auth, user_get)),
        ("/auth/user/list", unary!(Auth, auth, user_list)),
        ("/auth/user/delete", unary!(Auth, auth, user_delete)),
        (
            "/auth/user/changepw",
            unary!(Auth, auth, user_change_password),
        ),
        ("/auth/user/grant", unary!(Auth, auth, user_grant_role)),
        ("/auth/user/revoke", unary!(Auth, auth, user_revoke_role)),
        ("/auth/role/add", unary!(Auth, auth, role_add)),
        ("/auth/role/get", unary!(Auth, auth, role_get)),
        ("/auth/role/list", unary!(Auth, auth, role_list)),
        ("/auth/role/delete", unary!(Auth, auth, role_delete)),
        (
            "/auth/role/grant",
            unary!(Auth, auth, role_grant_permission),
        ),
        (
            "/auth/role/revoke",
            unary!(Auth, auth, role_revoke_permission),
        ),
    ];

    let mut router = Router::new();
    for prefix in PREFIXES {
        for (path, call) in &calls {
            let route = call.clone().fallback(method_not_allowed);
            router = router.route(&format!("{prefix}{path}"), route);
        }
        router = router
            .route(&format!("{prefix}/"), any(gateway_not_found))
            .route(&format!("{prefix}/{{*rest}}"), any(gateway_not_found));
    }
    // Go's ServeMux sends `/v3` to the subtree it registered, `/v3/`.
    router.route("/v3", any(redirect_to_v3))
}

impl Gateway {
    /// A unary call's route: the body's message (400 if it does not decode) to `call`.
    fn unary<Req, Resp, F, Fut>(&self, call: F) -> MethodRouter
    where
        Req: DeserializeOwned + Default + prost::Message + Send + 'static,
        Resp: Serialize + Send + 'static,
        F: Fn(tonic::Request<Req>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<tonic::Response<Resp>, Status>> + Send + 'static,
    {
        let gw = self.clone();
        post(move |headers: HeaderMap, body: Body| async move {
            let req = match unary_request::<Req>(body, gw.message_bytes_max).await {
                Ok(req) => req,
                Err(e) => return error_response(&request_status(e, Code::InvalidArgument)),
            };
            // The check gRPC's transport makes of every request (tonic's decoding limit), which
            // the in-process call would skip: grpc-go's ResourceExhausted, 429, as from etcd.
            if let Err(e) = gw.ctx.limits.message_size(&req) {
                return error_response(&e.into());
            }
            match call(request(&headers, req)).await {
                Ok(resp) => ok_response(Body::from(go_json(resp.get_ref()))),
                Err(status) => error_response(&status),
            }
        })
    }

    /// A call with a unary request and a stream of answers.
    fn server_stream<Req, Resp, F, Fut>(&self, call: F) -> MethodRouter
    where
        Req: DeserializeOwned + Default + prost::Message + Send + 'static,
        Resp: Serialize + Send + 'static,
        F: Fn(tonic::Request<Req>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<tonic::Response<BoxStream<Resp>>, Status>> + Send + 'static,
    {
        let gw = self.clone();
        post(move |headers: HeaderMap, body: Body| async move {
            let req = match unary_request::<Req>(body, gw.message_bytes_max).await {
                Ok(req) => req,
                Err(e) => return error_response(&request_status(e, Code::InvalidArgument)),
            };
            // The check gRPC's transport makes of every request (tonic's decoding limit), which
            // the in-process call would skip: grpc-go's ResourceExhausted, 429, as from etcd.
            if let Err(e) = gw.ctx.limits.message_size(&req) {
                return error_response(&e.into());
            }
            // A call that fails at once fails at the first message in grpc-go's client, which
            // is how etcd's gateway sees it: as a stream error.
            let answers = match call(request(&headers, req)).await {
                Ok(resp) => resp.into_inner(),
                Err(status) => Box::pin(futures::stream::once(async move { Err(status) })),
            };
            stream_response(answers).await
        })
    }

    /// A call with a stream of requests (the body's JSON values, in order) and of answers.
    /// `open` starts the service's stream: whether it requires a leader, and the requests.
    fn client_stream<Req, Resp, F>(self, open: F) -> MethodRouter
    where
        Req: DeserializeOwned + Send + 'static,
        Resp: Serialize + Send + 'static,
        F: Fn(bool, Option<String>, ReceiverStream<Result<Req, Status>>) -> BoxStream<Resp>
            + Clone
            + Send
            + Sync
            + 'static,
    {
        post(move |headers: HeaderMap, body: Body| async move {
            let mut messages = JsonMessages::new(body, self.message_bytes_max);
            // The first message is read before the call: one that does not decode fails the
            // request (as grpc-gateway fails it, with code Unknown), later ones only end the
            // requests.
            let first = match messages.next::<Req>().await {
                Ok(first) => first,
                Err(e) => return error_response(&request_status(e, Code::Unknown)),
            };
            // The token (`Authorization`), for the calls the stream's requests make.
            let token = crate::auth::token(&request(&headers, ()));
            let required = match self.ctx.require_leader(&request(&headers, ())) {
                Ok(required) => required,
                Err(status) => {
                    let failed = futures::stream::once(async move { Err(status) });
                    return stream_response::<Resp>(Box::pin(failed)).await;
                }
            };
            let (tx, rx) = mpsc::channel(STREAM_REQUEST_QUEUE_LEN);
            // With no request at all, `tx` goes now: the service sees its requests end.
            if let Some(first) = first {
                tokio::spawn(async move {
                    if tx.send(Ok(first)).await.is_err() {
                        return;
                    }
                    // Until the body ends, a value does not decode, or the stream is gone:
                    // a stream that ended on its own (an error, a stop) lets go of the body
                    // even while the client keeps it open.
                    loop {
                        let next = tokio::select! {
                            next = messages.next::<Req>() => next,
                            () = tx.closed() => return,
                        };
                        let Ok(Some(next)) = next else { return };
                        if tx.send(Ok(next)).await.is_err() {
                            return;
                        }
                    }
                });
            } else {
                drop(tx);
            }
            stream_response(open(required, token, ReceiverStream::new(rx))).await
        })
    }
}

/// A request for a service, with the metadata grpc-gateway passes on: `Grpc-Metadata-<name>`
/// headers as `<name>` (etcd's `hasleader` travels so), and `Authorization`.
fn request<T>(headers: &HeaderMap, message: T) -> tonic::Request<T> {
    let mut passed = HeaderMap::new();
    for (name, value) in headers {
        let name = name.as_str();
        let key = if let Some(key) = name.strip_prefix("grpc-metadata-") {
            key
        } else if name == "authorization" {
            name
        } else {
            continue;
        };
        if let Ok(key) = header::HeaderName::from_bytes(key.as_bytes()) {
            passed.append(key, value.clone());
        }
    }
    tonic::Request::from_parts(
        MetadataMap::from_headers(passed),
        Default::default(),
        message,
    )
}

/// The status a body that gave no message answers with; `json_code` for JSON that does not
/// decode (grpc-gateway: InvalidArgument for a unary request, Unknown for a stream's first).
fn request_status(e: BodyError, json_code: Code) -> Status {
    match e {
        BodyError::Json(why) => Status::new(json_code, why),
        BodyError::TooLarge { len, max } => ApiError::MessageTooLarge { len, max }.into(),
        BodyError::Read(why) => Status::new(Code::Unknown, why),
    }
}

/// grpc-gateway 1.x's HTTP status for each gRPC code (`runtime.HTTPStatusFromCode`).
fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::Cancelled => StatusCode::REQUEST_TIMEOUT,
        Code::Unknown => StatusCode::INTERNAL_SERVER_ERROR,
        Code::InvalidArgument => StatusCode::BAD_REQUEST,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::FailedPrecondition => StatusCode::PRECONDITION_FAILED,
        Code::Aborted => StatusCode::CONFLICT,
        Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// grpc-gateway's error body for a unary call: `{"error":M,"message":M,"code":N}`, empty
/// strings left out as its JSON marshaler leaves them out.
#[derive(Serialize)]
struct ErrorBody<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    error: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    message: &'a str,
    code: i32,
}

/// grpc-gateway's error chunk in a stream: `{"error":{"grpc_code":N,"http_code":H,...}}`.
#[derive(Serialize)]
struct StreamError<'a> {
    grpc_code: i32,
    http_code: u16,
    #[serde(skip_serializing_if = "str::is_empty")]
    message: &'a str,
    http_status: &'static str,
}

#[derive(Serialize)]
struct StreamChunk<T> {
    result: T,
}

#[derive(Serialize)]
struct StreamErrorChunk<'a> {
    error: StreamError<'a>,
}

fn stream_error_chunk(status: &Status) -> Bytes {
    let http = http_status(status.code());
    let chunk = StreamErrorChunk {
        error: StreamError {
            grpc_code: status.code() as i32,
            http_code: http.as_u16(),
            message: status.message(),
            http_status: http.canonical_reason().unwrap_or(""),
        },
    };
    Bytes::from(go_json(&chunk))
}

/// etcd's headers on every answer (its CORS headers), with `content_type`.
fn with_headers(mut response: Response, content_type: &'static str) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    for (name, value) in crate::health::CORS_HEADERS {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// A successful answer: grpc-gateway also names the gRPC content type it was given.
fn ok_response(body: Body) -> Response {
    let mut response = with_headers(body.into_response(), "application/json");
    response.headers_mut().insert(
        "grpc-metadata-content-type",
        HeaderValue::from_static("application/grpc"),
    );
    response
}

fn error_response(status: &Status) -> Response {
    let body = ErrorBody {
        error: status.message(),
        message: status.message(),
        code: status.code() as i32,
    };
    let mut response = with_headers(go_json(&body).into_response(), "application/json");
    *response.status_mut() = http_status(status.code());
    response
}

/// A stream's answer: each message as `{"result":..}` and a newline, written as it comes; a
/// failure as grpc-gateway's error chunk, which ends it. The status line waits for the first
/// message (as grpc-gateway writes nothing before it), so a stream failing at once answers
/// with the failure's status; one the service ends without a message is an empty 200.
async fn stream_response<Resp>(mut answers: BoxStream<Resp>) -> Response
where
    Resp: Serialize + Send + 'static,
{
    let result = |message: Resp| {
        let mut line = go_json(&StreamChunk { result: message });
        line.push('\n');
        Bytes::from(line)
    };
    match answers.next().await {
        None => ok_response(Body::empty()),
        Some(Err(status)) => {
            let mut response = with_headers(
                Body::from(stream_error_chunk(&status)).into_response(),
                "application/json",
            );
            *response.status_mut() = http_status(status.code());
            response
        }
        Some(Ok(first)) => {
            let first = result(first);
            // The rest, up to and including the first failure.
            let rest = futures::StreamExt::scan(answers, false, move |failed, answer| {
                let chunk = match answer {
                    _ if *failed => None,
                    Ok(message) => Some(result(message)),
                    Err(status) => {
                        *failed = true;
                        Some(stream_error_chunk(&status))
                    }
                };
                futures::future::ready(chunk)
            })
            .map(Ok::<Bytes, std::convert::Infallible>);
            let chunks: FuturesBoxStream<'static, Result<Bytes, std::convert::Infallible>> =
                Box::pin(futures::stream::once(async move { Ok(first) }).chain(rest));
            ok_response(Body::from_stream(chunks))
        }
    }
}

/// An unknown path under the gateway's prefixes: grpc-gateway's 404.
async fn gateway_not_found() -> Response {
    plain(StatusCode::NOT_FOUND, "Not Found\n")
}

/// A known path with a method other than POST: grpc-gateway's 405.
async fn method_not_allowed() -> Response {
    plain(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed\n")
}

/// Go's `http.Error`: plain text, `nosniff`.
fn plain(status: StatusCode, text: &'static str) -> Response {
    let mut response = with_headers(text.into_response(), "text/plain; charset=utf-8");
    *response.status_mut() = status;
    response.headers_mut().insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    response
}

async fn redirect_to_v3() -> Response {
    let mut response = with_headers(().into_response(), "text/html; charset=utf-8");
    *response.status_mut() = StatusCode::MOVED_PERMANENTLY;
    response
        .headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static("/v3/"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_have_grpc_gateways_shapes() {
        let status = Status::new(Code::InvalidArgument, "etcdserver: key is not provided");
        let body = ErrorBody {
            error: status.message(),
            message: status.message(),
            code: status.code() as i32,
        };
        assert_eq!(
            go_json(&body),
            r#"{"error":"etcdserver: key is not provided","message":"etcdserver: key is not provided","code":3}"#
        );
        let empty = ErrorBody {
            error: "",
            message: "",
            code: 12,
        };
        assert_eq!(go_json(&empty), r#"{"code":12}"#);
        let unavailable = Status::new(Code::Unavailable, "etcdserver: no leader");
        assert_eq!(
            stream_error_chunk(&unavailable),
            r#"{"error":{"grpc_code":14,"http_code":503,"message":"etcdserver: no leader","http_status":"Service Unavailable"}}"#
        );
    }

    #[test]
    fn codes_map_to_grpc_gateways_http_statuses() {
        assert_eq!(http_status(Code::InvalidArgument), StatusCode::BAD_REQUEST);
        assert_eq!(
            http_status(Code::FailedPrecondition),
            StatusCode::PRECONDITION_FAILED
        );
        assert_eq!(
            http_status(Code::Unimplemented),
            StatusCode::NOT_IMPLEMENTED
        );
        assert_eq!(
            http_status(Code::ResourceExhausted),
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(http_status(Code::Cancelled), StatusCode::REQUEST_TIMEOUT);
    }

    #[test]
    fn metadata_headers_are_passed_on_without_their_prefix() {
        let mut headers = HeaderMap::new();
        headers.insert("grpc-metadata-hasleader", HeaderValue::from_static("true"));
        headers.insert("authorization", HeaderValue::from_static("token"));
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        let req = request(&headers, ());
        assert_eq!(req.metadata().get("hasleader").unwrap(), "true");
        assert_eq!(req.metadata().get("authorization").unwrap(), "token");
        assert!(req.metadata().get("content-type").is_none());
    }
}
