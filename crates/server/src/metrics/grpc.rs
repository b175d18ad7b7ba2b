//! gRPC calls counted as grpc-go's Prometheus interceptors and etcd's count them: a middleware
//! on the gRPC routes counts each call of a method etcd registers as started and, with its
//! status, as handled; counts the messages each way by reading gRPC's length-prefixed framing
//! in the bodies as they pass (and their bytes, as etcd's codec counts them); and, with
//! `--metrics=extensive`, times each call to its end.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::Metrics;

/// Every gRPC code, as grpc-go's interceptors pre-register them.
const CODES: [tonic::Code; 17] = [
    tonic::Code::Ok,
    tonic::Code::Cancelled,
    tonic::Code::Unknown,
    tonic::Code::InvalidArgument,
    tonic::Code::DeadlineExceeded,
    tonic::Code::NotFound,
    tonic::Code::AlreadyExists,
    tonic::Code::PermissionDenied,
    tonic::Code::ResourceExhausted,
    tonic::Code::FailedPrecondition,
    tonic::Code::Aborted,
    tonic::Code::OutOfRange,
    tonic::Code::Unimplemented,
    tonic::Code::Internal,
    tonic::Code::Unavailable,
    tonic::Code::DataLoss,
    tonic::Code::Unauthenticated,
];

/// Prometheus's default buckets, which grpc-go's handling histogram uses.
const HANDLING_BUCKETS_SECS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The KV and lease calls etcd times in `etcd_server_request_duration_seconds`, by its names for
/// them.
const TIMED_REQUESTS: [(&str, &str); 7] = [
    ("Range", "Range"),
    ("Put", "Put"),
    ("DeleteRange", "DeleteRange"),
    ("Txn", "Txn"),
    ("Compact", "Compaction"),
    ("LeaseGrant", "LeaseGrant"),
    ("LeaseRevoke", "LeaseRevoke"),
];

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClientRequestLabels {
    r#type: &'static str,
    client_api_version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    r#type: &'static str,
    success: &'static str,
}

/// The gRPC metrics.
pub(super) struct Grpc {
    started: Family<MethodLabels, Counter>,
    handled: Family<HandledLabels, Counter>,
    msg_received: Family<MethodLabels, Counter>,
    msg_sent: Family<MethodLabels, Counter>,
    /// `--metrics=extensive` only.
    handling: Option<HistogramFamily<MethodLabels>>,
    received_bytes: Counter,
    sent_bytes: Counter,
    client_requests: Family<ClientRequestLabels, Counter>,
    request_duration: HistogramFamily<RequestLabels>,
    /// A unary call slower than this is logged (`--warning-unary-request-duration`).
    pub(super) slow_request: std::time::Duration,
}

