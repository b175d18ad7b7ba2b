//! Reading a gateway request body as JSON messages, and writing answers as etcd's gateway
//! (grpc-gateway 1.x with gogoproto's `jsonpb`) writes them.
//!
//! A body holds one JSON value per request message, written back to back or separated by
//! white space (Go's `json.Decoder`): a unary call reads the first value (an empty body is the
//! default message, anything after the first value is ignored), a client stream reads values
//! until the body ends or one does not decode. Every value is bounded by the body limit, so a
//! body cannot make the member buffer more than that.

use axum::body::{Body, BodyDataStream};
use serde::de::DeserializeOwned;
use tokio_stream::StreamExt as _;

/// Why a body gave no message.
#[derive(Debug)]
pub(super) enum BodyError {
    /// Not JSON, or not the message's JSON: serde's words.
    Json(String),
    /// A value (or a unary body) longer than the limit, in bytes.
    TooLarge { len: usize, max: usize },
    /// The connection failed while the body was read.
    Read(String),
}

/// The JSON values of one request body, decoded one at a time as they arrive.
pub(super) struct JsonMessages {
    body: BodyDataStream,
    /// Bytes read and not yet decoded.
    buf: Vec<u8>,
    /// The body has ended: `buf` is all there is.
    ended: bool,
    /// The longest value in bytes. `buf` holds at most one value cut short (every complete one
    /// is decoded before more is read) plus one chunk, so this bounds it too.
    value_bytes_max: usize,
    /// Where the value at the front of `buf` ends, found a chunk at a time.
    scan: ValueEnd,
    /// Times a value was handed to the parser (each parse reads the whole value).
    parses: usize,
}

impl JsonMessages {
    pub(super) fn new(body: Body, value_bytes_max: usize) -> JsonMessages {
        JsonMessages {
            body: body.into_data_stream(),
            buf: Vec::new(),
            ended: false,
            value_bytes_max,
            scan: ValueEnd::default(),
            parses: 0,
        }
    }

    /// The next message, `None` when the body ends between values.
    ///
    /// A value is parsed once it is whole (or the body has ended), never again for every chunk
    /// of it: a value sent a few bytes at a time costs one scan of each byte and one parse, not
    /// a parse of everything so far per chunk.
    pub(super) async fn next<T: DeserializeOwned>(&mut self) -> Result<Option<T>, BodyError> {
        loop {
            let start = self
                .buf
                .iter()
                .position(|b| !b.is_ascii_whitespace())
                .unwrap_or(self.buf.len());
            self.buf.drain(..start);
            self.scan.pos = self.scan.pos.saturating_sub(start);
            if !self.buf.is_empty() && (self.ended || self.scan.whole(&self.buf)) {
                self.parses += 1;
                let mut values = serde_json::Deserializer::from_slice(&self.buf).into_iter::<T>();
                match values.next() {
                    Some(Ok(value)) => {
                        let used = values.byte_offset();
                        if used > self.value_bytes_max {
                            return Err(BodyError::TooLarge {
                                len: used,
                                max: self.value_bytes_max,
                            });
                        }
                        self.buf.drain(..used);
                        self.scan = ValueEnd::default();
                        return Ok(Some(value));
                    }
                    // Cut short: wait for the rest of it, unless there is no more.
                    Some(Err(e)) if e.is_eof() && !self.ended => {}
                    Some(Err(e)) => return Err(BodyError::Json(e.to_string())),
                    None => {}
                }
            }
            // A value cut short, already longer than a value may be.
            if !self.ended && self.buf.len() > self.value_bytes_max {
                return Err(BodyError::TooLarge {
                    len: self.buf.len(),
                    max: self.value_bytes_max,
                });
            }
            if self.ended {
                return Ok(None);
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.buf.extend_from_slice(&chunk),
                Some(Err(e)) => return Err(BodyError::Read(e.to_string())),
                None => self.ended = true,
            }
        }
    }
}

/// Finds where the JSON value at the front of a buffer ends, resuming where it stopped: only
/// brackets and strings are followed, which is all it takes to see an object, an array or a
/// string close. Whether the value is valid JSON is the parser's to say.
#[derive(Debug, Default)]
struct ValueEnd {
    /// Bytes of the buffer already scanned.
    pos: usize,
    /// Open brackets.
    depth: usize,
    in_string: bool,
    escaped: bool,
}

impl ValueEnd {
    /// True once `buf` (starting at the value, no white space before it) holds the whole
    /// value. A value that is not an object, array or string (at most a short scalar, never a
    /// request message) is left to the parser at once.
    fn whole(&mut self, buf: &[u8]) -> bool {
        if !matches!(buf.first(), Some(b'{' | b'[' | b'"')) {
            return true;
        }
        while let Some(&b) = buf.get(self.pos) {
            self.pos += 1;
            if self.in_string {
                match b {
                    _ if self.escaped => self.escaped = false,
                    b'\\' => self.escaped = true,
                    b'"' => {
                        self.in_string = false;
                        if self.depth == 0 {
                            return true;
                        }
                    }
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        return true;
                    }
                }
                _ => {}
            }
        }
        false
    }
}

/// A unary call's request: the body's first JSON value, or the default message for an empty
/// body, as grpc-gateway decodes it (it ignores what follows the first value).
pub(super) async fn unary_request<T: DeserializeOwned + Default>(
    body: Body,
    bytes_max: usize,
) -> Result<T, BodyError> {
    let mut messages = JsonMessages::new(body, bytes_max);
    Ok(messages.next().await?.unwrap_or_default())
}

