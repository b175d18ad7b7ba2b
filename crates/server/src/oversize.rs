//! A request too large even to buffer gets grpc-go's answer, as etcd's clients see it:
//! `RESOURCE_EXHAUSTED` and `grpc: received message larger than max (<length> vs. <limit>)`.
//!
//! Requests up to twice etcd's gRPC limit reach our own size check (`validate.rs`), which answers
//! that way itself. Above that tonic's decoder refuses them from the length prefix, before reading
//! the body, with `OUT_OF_RANGE` and tonic's own words; this middleware on the gRPC routes puts
//! grpc-go's code and wording (with etcd's limit, not tonic's) on such a trailers-only answer.

use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;

/// What tonic's decoder says about a message over its limit, up to the length it found.
const TONIC_TOO_LARGE: &str = "Error, decoded message length too large: found ";

/// The length a tonic "too large" message names, if `message` is one.
fn tonic_too_large_len(message: &str) -> Option<u64> {
    let rest = message.strip_prefix(TONIC_TOO_LARGE)?;
    let digits = rest.split(' ').next()?;
    digits.parse().ok()
}

/// grpc-go's answer to a request of `len` bytes above `max`, as (grpc-status, grpc-message).
fn grpc_go_answer(len: u64, max: usize) -> (tonic::Code, String) {
    (
        tonic::Code::ResourceExhausted,
        format!("grpc: received message larger than max ({len} vs. {max})"),
    )
}

/// Middleware on the gRPC routes: `max` is etcd's gRPC message limit for this member.
pub(crate) async fn etcd_answer(
    State(max): State<usize>,
    request: Request,
    next: Next,
) -> Response {
    let mut response = next.run(request).await;
    // A trailers-only answer carries its status in the headers; tonic reads it back, decoding
    // the message's percent-encoding.
    let headers = response.headers_mut();
    let len = tonic::Status::from_header_map(headers)
        .filter(|status| status.code() == tonic::Code::OutOfRange)
        .and_then(|status| tonic_too_large_len(status.message()));
    if let Some(len) = len {
        let (code, message) = grpc_go_answer(len, max);
        // grpc-go's message is printable ASCII, so no percent-encoding is needed.
        if let Ok(message) = HeaderValue::from_str(&message) {
            headers.insert("grpc-status", HeaderValue::from(code as i32));
            headers.insert("grpc-message", message);
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tonics_refusal_is_read_and_worded_as_grpc_go_words_it() {
        let tonic = "Error, decoded message length too large: found 41943053 bytes, the limit is: \
                     4194304 bytes";
        assert_eq!(tonic_too_large_len(tonic), Some(41_943_053));
        assert_eq!(
            grpc_go_answer(41_943_053, 2_097_152),
            (
                tonic::Code::ResourceExhausted,
                "grpc: received message larger than max (41943053 vs. 2097152)".to_string()
            )
        );
        assert_eq!(
            tonic_too_large_len("etcdserver: request is too large"),
            None
        );
        assert_eq!(
            tonic_too_large_len("Error, decoded message length too large: found x"),
            None
        );
    }
}