impl Grpc {
    pub(super) fn register(registry: &mut Registry, extensive: bool) -> Grpc {
        let grpc = Grpc {
            started: Family::default(),
            handled: Family::default(),
            msg_received: Family::default(),
            msg_sent: Family::default(),
            handling: extensive.then(|| {
                HistogramFamily::new_with_constructor(|| {
                    Histogram::new(HANDLING_BUCKETS_SECS.iter().copied())
                })
            }),
            received_bytes: Counter::default(),
            sent_bytes: Counter::default(),
            client_requests: Family::default(),
            request_duration: HistogramFamily::new_with_constructor(|| {
                Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                    0.001, 2.0, 14,
                ))
            }),
            slow_request: std::time::Duration::from_millis(300),
        };
        registry.register(
            "grpc_server_started",
            "gRPC calls started on this member, by method",
            grpc.started.clone(),
        );
        registry.register(
            "grpc_server_handled",
            "gRPC calls this member finished, by method and status code",
            grpc.handled.clone(),
        );
        registry.register(
            "grpc_server_msg_received",
            "gRPC messages this member received, by method",
            grpc.msg_received.clone(),
        );
        registry.register(
            "grpc_server_msg_sent",
            "gRPC messages this member sent, by method",
            grpc.msg_sent.clone(),
        );
        if let Some(handling) = &grpc.handling {
            registry.register(
                "grpc_server_handling_seconds",
                "Seconds from a gRPC call's start to its end, by method (--metrics=extensive)",
                handling.clone(),
            );
        }
        registry.register(
            "etcd_network_client_grpc_received_bytes",
            "Bytes of gRPC messages this member received from clients",
            grpc.received_bytes.clone(),
        );
        registry.register(
            "etcd_network_client_grpc_sent_bytes",
            "Bytes of gRPC messages this member sent to clients",
            grpc.sent_bytes.clone(),
        );
        registry.register(
            "etcd_server_client_requests",
            "gRPC calls by kind (unary or stream) and by the API version the client names",
            grpc.client_requests.clone(),
        );
        registry.register(
            "etcd_server_request_duration_seconds",
            "Seconds a KV or lease call took, from its arrival to its answer, by etcd's request \
             type and whether it succeeded",
            grpc.request_duration.clone(),
        );
        // Every method's series exist from the start, at 0, as grpc-go pre-registers them.
        for (service, methods) in SERVICES {
            for method in methods {
                let Some(method) = GrpcMethod::of(&format!("/{service}/{method}")) else {
                    continue;
                };
                let labels = method.labels();
                drop(grpc.started.get_or_create(&labels));
                drop(grpc.msg_received.get_or_create(&labels));
                drop(grpc.msg_sent.get_or_create(&labels));
                for code in CODES {
                    drop(grpc.handled.get_or_create(&method.handled_labels(code)));
                }
            }
        }
        grpc
    }

    fn handled(&self, method: &GrpcMethod, code: tonic::Code, began: Instant) {
        self.handled
            .get_or_create(&method.handled_labels(code))
            .inc();
        let took = began.elapsed().as_secs_f64();
        if let Some(handling) = &self.handling {
            handling.get_or_create(&method.labels()).observe(took);
        }
        let kv_or_lease =
            method.service == "etcdserverpb.KV" || method.service == "etcdserverpb.Lease";
        if kv_or_lease
            && let Some((_, kind)) = TIMED_REQUESTS.iter().find(|(m, _)| *m == method.method)
        {
            let success = if code == tonic::Code::Ok {
                "true"
            } else {
                "false"
            };
            let labels = RequestLabels {
                r#type: kind,
                success,
            };
            self.request_duration.get_or_create(&labels).observe(took);
        }
    }

    /// The counters of `method`'s messages and bytes one way, looked up once per body.
    fn counters(&self, method: &GrpcMethod, direction: Direction) -> (Counter, Counter) {
        let (family, bytes) = match direction {
            Direction::Received => (&self.msg_received, &self.received_bytes),
            Direction::Sent => (&self.msg_sent, &self.sent_bytes),
        };
        (
            family.get_or_create(&method.labels()).clone(),
            bytes.clone(),
        )
    }
}

/// The counters of the messages a bidi stream receives, for its service to count them as it
/// reads them (the middleware does not wrap such a stream's body).
#[derive(Clone, Debug)]
pub(crate) struct Received {
    messages: Counter,
    bytes: Counter,
}

impl Received {
    pub(crate) fn one(&self, bytes: usize) {
        self.messages.inc();
        self.bytes.inc_by(bytes as u64);
    }
}

impl Metrics {
    /// [`Received`] for a bidi stream of `service`/`method` (counting nothing for a method etcd
    /// does not register).
    pub(crate) fn received_on(&self, service: &str, method: &str) -> Received {
        let (messages, bytes) = match GrpcMethod::of(&format!("/{service}/{method}")) {
            Some(m) => self.grpc.counters(&m, Direction::Received),
            None => (Counter::default(), Counter::default()),
        };
        Received { messages, bytes }
    }
}

/// The API version a client names in its `client-api-version` metadata, as a label: a short
/// version string, else `unknown`, so that no client can grow the label sets without bound.
fn client_api_version(headers: &HeaderMap) -> String {
    headers
        .get("client-api-version")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 16)
        .filter(|v| v.bytes().all(|b| b.is_ascii_digit() || b == b'.'))
        .unwrap_or("unknown")
        .to_owned()
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct MethodLabels {
    grpc_method: &'static str,
    grpc_service: &'static str,
    grpc_type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandledLabels {
    grpc_code: &'static str,
    grpc_method: &'static str,
    grpc_service: &'static str,
    grpc_type: &'static str,
}

/// A method this member serves (or answers Unimplemented for, as etcd registers it), with the
/// kind grpc-go's Prometheus labels give it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct GrpcMethod {
    service: &'static str,
    method: &'static str,
    kind: &'static str,
}

