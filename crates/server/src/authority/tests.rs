//! Byte-level tests of [`AuthorityFix`]: connections are built frame by frame here, read
//! through the adapter in every split we can afford, and the output read back as h2 would
//! (one HPACK decoder for the whole connection).

use std::collections::VecDeque;

use futures::executor::block_on;
use loona_hpack::{Decoder, Encoder};
use tokio::io::AsyncReadExt as _;

use super::*;

const SETTINGS: u8 = 0x4;
const DATA: u8 = 0x0;
const WINDOW_UPDATE: u8 = 0x8;

type Field = (Vec<u8>, Vec<u8>);

/// A connection that yields the given chunks, one per read, then end of input.
struct Script {
    chunks: VecDeque<Vec<u8>>,
}

impl AsyncRead for Script {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(mut chunk) = this.chunks.pop_front() {
            let n = chunk.len().min(buf.remaining());
            buf.put_slice(&chunk[..n]);
            if n < chunk.len() {
                this.chunks.push_front(chunk.split_off(n));
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// Reads `chunks` through the adapter with reads of `read_len` bytes, to the end.
fn read_through(chunks: Vec<Vec<u8>>, read_len: usize) -> io::Result<Vec<u8>> {
    let mut adapter = AuthorityFix::new(Script {
        chunks: chunks.into_iter().filter(|c| !c.is_empty()).collect(),
    });
    let mut out = Vec::new();
    let mut buf = vec![0; read_len];
    loop {
        let n = block_on(adapter.read(&mut buf))?;
        if n == 0 {
            return Ok(out);
        }
        out.extend_from_slice(&buf[..n]);
    }
}

/// What the adapter makes of `input`, checked to be the same however the input is split into
/// reads: whole; in two at every byte boundary (for inputs up to 4 KiB); one byte at a time;
/// and in a few odd chunk sizes, read through small and large buffers.
fn through(input: &[u8]) -> io::Result<Vec<u8>> {
    let whole = read_through(vec![input.to_vec()], 1 << 20);
    let same = |got: io::Result<Vec<u8>>, how: &str| match (&whole, got) {
        (Ok(want), Ok(got)) => assert!(*want == got, "{how}: output differs from one read"),
        (Err(want), Err(got)) => assert_eq!(want.kind(), got.kind(), "{how}"),
        (want, got) => panic!("{how}: {got:?}, but one read gives {want:?}"),
    };
    if input.len() <= 4096 {
        for at in 1..input.len() {
            let (a, b) = input.split_at(at);
            same(
                read_through(vec![a.to_vec(), b.to_vec()], 1 << 20),
                &format!("split at {at}"),
            );
        }
    }
    for chunk_len in [1, 2, 3, 7, 100, 4096, 20_000] {
        let chunks = input
            .chunks(chunk_len)
            .map(<[u8]>::to_vec)
            .collect::<Vec<_>>();
        for read_len in [1, 5, 8192] {
            same(
                read_through(chunks.clone(), read_len),
                &format!("chunks of {chunk_len}, reads of {read_len}"),
            );
        }
    }
    whole
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

fn fields(list: &[(&str, &str)]) -> Vec<Field> {
    list.iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
}

fn request(authority: &str, path: &str) -> Vec<Field> {
    fields(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("user-agent", "grpc-go/1.26.0"),
        ("te", "trailers"),
    ])
}

fn with_authority(list: &[Field], authority: &str) -> Vec<Field> {
    list.iter()
        .map(|(n, v)| {
            if n == b":authority" {
                (n.clone(), authority.as_bytes().to_vec())
            } else {
                (n.clone(), v.clone())
            }
        })
        .collect()
}

/// The client side: an HPACK encoder that indexes every field, as clients do, so later blocks
/// refer to the dynamic table.
struct Client {
    encoder: Encoder<'static>,
    bytes: Vec<u8>,
}

impl Client {
    fn new() -> Self {
        Client {
            encoder: Encoder::new(),
            bytes: PREFACE.to_vec(),
        }
    }

    fn encode(&mut self, list: &[Field]) -> Vec<u8> {
        self.encoder
            .encode(list.iter().map(|(n, v)| (&n[..], &v[..])))
    }

    /// One HEADERS frame with END_HEADERS.
    fn headers(&mut self, stream: u32, end_stream: bool, list: &[Field]) -> &mut Self {
        let fragment = self.encode(list);
        let flags = FLAG_END_HEADERS | if end_stream { FLAG_END_STREAM } else { 0 };
        self.raw(frame(FRAME_TYPE_HEADERS, flags, stream, &fragment))
    }

    fn raw(&mut self, bytes: Vec<u8>) -> &mut Self {
        self.bytes.extend_from_slice(&bytes);
        self
    }

    fn settings_and_window(&mut self) -> &mut Self {
        self.raw(frame(SETTINGS, 0, 0, &[0, 4, 0, 0, 0xff, 0xff]))
            .raw(frame(WINDOW_UPDATE, 0, 0, &[0, 0x0f, 0, 1]))
    }
}

/// A frame or header block as h2 sees it.
#[derive(Debug, PartialEq)]
enum Seen {
    Headers {
        stream: u32,
        end_stream: bool,
        priority: Option<[u8; PRIORITY_LEN]>,
        fields: Vec<Field>,
    },
    Frame {
        kind: u8,
        flags: u8,
        stream: u32,
        payload: Vec<u8>,
    },
}

/// Reads a connection as h2 does: the preface, then frames; header blocks reassembled from
/// HEADERS and CONTINUATION and decoded with one decoder for the whole connection. Frames
/// larger than h2 accepts fail the test.
fn seen_by_server(bytes: &[u8]) -> Vec<Seen> {
    let mut rest = bytes.strip_prefix(PREFACE).expect("the preface");
    let mut decoder = Decoder::new();
    let mut seen = Vec::new();
    let mut block: Option<(FrameHeader, Option<[u8; PRIORITY_LEN]>, Vec<u8>)> = None;
    while !rest.is_empty() {
        let header = FrameHeader::parse(rest).expect("a whole frame header");
        assert!(
            header.len <= FRAME_PAYLOAD_BYTES_MAX,
            "frame of {}",
            header.len
        );
        let mut payload = &rest[FRAME_HEADER_LEN..FRAME_HEADER_LEN + header.len];
        rest = &rest[FRAME_HEADER_LEN + header.len..];
        match (header.kind, block.as_mut()) {
            (FRAME_TYPE_HEADERS, None) => {
                let mut pad = 0;
                if header.flags & FLAG_PADDED != 0 {
                    pad = usize::from(payload[0]);
                    payload = &payload[1..];
                }
                let mut priority = None;
                if header.flags & FLAG_PRIORITY != 0 {
                    priority = Some(payload[..PRIORITY_LEN].try_into().unwrap());
                    payload = &payload[PRIORITY_LEN..];
                }
                let fragment = payload[..payload.len() - pad].to_vec();
                block = Some((header, priority, fragment));
            }
            (FRAME_TYPE_CONTINUATION, Some((first, _, fragment))) => {
                assert_eq!(header.stream_id(), first.stream_id());
                fragment.extend_from_slice(payload);
            }
            (kind, None) => seen.push(Seen::Frame {
                kind,
                flags: header.flags,
                stream: header.stream_id(),
                payload: payload.to_vec(),
            }),
            (kind, Some(_)) => panic!("frame type {kind} inside a header block"),
        }
        let in_block = matches!(header.kind, FRAME_TYPE_HEADERS | FRAME_TYPE_CONTINUATION);
        if in_block && header.flags & FLAG_END_HEADERS != 0 {
            let (first, priority, fragment) = block.take().expect("a header block");
            seen.push(Seen::Headers {
                stream: first.stream_id(),
                end_stream: first.flags & FLAG_END_STREAM != 0,
                priority,
                fields: decoder
                    .decode(&fragment)
                    .expect("h2 could decode the block"),
            });
        }
    }
    assert!(block.is_none(), "a header block left unfinished");
    seen
}

fn headers(stream: u32, end_stream: bool, fields: Vec<Field>) -> Seen {
    Seen::Headers {
        stream,
        end_stream,
        priority: None,
        fields,
    }
}

fn data(stream: u32, flags: u8, payload: &[u8]) -> Seen {
    Seen::Frame {
        kind: DATA,
        flags,
        stream,
        payload: payload.to_vec(),
    }
}

#[test]
fn a_connection_without_a_url_authority_passes_byte_for_byte() {
    let req = request("127.0.0.1:2379", "/etcdserverpb.KV/Put");
    let big = vec![7; 40_000];
    let mut client = Client::new();
    client
        .settings_and_window()
        .headers(1, false, &req)
        .raw(frame(DATA, FLAG_END_STREAM, 1, &[0, 0, 0, 0, 3, 1, 2, 3]))
        .headers(3, false, &req)
        .raw(frame(DATA, 0, 3, &big[..16_000]))
        .raw(frame(DATA, FLAG_END_STREAM, 3, &big[16_000..32_000]));
    let input = client.bytes.clone();
    assert_eq!(through(&input).unwrap(), input);
}

#[test]
fn http1_passes_byte_for_byte() {
    for input in [
        &b"POST /v3/kv/range HTTP/1.1\r\nHost: http://127.0.0.1:2379\r\n\r\n{}"[..],
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        // Diverges from the HTTP/2 preface only late.
        b"PRI * HTTP/1.1\r\n\r\n\x00\x00\x05\x01\x04\x00\x00\x00\x01hello",
        // Ends inside the preface.
        b"PRI * HTTP/2.0\r\n",
        b"",
    ] {
        assert_eq!(
            through(input).unwrap(),
            input,
            "{:?}",
            String::from_utf8_lossy(input)
        );
    }
}

#[test]
fn a_url_authority_becomes_its_authority() {
    for (url, authority) in [
        ("http://127.0.0.1:2379", "127.0.0.1:2379"),
        ("https://etcd.example:2379/", "etcd.example:2379"),
        ("http://[::1]:2379", "[::1]:2379"),
    ] {
        let req = request(url, "/etcdserverpb.Maintenance/Status");
        let mut client = Client::new();
        client
            .settings_and_window()
            .headers(1, false, &req)
            .raw(frame(DATA, FLAG_END_STREAM, 1, &[0, 0, 0, 0, 0]));
        let out = through(&client.bytes).unwrap();
        assert_eq!(
            seen_by_server(&out),
            [
                Seen::Frame {
                    kind: SETTINGS,
                    flags: 0,
                    stream: 0,
                    payload: vec![0, 4, 0, 0, 0xff, 0xff]
                },
                Seen::Frame {
                    kind: WINDOW_UPDATE,
                    flags: 0,
                    stream: 0,
                    payload: vec![0, 0x0f, 0, 1]
                },
                headers(1, false, with_authority(&req, authority)),
                data(1, FLAG_END_STREAM, &[0, 0, 0, 0, 0]),
            ],
            "{url}"
        );
    }
}

#[test]
fn values_that_are_no_url_are_left_alone() {
    for value in ["127.0.0.1:2379", "localhost", "[::1]:2379"] {
        assert_eq!(authority_of_url(value.as_bytes()), None, "{value}");
    }
    // Neither an authority nor a URL: h2 refuses it, we do not guess.
    for value in ["/var/run/etcd.sock", "a b", "http:///nohost"] {
        assert_eq!(authority_of_url(value.as_bytes()), None, "{value}");
    }
}

#[test]
fn blocks_after_a_rewrite_decode_as_the_client_meant() {
    let url = "http://127.0.0.1:2379";
    let status = request(url, "/etcdserverpb.Maintenance/Status");
    let hashkv = request(url, "/etcdserverpb.Maintenance/HashKV");
    let plain = request("127.0.0.1:2379", "/etcdserverpb.KV/Range");
    let mut with_token = hashkv.clone();
    with_token.push((b"token".to_vec(), b"secret".to_vec()));
    let mut client = Client::new();
    client
        .settings_and_window()
        .headers(1, false, &status)
        // All indexed: every field refers to the client's dynamic table.
        .headers(3, false, &status)
        .headers(5, false, &hashkv)
        .headers(7, true, &with_token)
        // No URL here, but a reference to the client's table (`te`, `token`): it must be
        // re-encoded too, or h2 would look the reference up in a table it never filled.
        .headers(9, false, &plain)
        .headers(11, true, &with_token);
    // A block that resizes the client's table to nothing, then adds a field again.
    let mut resized = vec![0x20];
    let mut encoder = Encoder::new();
    resized.extend(encoder.encode(status.iter().map(|(n, v)| (&n[..], &v[..]))));
    client.raw(frame(FRAME_TYPE_HEADERS, FLAG_END_HEADERS, 13, &resized));

    let out = through(&client.bytes).unwrap();
    let fixed = |list: &[Field]| with_authority(list, "127.0.0.1:2379");
    assert_eq!(
        seen_by_server(&out)[2..],
        [
            headers(1, false, fixed(&status)),
            headers(3, false, fixed(&status)),
            headers(5, false, fixed(&hashkv)),
            headers(7, true, fixed(&with_token)),
            headers(9, false, plain.clone()),
            headers(11, true, fixed(&with_token)),
            headers(13, false, fixed(&status)),
        ]
    );
    // Every rewritten block stands alone: it decodes with an empty dynamic table.
    let mut rest = &out[PREFACE.len()..];
    while let Some(header) = FrameHeader::parse(rest) {
        let payload = &rest[FRAME_HEADER_LEN..FRAME_HEADER_LEN + header.len];
        if header.kind == FRAME_TYPE_HEADERS {
            Decoder::new()
                .decode(payload)
                .expect("no dynamic table reference");
        }
        rest = &rest[FRAME_HEADER_LEN + header.len..];
    }
}

/// A header block in three frames, the first PADDED and with PRIORITY.
fn split_block(client: &mut Client, stream: u32, list: &[Field]) {
    let fragment = client.encode(list);
    let third = fragment.len() / 3;
    let mut first = vec![4]; // pad length
    first.extend_from_slice(&[0x80, 0, 0, 1, 15]); // exclusive, on stream 1, weight 16
    first.extend_from_slice(&fragment[..third]);
    first.extend_from_slice(&[0; 4]);
    let flags = FLAG_PADDED | FLAG_PRIORITY | FLAG_END_STREAM;
    client
        .raw(frame(FRAME_TYPE_HEADERS, flags, stream, &first))
        .raw(frame(
            FRAME_TYPE_CONTINUATION,
            0,
            stream,
            &fragment[third..2 * third],
        ))
        .raw(frame(FRAME_TYPE_CONTINUATION, 0, stream, &[]))
        .raw(frame(
            FRAME_TYPE_CONTINUATION,
            FLAG_END_HEADERS,
            stream,
            &fragment[2 * third..],
        ));
}

#[test]
fn continuation_padding_and_priority() {
    // Without a URL: as it came.
    let mut client = Client::new();
    split_block(
        &mut client,
        3,
        &request("127.0.0.1:2379", "/etcdserverpb.KV/Range"),
    );
    client.raw(frame(DATA, 0, 3, b"after"));
    assert_eq!(through(&client.bytes).unwrap(), client.bytes);

    // With one: the priority is kept, the padding dropped, the block whole.
    let req = request("http://127.0.0.1:2379", "/etcdserverpb.KV/Range");
    let mut client = Client::new();
    split_block(&mut client, 3, &req);
    client.raw(frame(DATA, 0, 3, b"after"));
    assert_eq!(
        seen_by_server(&through(&client.bytes).unwrap()),
        [
            Seen::Headers {
                stream: 3,
                end_stream: true,
                priority: Some([0x80, 0, 0, 1, 15]),
                fields: with_authority(&req, "127.0.0.1:2379"),
            },
            data(3, 0, b"after"),
        ]
    );
}

#[test]
fn a_large_rewritten_block_is_split_into_continuations() {
    let mut req = request("http://127.0.0.1:2379", "/etcdserverpb.KV/Put");
    req.push((b"x-big".to_vec(), vec![b'x'; 40_000]));
    let mut client = Client::new();
    let fragment = client.encode(&req);
    let mut chunks = fragment.chunks(FRAME_PAYLOAD_BYTES_MAX).peekable();
    let mut kind = FRAME_TYPE_HEADERS;
    while let Some(chunk) = chunks.next() {
        let flags = if chunks.peek().is_none() {
            FLAG_END_HEADERS
        } else {
            0
        };
        client.raw(frame(kind, flags, 1, chunk));
        kind = FRAME_TYPE_CONTINUATION;
    }
    let out = through(&client.bytes).unwrap();
    // seen_by_server checks every frame's size.
    assert_eq!(
        seen_by_server(&out),
        [headers(1, false, with_authority(&req, "127.0.0.1:2379"))]
    );
    let mut frames = Vec::new();
    let mut rest = &out[PREFACE.len()..];
    while let Some(header) = FrameHeader::parse(rest) {
        frames.push((header.kind, header.flags & FLAG_END_HEADERS != 0));
        rest = &rest[FRAME_HEADER_LEN + header.len..];
    }
    assert_eq!(
        frames,
        [
            (FRAME_TYPE_HEADERS, false),
            (FRAME_TYPE_CONTINUATION, false),
            (FRAME_TYPE_CONTINUATION, true)
        ]
    );
}

/// A HEADERS frame header announcing more than the block bound, with a little of its payload.
fn oversized_headers(stream: u32) -> Vec<u8> {
    let len = BLOCK_BYTES_MAX as u32 + 1;
    let mut bytes = len.to_be_bytes()[1..].to_vec();
    bytes.extend_from_slice(&[FRAME_TYPE_HEADERS, FLAG_END_HEADERS]);
    bytes.extend_from_slice(&stream.to_be_bytes());
    bytes.extend_from_slice(&[0x82; 100]);
    bytes
}

#[test]
fn blocks_not_followed_pass_as_they_came_before_any_rewrite() {
    let req = request("127.0.0.1:2379", "/etcdserverpb.KV/Put");
    let url = request("http://127.0.0.1:2379", "/etcdserverpb.KV/Put");
    let mut cases = Vec::new();
    // Above the size bound.
    let mut client = Client::new();
    client.headers(1, false, &req).raw(oversized_headers(3));
    cases.push(client.bytes.clone());
    // Interrupted by another frame.
    let mut client = Client::new();
    let fragment = client.encode(&req);
    client
        .raw(frame(FRAME_TYPE_HEADERS, 0, 1, &fragment))
        .raw(frame(DATA, 0, 1, b"data"))
        .headers(3, false, &url);
    cases.push(client.bytes.clone());
    // Not HPACK (index 70 with an empty dynamic table), then a URL we no longer look at.
    let mut client = Client::new();
    client
        .raw(frame(FRAME_TYPE_HEADERS, FLAG_END_HEADERS, 1, &[0x80 | 70]))
        .headers(3, false, &url);
    cases.push(client.bytes.clone());
    for input in cases {
        assert_eq!(through(&input).unwrap(), input);
    }
}

#[test]
fn after_a_rewrite_a_block_not_followed_closes_the_connection() {
    let url = request("http://127.0.0.1:2379", "/etcdserverpb.KV/Put");
    let mut client = Client::new();
    client.headers(1, false, &url).raw(oversized_headers(3));
    let err = through(&client.bytes).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");

    let mut client = Client::new();
    client.headers(1, false, &url).raw(frame(
        FRAME_TYPE_HEADERS,
        FLAG_END_HEADERS,
        3,
        &[0x80 | 90],
    ));
    let err = through(&client.bytes).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
}

#[test]
fn data_payloads_pass_in_place() {
    let mut rewriter = Rewriter::new();
    // A DATA frame of 30,000 bytes, its header and first bytes in the first read.
    let mut input = PREFACE.to_vec();
    input.extend_from_slice(&30_000u32.to_be_bytes()[1..]);
    input.extend_from_slice(&[DATA, 0, 0, 0, 0, 1]);
    input.extend_from_slice(&[1; 1000]);
    assert_eq!(rewriter.accept(&input).unwrap(), input.len());
    assert_eq!(rewriter.accept(&[2; 29_000]).unwrap(), 29_000);
    assert!(rewriter.held.is_empty() && rewriter.out.is_empty());
    // Half a frame header is held until the rest comes.
    assert_eq!(rewriter.accept(&frame(DATA, 0, 1, b"x")[..4]).unwrap(), 0);
    assert_eq!(rewriter.held.len(), 4);
}

#[test]
fn arbitrary_header_blocks_never_panic() {
    // xorshift: a fixed sequence, so a failure reproduces.
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let url = request("http://127.0.0.1:2379", "/etcdserverpb.KV/Put");
    for case in 0..2_000 {
        let mut client = Client::new();
        if case % 2 == 0 {
            client.headers(1, false, &url);
        }
        let len = (next() % 64) as usize;
        let fragment: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        let flags = (next() as u8) & (FLAG_PADDED | FLAG_PRIORITY | FLAG_END_HEADERS);
        client.raw(frame(FRAME_TYPE_HEADERS, flags, 3, &fragment));
        if flags & FLAG_END_HEADERS == 0 {
            client.raw(frame(FRAME_TYPE_CONTINUATION, FLAG_END_HEADERS, 3, &[0x82]));
        }
        // Either passed on or refused: only a panic fails.
        let _ = read_through(vec![client.bytes.clone()], 1 << 20);
        let _ = read_through(client.bytes.chunks(3).map(<[u8]>::to_vec).collect(), 7);
    }
}
