//! `AuthorityFix`: a connection adapter, in front of hyper, that repairs one HTTP/2 header a
//! client gets wrong. etcdctl 3.4 dials some commands (`endpoint status`, `endpoint hashkv`,
//! `defrag`, `move-leader`) with the endpoint string as gRPC target, so with
//! `--endpoints=http://host:port` it sends `:authority: http://host:port`. Go's server takes that;
//! h2 (under hyper and tonic) answers RST_STREAM PROTOCOL_ERROR, because a URL is not an
//! authority (`h2::server::Peer::convert_poll_message`, "malformed authority"), and offers no
//! option to relax it. This adapter rewrites such an `:authority` to the URL's authority part
//! before h2 reads it.
//!
//! ```text
//!  client bytes ─► preface? ─ no ──────────────────────────────────► hyper (HTTP/1.1), untouched
//!                     │ yes
//!                     ▼
//!                  frames ─ not HEADERS ───────────────────────────► hyper, in place (no copy)
//!                     │ HEADERS (+ CONTINUATION until END_HEADERS)
//!                     ▼
//!                  HPACK decode (tracks the client's dynamic table)
//!                     │ `:authority` is a URL, or an earlier block's was
//!                     ├─ yes ─► re-encode: literals without indexing ─► hyper
//!                     └─ no ──► the block's bytes as they came ──────► hyper
//!  server bytes ◄──────────────────────────────────────────────────── hyper (writes untouched)
//! ```
//!
//! Invariants: a connection that never carries a URL authority reaches hyper byte for byte as
//! the client sent it. Once one block is rewritten, every later block is re-encoded (see
//! [`Blocks`]). Every buffer is bounded ([`BLOCK_BYTES_MAX`], [`DECODED_BYTES_MAX`]); a header
//! block beyond the bounds is passed on as it came (h2 then refuses it itself) or, after a
//! rewrite, closes the connection.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

mod hpack;

/// The HTTP/2 client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const FRAME_HEADER_LEN: usize = 9;
const FRAME_TYPE_HEADERS: u8 = 0x1;
const FRAME_TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// Stream dependency (4 bytes) and weight (1 byte) of a HEADERS frame with PRIORITY.
const PRIORITY_LEN: usize = 5;

/// The largest frame payload this adapter writes: HTTP/2's default SETTINGS_MAX_FRAME_SIZE,
/// which hyper's server keeps (tonic sets no other), so h2 accepts every frame we make.
const FRAME_PAYLOAD_BYTES_MAX: usize = 16_384;
/// The dynamic table size h2's server allows the client's encoder (SETTINGS_HEADER_TABLE_SIZE,
/// HTTP/2's default; hyper and tonic do not change it). A larger table size update is refused
/// by h2 as well.
const HEADER_TABLE_BYTES_MAX: usize = 4_096;
/// Bound of one header block as framed (HEADERS and its CONTINUATIONs, frame headers included).
/// hyper lets a header list be 16 KiB, so a block this large is refused by h2 anyway; 64 KiB
/// keeps what one unauthenticated connection can pin small.
const BLOCK_BYTES_MAX: usize = 64 << 10;
/// Bound of the frames of one header block (h2 bounds CONTINUATION floods the same way).
const BLOCK_FRAMES_MAX: usize = 128;
/// Bound of one decoded header list (names and values, RFC 7541's 32 bytes per field
/// included): a small block can name large dynamic-table entries many times over.
const DECODED_BYTES_MAX: usize = 64 << 10;
/// A buffer that grew beyond this for a large header block is released once it is empty, so an
/// idle connection keeps little memory.
const BUFFER_RETAINED_BYTES_MAX: usize = 64 << 10;

/// An accepted client connection with the `:authority` repair on what it reads (module docs).
/// Writes, and the connection info tonic asks for, are the inner connection's.
pub struct AuthorityFix<IO> {
    inner: IO,
    rewriter: Rewriter,
}