const UNARY: &str = "unary";
const SERVER_STREAM: &str = "server_stream";
const BIDI_STREAM: &str = "bidi_stream";

/// The gRPC services etcd registers and their methods; a method not named in the streaming
/// list is unary. Only these are counted, so a client cannot grow the label sets.
const SERVICES: [(&str, &[&str]); 9] = [
    (
        "etcdserverpb.KV",
        &[
            "Range",
            "RangeStream",
            "Put",
            "DeleteRange",
            "Txn",
            "Compact",
        ],
    ),
    ("etcdserverpb.Watch", &["Watch"]),
    (
        "etcdserverpb.Lease",
        &[
            "LeaseGrant",
            "LeaseRevoke",
            "LeaseKeepAlive",
            "LeaseTimeToLive",
            "LeaseLeases",
        ],
    ),
    (
        "etcdserverpb.Cluster",
        &[
            "MemberAdd",
            "MemberRemove",
            "MemberUpdate",
            "MemberList",
            "MemberPromote",
        ],
    ),
    (
        "etcdserverpb.Maintenance",
        &[
            "Alarm",
            "Status",
            "Defragment",
            "Hash",
            "HashKV",
            "Snapshot",
            "MoveLeader",
            "Downgrade",
        ],
    ),
    (
        "etcdserverpb.Auth",
        &[
            "AuthEnable",
            "AuthDisable",
            "AuthStatus",
            "Authenticate",
            "UserAdd",
            "UserGet",
            "UserList",
            "UserDelete",
            "UserChangePassword",
            "UserGrantRole",
            "UserRevokeRole",
            "RoleAdd",
            "RoleGet",
            "RoleList",
            "RoleDelete",
            "RoleGrantPermission",
            "RoleRevokePermission",
        ],
    ),
    ("v3lockpb.Lock", &["Lock", "Unlock"]),
    (
        "v3electionpb.Election",
        &["Campaign", "Proclaim", "Leader", "Observe", "Resign"],
    ),
    ("grpc.health.v1.Health", &["Check", "Watch"]),
];

/// (service, method, kind) of every streaming method in [`SERVICES`].
const STREAMING: [(&str, &str, &str); 6] = [
    ("etcdserverpb.KV", "RangeStream", SERVER_STREAM),
    ("etcdserverpb.Watch", "Watch", BIDI_STREAM),
    ("etcdserverpb.Lease", "LeaseKeepAlive", BIDI_STREAM),
    ("etcdserverpb.Maintenance", "Snapshot", SERVER_STREAM),
    ("v3electionpb.Election", "Observe", SERVER_STREAM),
    ("grpc.health.v1.Health", "Watch", SERVER_STREAM),
];

impl GrpcMethod {
    /// The method a request path (`/service/method`) names, if it is one of [`SERVICES`].
    fn of(path: &str) -> Option<GrpcMethod> {
        let (service, method) = path.strip_prefix('/')?.split_once('/')?;
        let (service, methods) = SERVICES.iter().find(|(s, _)| *s == service)?;
        let method = methods.iter().find(|m| **m == method)?;
        let kind = STREAMING
            .iter()
            .find(|(s, m, _)| s == service && m == method)
            .map_or(UNARY, |(_, _, kind)| kind);
        Some(GrpcMethod {
            service,
            method,
            kind,
        })
    }
}

impl GrpcMethod {
    fn labels(&self) -> MethodLabels {
        MethodLabels {
            grpc_method: self.method,
            grpc_service: self.service,
            grpc_type: self.kind,
        }
    }

    fn handled_labels(&self, code: tonic::Code) -> HandledLabels {
        HandledLabels {
            grpc_code: leasehold_api::go_code_name(code),
            grpc_method: self.method,
            grpc_service: self.service,
            grpc_type: self.kind,
        }
    }
}

/// The status a `grpc-status` header or trailer carries, if there is one.
fn grpc_status(headers: &HeaderMap) -> Option<tonic::Code> {
    headers
        .get("grpc-status")
        .map(|v| tonic::Code::from_bytes(v.as_bytes()))
}