/// `value` as JSON the way Go writes it: `<`, `>` and `&` (HTML-safe) and U+2028/U+2029 escaped.
/// Those characters can only occur inside JSON strings, so escaping them in the whole text is
/// the same as escaping them in every string.
pub(super) fn go_json<T: serde::Serialize + ?Sized>(value: &T) -> String {
    let text = serde_json::to_string(value).unwrap_or_else(|e| {
        // The generated impls only fail on maps with non-string keys, which etcd's API has not.
        unreachable!("pbjson serialization cannot fail: {e}")
    });
    if !text.contains(['<', '>', '&', '\u{2028}', '\u{2029}']) {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Bytes;
    use leasehold_api::etcdserverpb as pb;

    async fn all(chunks: &[&str], max: usize) -> Result<Vec<pb::WatchRequest>, BodyError> {
        let owned: Vec<Result<Bytes, std::io::Error>> = chunks
            .iter()
            .map(|c| Ok(Bytes::copy_from_slice(c.as_bytes())))
            .collect();
        let body = Body::from_stream(futures::stream::iter(owned));
        let mut messages = JsonMessages::new(body, max);
        let mut out = Vec::new();
        while let Some(m) = messages.next().await? {
            out.push(m);
        }
        Ok(out)
    }

    fn create(key: &[u8]) -> pb::WatchRequest {
        pb::WatchRequest {
            request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
                pb::WatchCreateRequest {
                    key: key.to_vec(),
                    ..Default::default()
                },
            )),
        }
    }

    #[tokio::test]
    async fn values_back_to_back_spaced_and_split_across_chunks() {
        let one = r#"{"create_request":{"key":"YQ=="}}"#;
        let two = r#"{"create_request":{"key":"Yg=="}}"#;
        let joined = format!("{one}{two}");
        assert_eq!(
            all(&[&joined], 1024).await.unwrap(),
            [create(b"a"), create(b"b")]
        );
        let spaced = format!(" {one}\n\t{two} \n");
        assert_eq!(
            all(&[&spaced], 1024).await.unwrap(),
            [create(b"a"), create(b"b")]
        );
        let (head, tail) = joined.split_at(7);
        assert_eq!(
            all(&[head, tail], 1024).await.unwrap(),
            [create(b"a"), create(b"b")]
        );
        assert_eq!(all(&["", " ", ""], 1024).await.unwrap(), []);
    }

    #[tokio::test]
    async fn bad_cut_short_and_oversized_bodies_are_errors() {
        assert!(matches!(
            all(&["{bad"], 1024).await,
            Err(BodyError::Json(_))
        ));
        assert!(matches!(
            all(&[r#"{"create_request":"#], 1024).await,
            Err(BodyError::Json(_))
        ));
        let big = format!(r#"{{"create_request":{{"key":"{}"}}}}"#, "QUFB".repeat(100));
        assert!(matches!(
            all(&[&big], 64).await,
            Err(BodyError::TooLarge { max: 64, .. })
        ));
        // Unknown fields are ignored, as etcd's gateway ignores them.
        assert_eq!(
            all(&[r#"{"bogus":1}"#], 1024).await.unwrap(),
            [pb::WatchRequest::default()]
        );
    }

    #[tokio::test]
    async fn a_value_sent_a_byte_at_a_time_is_parsed_once() {
        let value = format!(
            r#"{{"create_request":{{"key":"{}","range_end":"Yg==","filters":["NOPUT"]}}}} "#,
            "QUFB\\\"".repeat(2_000)
        );
        let chunks: Vec<Result<axum::body::Bytes, std::io::Error>> = value
            .bytes()
            .map(|b| Ok(axum::body::Bytes::copy_from_slice(&[b])))
            .collect();
        let mut messages =
            JsonMessages::new(Body::from_stream(futures::stream::iter(chunks)), 1 << 20);
        // The key is not valid base64 (it holds quotes), so the one parse fails: what matters
        // here is that there is one.
        assert!(matches!(
            messages.next::<pb::WatchRequest>().await,
            Err(BodyError::Json(_))
        ));
        assert_eq!(messages.parses, 1);

        let good = r#"{"create_request":{"key":"YQ==","range_end":"e30iXFs="}}"#;
        let chunks: Vec<Result<axum::body::Bytes, std::io::Error>> = good
            .bytes()
            .map(|b| Ok(axum::body::Bytes::copy_from_slice(&[b])))
            .collect();
        let mut messages =
            JsonMessages::new(Body::from_stream(futures::stream::iter(chunks)), 1024);
        let got = messages.next::<pb::WatchRequest>().await.unwrap().unwrap();
        assert_eq!(messages.parses, 1);
        let Some(pb::watch_request::RequestUnion::CreateRequest(create)) = got.request_union else {
            panic!("not a create request: {got:?}");
        };
        assert_eq!(create.range_end, b"{}\"\\[");
    }

    #[test]
    fn the_end_of_a_value_is_found_across_strings_escapes_and_nesting() {
        let mut scan = ValueEnd::default();
        let text = br#"{"a":"}\"]","b":[{"c":"\\"}]}"#;
        for end in 1..text.len() {
            assert!(!scan.whole(&text[..end]), "not whole at {end}");
        }
        assert!(scan.whole(text));
        assert!(ValueEnd::default().whole(br#""x\"y""#));
        assert!(!ValueEnd::default().whole(br#""x\""#));
        assert!(ValueEnd::default().whole(b"12"), "scalars go to the parser");
    }

    #[test]
    fn go_escapes_html_characters_in_strings() {
        let member = pb::Member {
            name: "a<b>&c\u{2028}".into(),
            ..Default::default()
        };
        assert_eq!(
            go_json(&member),
            r#"{"name":"a\u003cb\u003e\u0026c\u2028"}"#
        );
    }
}