impl<IO> AuthorityFix<IO> {
    pub fn new(inner: IO) -> Self {
        AuthorityFix {
            inner,
            rewriter: Rewriter::new(),
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for AuthorityFix<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if this.rewriter.emit(buf) {
                return Poll::Ready(Ok(()));
            }
            if this.rewriter.passes_everything() {
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            }
            // Read straight into the caller's buffer; the bytes that may pass as they are stay
            // there (a DATA payload is never copied), the rest is taken out to be held.
            let before = buf.filled().len();
            ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
            let read = &buf.filled()[before..];
            if read.is_empty() {
                if this.rewriter.finish() {
                    continue;
                }
                return Poll::Ready(Ok(()));
            }
            let kept = this.rewriter.accept(read)?;
            buf.set_filled(before + kept);
            if kept > 0 {
                return Poll::Ready(Ok(()));
            }
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<IO: Connected> Connected for AuthorityFix<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// The synchronous core of [`AuthorityFix`]: takes the bytes read, says which pass as they
/// are, and holds and rewrites the rest.
struct Rewriter {
    framing: Framing,
    blocks: Blocks,
    /// Bytes read and not yet passed on: a partial preface or frame header, or an incomplete
    /// header block, and whatever was read after it. `held[held_at..]` is still to do.
    held: Vec<u8>,
    held_at: usize,
    /// Bytes ready for the reader, ahead of anything still to be read: `out[out_at..]`.
    out: Vec<u8>,
    out_at: usize,
}

impl Rewriter {
    fn new() -> Self {
        Rewriter {
            framing: Framing::Preface { matched: 0 },
            blocks: Blocks::new(),
            held: Vec::new(),
            held_at: 0,
            out: Vec::new(),
            out_at: 0,
        }
    }

    /// True when nothing is held or waiting and everything from now on passes as it is.
    fn passes_everything(&self) -> bool {
        matches!(self.framing, Framing::Raw) && self.held.is_empty() && self.out.is_empty()
    }

    /// Copies waiting output into `buf`; false if there was none.
    fn emit(&mut self, buf: &mut ReadBuf<'_>) -> bool {
        let waiting = &self.out[self.out_at..];
        if waiting.is_empty() {
            return false;
        }
        let n = waiting.len().min(buf.remaining());
        buf.put_slice(&waiting[..n]);
        self.out_at += n;
        if self.out_at == self.out.len() {
            self.out.clear();
            self.out_at = 0;
            release_if_large(&mut self.out);
        }
        true
    }

    /// Takes bytes just read. Returns how many leading bytes pass as they are, in place; the
    /// rest is held (and processed as far as it can be), to be [`emit`](Self::emit)ted after them.
    fn accept(&mut self, read: &[u8]) -> io::Result<usize> {
        let kept = if self.held.is_empty() {
            self.framing.pass(read)
        } else {
            0
        };
        if kept < read.len() {
            self.held.extend_from_slice(&read[kept..]);
            self.process()?;
        }
        Ok(kept)
    }

    /// At end of input: what is held goes on as it is (h2 sees the truncation). Returns true
    /// if there is output to emit.
    fn finish(&mut self) -> bool {
        self.out.extend_from_slice(&self.held[self.held_at..]);
        self.held.clear();
        self.held_at = 0;
        self.out_at < self.out.len()
    }

    /// Moves held bytes to the output as far as they can go: passed as they are, or as a
    /// rewritten header block once the whole block is here.
    fn process(&mut self) -> io::Result<()> {
        loop {
            let rest = &self.held[self.held_at..];
            let passed = self.framing.pass(rest);
            self.out.extend_from_slice(&rest[..passed]);
            self.held_at += passed;
            let rest = &self.held[self.held_at..];
            if rest.is_empty() {
                self.held.clear();
                self.held_at = 0;
                release_if_large(&mut self.held);
                return Ok(());
            }
            if !matches!(self.framing, Framing::Frames { .. }) {
                // A partial preface: wait for more.
                return Ok(());
            }
            // Framing stopped at a frame header: partial, or a HEADERS frame.
            match block_len(rest) {
                BlockLen::Incomplete => return Ok(()),
                BlockLen::Refused(why) => {
                    if self.blocks.rewriting {
                        return Err(closed(why));
                    }
                    tracing::debug!("header block passed on unread: {why}");
                    self.framing = Framing::Raw;
                }
                BlockLen::Complete(len) => {
                    let block = &rest[..len];
                    if let Err(why) = self.blocks.take(block, &mut self.out) {
                        if self.blocks.rewriting {
                            return Err(closed(why));
                        }
                        // The client's table can no longer be followed: from here on nothing
                        // is read, and h2 judges the block itself.
                        tracing::debug!("header block passed on unread: {why}");
                        self.out.extend_from_slice(block);
                        self.framing = Framing::Raw;
                    }
                    self.held_at += len;
                }
            }
        }
    }
}

fn closed(why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("HTTP/2 connection closed after an :authority rewrite: {why}"),
    )
}

fn release_if_large(buf: &mut Vec<u8>) {
    if buf.capacity() > BUFFER_RETAINED_BYTES_MAX {
        *buf = Vec::new();
    }
}

/// Where the reader is in the connection's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// At the start: `matched` bytes of the HTTP/2 preface seen so far.
    Preface { matched: usize },
    /// HTTP/2 frames; `payload_left` bytes of a frame that passes as it is are still to come.
    Frames { payload_left: usize },
    /// Not HTTP/2 (HTTP/1.1), or a connection given up on: everything passes.
    Raw,
}

impl Framing {
    /// Advances over the leading bytes of `bytes` that pass as they are, and returns how many.
    /// Stops at a partial preface or frame header, or at a HEADERS frame's header.
    fn pass(&mut self, bytes: &[u8]) -> usize {
        let mut at = 0;
        loop {
            match *self {
                Framing::Raw => return bytes.len(),
                Framing::Preface { matched } => {
                    let n = (PREFACE.len() - matched).min(bytes.len() - at);
                    if bytes[at..at + n] != PREFACE[matched..matched + n] {
                        *self = Framing::Raw;
                        return bytes.len();
                    }
                    at += n;
                    if matched + n < PREFACE.len() {
                        *self = Framing::Preface {
                            matched: matched + n,
                        };
                        return at;
                    }
                    *self = Framing::Frames { payload_left: 0 };
                }
                Framing::Frames { payload_left } => {
                    let n = payload_left.min(bytes.len() - at);
                    at += n;
                    if n < payload_left {
                        *self = Framing::Frames {
                            payload_left: payload_left - n,
                        };
                        return at;
                    }
                    let Some(header) = FrameHeader::parse(&bytes[at..]) else {
                        *self = Framing::Frames { payload_left: 0 };
                        return at;
                    };
                    if header.kind == FRAME_TYPE_HEADERS {
                        *self = Framing::Frames { payload_left: 0 };
                        return at;
                    }
                    // Any other frame passes, a stray CONTINUATION too: h2 refuses that itself.
                    at += FRAME_HEADER_LEN;
                    *self = Framing::Frames {
                        payload_left: header.len,
                    };
                }
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct FrameHeader {
    len: usize,
    kind: u8,
    flags: u8,
    /// The stream identifier's four bytes as sent (reserved bit included).
    stream: [u8; 4],
}

impl FrameHeader {
    fn parse(bytes: &[u8]) -> Option<FrameHeader> {
        let b: &[u8; FRAME_HEADER_LEN] = bytes.get(..FRAME_HEADER_LEN)?.try_into().ok()?;
        Some(FrameHeader {
            len: usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]),
            kind: b[3],
            flags: b[4],
            stream: [b[5], b[6], b[7], b[8]],
        })
    }

    fn stream_id(&self) -> u32 {
        u32::from_be_bytes(self.stream) & 0x7fff_ffff
    }

    fn write(len: usize, kind: u8, flags: u8, stream: [u8; 4], out: &mut Vec<u8>) {
        assert!(len <= FRAME_PAYLOAD_BYTES_MAX);
        out.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
        out.extend_from_slice(&[kind, flags]);
        out.extend_from_slice(&stream);
    }
}

enum BlockLen {
    /// More bytes are needed to see the whole block.
    Incomplete,
    /// The block, as framed, is `len` bytes long.
    Complete(usize),
    /// The block is not followed: too large or malformed.
    Refused(&'static str),
}

/// The framed length of the header block that starts at `bytes` (with a HEADERS frame header,
/// or a partial frame header).
fn block_len(bytes: &[u8]) -> BlockLen {
    let mut at = 0;
    let mut stream = None;
    for _ in 0..BLOCK_FRAMES_MAX {
        let Some(header) = FrameHeader::parse(&bytes[at..]) else {
            return BlockLen::Incomplete;
        };
        match stream {
            None => debug_assert_eq!(header.kind, FRAME_TYPE_HEADERS),
            Some(id) => {
                if header.kind != FRAME_TYPE_CONTINUATION || header.stream_id() != id {
                    return BlockLen::Refused("a header block interrupted by another frame");
                }
            }
        }
        stream = Some(header.stream_id());
        let end = at + FRAME_HEADER_LEN + header.len;
        if end > BLOCK_BYTES_MAX {
            return BlockLen::Refused("a header block above the size bound");
        }
        if bytes.len() < end {
            return BlockLen::Incomplete;
        }
        at = end;
        if header.flags & FLAG_END_HEADERS != 0 {
            return BlockLen::Complete(at);
        }
    }
    BlockLen::Refused("a header block in too many frames")
}

/// The header blocks of one connection, decoded to follow the client's HPACK state.
///
/// Why everything is re-encoded after the first rewrite: HPACK state is shared. The client's
/// encoder and h2's decoder each keep a dynamic table, and they agree only because h2 decodes
/// exactly the blocks the client encoded. A rewritten block is not the client's block, so from
/// then on h2's table would not be the client's: a later block's "index 62" would name
/// different fields on each side. So we keep the client's table in our own decoder (every
/// block is decoded, rewritten or not), and write every block after the first rewrite with
/// literals that are never indexed and never refer to the dynamic table; h2's table then stays
/// as it was and is never consulted. For the same reason the client's dynamic table size updates
/// are not passed on: they size the client's table, which is ours to follow, not h2's.
struct Blocks {
    decoder: hpack::Decoder,
    /// True once a block has been rewritten on this connection.
    rewriting: bool,
    /// Scratch, kept across blocks: the block's HPACK fragment, its fields, our encoding.
    fragment: Vec<u8>,
    fields: hpack::Fields,
    encoded: Vec<u8>,
}

impl Blocks {
    fn new() -> Self {
        Blocks {
            decoder: hpack::Decoder::new(HEADER_TABLE_BYTES_MAX),
            rewriting: false,
            fragment: Vec::new(),
            fields: hpack::Fields::new(DECODED_BYTES_MAX),
            encoded: Vec::new(),
        }
    }

    /// Decodes one whole header block (`block`: its frames as they came) and writes to `out`
    /// either those frames or the rewritten block. On an error nothing is written.
    fn take(&mut self, block: &[u8], out: &mut Vec<u8>) -> Result<(), &'static str> {
        let first = FrameHeader::parse(block).expect("a block starts with a whole frame header");
        let priority = self.gather_fragment(block)?;

        self.decoder
            .decode(&self.fragment, &mut self.fields)
            .map_err(hpack::Error::as_str)?;
        if self.fields.over_bound {
            return if self.rewriting {
                Err("a header list above the size bound")
            } else {
                // Followed (the table is up to date) but too large to hold: h2 judges it.
                out.extend_from_slice(block);
                Ok(())
            };
        }

        if let Some(i) = self.fields.find(b":authority") {
            let value = self
                .fields
                .value(i, &self.fragment)
                .map_err(hpack::Error::as_str)?;
            if let Some(authority) = authority_of_url(value) {
                if !self.rewriting {
                    tracing::debug!(
                        stream = first.stream_id(),
                        "`:authority` was a URL; rewriting this connection's header blocks"
                    );
                }
                self.fields.set_value(i, authority.as_str().as_bytes());
                self.rewriting = true;
            }
        }
        if !self.rewriting {
            out.extend_from_slice(block);
            return Ok(());
        }

        self.fields
            .resolve(&self.fragment)
            .map_err(hpack::Error::as_str)?;
        self.encoded.clear();
        release_if_large(&mut self.encoded);
        if let Some(priority) = priority {
            self.encoded.extend_from_slice(&priority);
        }
        for (name, value, sensitive) in self.fields.iter() {
            encode_literal(name, value, sensitive, &mut self.encoded);
        }
        let mut chunks = self.encoded.chunks(FRAME_PAYLOAD_BYTES_MAX).peekable();
        let mut kind = FRAME_TYPE_HEADERS;
        // Padding is dropped; END_STREAM and PRIORITY belong to the HEADERS frame.
        let mut flags = first.flags & (FLAG_END_STREAM | FLAG_PRIORITY);
        loop {
            let chunk = chunks.next().unwrap_or(&[]);
            let last = chunks.peek().is_none();
            let end = if last { FLAG_END_HEADERS } else { 0 };
            FrameHeader::write(chunk.len(), kind, flags | end, first.stream, out);
            out.extend_from_slice(chunk);
            if last {
                return Ok(());
            }
            kind = FRAME_TYPE_CONTINUATION;
            flags = 0;
        }
    }

    /// Puts the block's HPACK fragment (padding and priority removed) into `self.fragment`,
    /// and returns the HEADERS frame's priority fields, if it has them.
    fn gather_fragment(
        &mut self,
        block: &[u8],
    ) -> Result<Option<[u8; PRIORITY_LEN]>, &'static str> {
        self.fragment.clear();
        release_if_large(&mut self.fragment);
        let mut priority = None;
        let mut at = 0;
        while at < block.len() {
            let header = FrameHeader::parse(&block[at..]).expect("block_len checked the frames");
            let mut payload = &block[at + FRAME_HEADER_LEN..at + FRAME_HEADER_LEN + header.len];
            at += FRAME_HEADER_LEN + header.len;
            if header.kind == FRAME_TYPE_HEADERS {
                let mut pad_len = 0;
                if header.flags & FLAG_PADDED != 0 {
                    let (&n, rest) = payload.split_first().ok_or("PADDED without a length")?;
                    pad_len = usize::from(n);
                    payload = rest;
                }
                if header.flags & FLAG_PRIORITY != 0 {
                    let (fields, rest) = payload
                        .split_first_chunk::<PRIORITY_LEN>()
                        .ok_or("PRIORITY without its fields")?;
                    priority = Some(*fields);
                    payload = rest;
                }
                let fragment_len = payload
                    .len()
                    .checked_sub(pad_len)
                    .ok_or("padding longer than the frame")?;
                payload = &payload[..fragment_len];
            }
            self.fragment.extend_from_slice(payload);
        }
        Ok(priority)
    }
}

/// The authority of `value` if `value` is not an authority itself (which h2 would accept) but
/// a URL with a scheme and an authority, such as `http://127.0.0.1:2379` or
/// `https://host:2379/`.
fn authority_of_url(value: &[u8]) -> Option<http::uri::Authority> {
    if http::uri::Authority::try_from(value).is_ok() {
        return None;
    }
    let uri = http::Uri::try_from(value).ok()?;
    uri.scheme()?;
    uri.authority().cloned()
}

/// RFC 7541 §6.2.2 (or §6.2.3 if the client sent the field "never indexed"): a literal with a
/// literal name, neither entered in nor taken from the dynamic table; no Huffman coding.
fn encode_literal(name: &[u8], value: &[u8], sensitive: bool, out: &mut Vec<u8>) {
    out.push(if sensitive { 0x10 } else { 0x00 });
    for string in [name, value] {
        hpack::encode_integer(string.len(), 7, 0x00, out);
        out.extend_from_slice(string);
    }
}

#[cfg(test)]
mod tests;
