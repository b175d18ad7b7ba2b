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

/// A `grpc-message` header's text: gRPC percent-encodes what is not printable ASCII, and tonic
/// also spaces and a few more.
fn percent_decoded(value: &[u8]) -> String {
    let hex = |b: u8| char::from(b).to_digit(16);
    let mut out = Vec::with_capacity(value.len());
    let mut i = 0;
    while i < value.len() {
        if value[i] == b'%'
            && let (Some(hi), Some(lo)) = (
                value.get(i + 1).copied().and_then(hex),
                value.get(i + 2).copied().and_then(hex),
            )
        {
            out.push(u8::try_from(hi * 16 + lo).unwrap_or(b'?'));
            i += 3;
            continue;
        }
        out.push(value[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

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
    let headers = response.headers_mut();
    let is_out_of_range = headers
        .get("grpc-status")
        .is_some_and(|v| tonic::Code::from_bytes(v.as_bytes()) == tonic::Code::OutOfRange);
    if !is_out_of_range {
        return response;
    }
    let len = headers
        .get("grpc-message")
        .map(|v| percent_decoded(v.as_bytes()))
        .and_then(|message| tonic_too_large_len(&message));
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
    fn a_percent_encoded_message_is_read_back() {
        assert_eq!(
            percent_decoded(b"Error,%20decoded%20message length: found 7 bytes%"),
            "Error, decoded message length: found 7 bytes%"
        );
    }

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