/// Middleware on the gRPC routes: counts a call as started when it arrives, its messages each
/// way as they pass, and the call as handled with its status when its response ends (at once for
/// a trailers-only error answer, otherwise at the trailers; a response dropped before its
/// trailers, as when the client goes away, counts as `Canceled`, as grpc-go counts a call whose
/// context was cancelled).
pub(crate) async fn count_grpc(
    State(metrics): State<Arc<Metrics>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(method) = GrpcMethod::of(request.uri().path()) else {
        return next.run(request).await;
    };
    let grpc = &metrics.grpc;
    grpc.started.get_or_create(&method.labels()).inc();
    let kind = if method.kind == UNARY {
        "unary"
    } else {
        "stream"
    };
    grpc.client_requests
        .get_or_create(&ClientRequestLabels {
            r#type: kind,
            client_api_version: client_api_version(request.headers()),
        })
        .inc();
    let began = Instant::now();
    // A bidi stream's requests are counted by its service as it reads them
    // ([`Metrics::received_on`]): wrapping a long stream's body costs every message a second
    // indirection (measured: 3-4 % of keepalive throughput).
    let request = if method.kind == BIDI_STREAM {
        request
    } else {
        request.map(|body| {
            Body::new(CountedBody {
                inner: body,
                frames: Frames::default(),
                counters: grpc.counters(&method, Direction::Received),
                call: None,
            })
        })
    };
    let response = next.run(request).await;
    if method.kind == UNARY {
        request_stats(&method, began.elapsed(), grpc.slow_request);
    }
    if let Some(code) = grpc_status(response.headers()) {
        grpc.handled(&method, code, began);
        return response;
    }
    let counters = grpc.counters(&method, Direction::Sent);
    response.map(|body| {
        Body::new(CountedBody {
            inner: body,
            frames: Frames::default(),
            counters,
            call: Some((metrics.clone(), method, began)),
        })
    })
}

/// etcd's `request stats` line for a unary call: a warning when it took longer than
/// `warn_after`, at debug level otherwise (etcd logs every call at debug).
fn request_stats(method: &GrpcMethod, spent: std::time::Duration, warn_after: std::time::Duration) {
    let response_type = format!("/{}/{}", method.service, method.method);
    let spent_text = format!("{spent:?}");
    if spent > warn_after {
        tracing::warn!(
            "time spent" = %spent_text,
            "response type" = %response_type,
            "request stats"
        );
    } else {
        tracing::debug!(
            "time spent" = %spent_text,
            "response type" = %response_type,
            "request stats"
        );
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    Received,
    Sent,
}

/// Messages that began in some body bytes, and their payload bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Framed {
    messages: u64,
    bytes: u64,
}

/// gRPC's framing read as it passes: each message is a flag byte and a 4-byte big-endian length,
/// then that many bytes, and may arrive split across any number of chunks.
#[derive(Debug, Default)]
struct Frames {
    prefix: [u8; 5],
    prefix_len: usize,
    /// Bytes of the current message not seen yet.
    remaining: u64,
}

impl Frames {
    fn feed(&mut self, mut data: &[u8]) -> Framed {
        let mut framed = Framed::default();
        while !data.is_empty() {
            if self.remaining > 0 {
                let n = usize::try_from(self.remaining)
                    .unwrap_or(usize::MAX)
                    .min(data.len());
                self.remaining -= n as u64;
                data = &data[n..];
                continue;
            }
            let n = (5 - self.prefix_len).min(data.len());
            self.prefix[self.prefix_len..self.prefix_len + n].copy_from_slice(&data[..n]);
            self.prefix_len += n;
            data = &data[n..];
            if self.prefix_len == 5 {
                let len = u32::from_be_bytes([
                    self.prefix[1],
                    self.prefix[2],
                    self.prefix[3],
                    self.prefix[4],
                ]);
                framed.messages += 1;
                framed.bytes += u64::from(len);
                self.remaining = u64::from(len);
                self.prefix_len = 0;
            }
        }
        framed
    }
}

/// A request or response body whose gRPC messages are counted as they pass; a response body
/// also counts its call as handled when its trailers pass (or when it ends or is dropped
/// without any).
struct CountedBody {
    inner: Body,
    frames: Frames,
    /// The messages and their bytes, this way.
    counters: (Counter, Counter),
    /// A response's call, and when it began, until it is counted as handled.
    call: Option<(Arc<Metrics>, GrpcMethod, Instant)>,
}

impl CountedBody {
    fn count_handled(&mut self, code: tonic::Code) {
        if let Some((metrics, method, began)) = self.call.take() {
            metrics.grpc.handled(&method, code, began);
        }
    }
}

impl http_body::Body for CountedBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let framed = self.frames.feed(data);
                    if framed.messages > 0 {
                        self.counters.0.inc_by(framed.messages);
                        self.counters.1.inc_by(framed.bytes);
                    }
                }
                if let Some(code) = frame.trailers_ref().and_then(grpc_status) {
                    self.count_handled(code);
                }
            }
            Poll::Ready(Some(Err(_))) => self.count_handled(tonic::Code::Unknown),
            // A gRPC response always ends with trailers; one that does not was cut short.
            Poll::Ready(None) => self.count_handled(tonic::Code::Unknown),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for CountedBody {
    fn drop(&mut self) {
        self.count_handled(tonic::Code::Cancelled);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_are_found_with_their_kind_and_nothing_else_is() {
        let check = |path: &str, expected: Option<(&str, &str, &str)>| {
            let found = GrpcMethod::of(path).map(|m| (m.service, m.method, m.kind));
            assert_eq!(found, expected, "{path}");
        };
        check(
            "/etcdserverpb.KV/Range",
            Some(("etcdserverpb.KV", "Range", UNARY)),
        );
        check(
            "/etcdserverpb.Lease/LeaseKeepAlive",
            Some(("etcdserverpb.Lease", "LeaseKeepAlive", BIDI_STREAM)),
        );
        check(
            "/etcdserverpb.Watch/Watch",
            Some(("etcdserverpb.Watch", "Watch", BIDI_STREAM)),
        );
        check(
            "/v3electionpb.Election/Observe",
            Some(("v3electionpb.Election", "Observe", SERVER_STREAM)),
        );
        check(
            "/grpc.health.v1.Health/Check",
            Some(("grpc.health.v1.Health", "Check", UNARY)),
        );
        check("/etcdserverpb.KV/Nope", None);
        check("/etcdserverpb.Nope/Range", None);
        check("/health", None);
        check("", None);
    }

    #[test]
    fn every_streaming_method_is_a_served_method() {
        for (service, method, _) in STREAMING {
            let found = GrpcMethod::of(&format!("/{service}/{method}")).unwrap();
            assert_ne!(found.kind, UNARY, "{service}/{method}");
        }
    }

    #[test]
    fn code_names_are_gos() {
        let name = leasehold_api::go_code_name;
        assert_eq!(name(tonic::Code::Cancelled), "Canceled");
        assert_eq!(name(tonic::Code::from_i32(14)), "Unavailable");
    }

    /// Messages of 3, 0 and 300 bytes, cut into chunks at every possible place.
    #[test]
    fn messages_are_counted_however_the_body_is_cut() {
        let mut body = Vec::new();
        for len in [3u32, 0, 300] {
            body.push(0);
            body.extend_from_slice(&len.to_be_bytes());
            body.extend(std::iter::repeat_n(7u8, len as usize));
        }
        for chunk in [1, 2, 4, 5, 6, 64, body.len()] {
            let mut frames = Frames::default();
            let mut total = Framed::default();
            for part in body.chunks(chunk) {
                let framed = frames.feed(part);
                total.messages += framed.messages;
                total.bytes += framed.bytes;
            }
            assert_eq!(
                total,
                Framed {
                    messages: 3,
                    bytes: 303
                },
                "chunks of {chunk}"
            );
        }
    }

    #[test]
    fn client_api_versions_are_bounded_labels() {
        let version = |v: &str| {
            let mut headers = HeaderMap::new();
            headers.insert("client-api-version", v.parse().unwrap());
            client_api_version(&headers)
        };
        assert_eq!(version("3.7"), "3.7");
        assert_eq!(version("x"), "unknown");
        assert_eq!(version(&"3".repeat(40)), "unknown");
        assert_eq!(client_api_version(&HeaderMap::new()), "unknown");
    }
}
