//! HPACK decoding (RFC 7541), as much as [`super::AuthorityFix`] needs: the client's dynamic
//! table followed through every header block, and each block's fields, where a literal value is
//! decoded only when it is asked for. Most never are: h2's client sends `:path` as a fresh
//! literal on every request, and on a connection that needs no rewrite only `:authority` is
//! read. Table entries are always decoded (their size, which drives eviction, is the decoded
//! size).
//!
//! Written here rather than taken from a crate. Of the HPACK crates (hpack 0.3, unmaintained
//! since 2016; its fork loona-hpack 0.4, last released 2024-11; httlib-hpack 0.1, 2021),
//! loona-hpack was wired in first and cost about a fifth of the server's put throughput: its
//! Huffman decoder builds hash maps for every string it decodes, and h2's client sends one such
//! string per request. Only decoding is here (the adapter writes plain literals), and
//! loona-hpack stays as a test dependency to check this decoder against.

use std::collections::VecDeque;

/// Why a header block could not be followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Error {
    Integer,
    String,
    Huffman,
    Index,
    SizeUpdate,
}

impl Error {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Error::Integer => "HPACK: malformed integer",
            Error::String => "HPACK: string longer than the block",
            Error::Huffman => "HPACK: malformed Huffman string",
            Error::Index => "HPACK: index beyond the tables",
            Error::SizeUpdate => "HPACK: table size update out of place or too large",
        }
    }
}

/// RFC 7541 §4.1: an entry's size is its name and value plus 32 bytes.
const ENTRY_OVERHEAD_BYTES: usize = 32;

/// A dynamic table entry: name and value.
type Entry = (Box<[u8]>, Box<[u8]>);

/// The decoding side of one connection's HPACK context.
pub(super) struct Decoder {
    /// The dynamic table, newest entry first (index 62).
    table: VecDeque<Entry>,
    table_bytes: usize,
    /// The table's maximum size, as the client's last size update set it.
    table_bytes_max: usize,
    /// The most the client may set it to (the server's SETTINGS_HEADER_TABLE_SIZE).
    table_bytes_allowed: usize,
}

impl Decoder {
    pub(super) fn new(table_bytes_allowed: usize) -> Self {
        Decoder {
            table: VecDeque::new(),
            table_bytes: 0,
            table_bytes_max: table_bytes_allowed,
            table_bytes_allowed,
        }
    }

    /// Decodes one whole header block into `fields` (cleared first), following the table.
    /// Literal values not entered in the table stay undecoded spans of `block` until
    /// [`Fields::value`] or [`Fields::resolve`] is called with the same `block`.
    pub(super) fn decode(&mut self, block: &[u8], fields: &mut Fields) -> Result<(), Error> {
        fields.clear();
        let mut at = 0;
        let mut fields_seen = false;
        while let Some(&first) = block.get(at) {
            let rest = &block[at..];
            if first & 0x80 != 0 {
                // §6.1 indexed field.
                let (index, n) = integer(rest, 7)?;
                let (name, value) = self.get(index)?;
                fields.push_decoded(name, value, false);
                at += n;
            } else if first & 0x40 != 0 {
                // §6.2.1 literal with incremental indexing: decoded now, for the table.
                let (index, mut n) = integer(rest, 6)?;
                let name = if index == 0 {
                    let (name, used) = string(&rest[n..])?;
                    n += used;
                    name.decode(&rest[n - used..])?
                } else {
                    self.get(index)?.0.to_vec()
                };
                let (value, used) = string(&rest[n..])?;
                let value = value.decode(&rest[n..])?;
                n += used;
                fields.push_decoded(&name, &value, false);
                self.insert(name, value);
                at += n;
            } else if first & 0x20 != 0 {
                // §6.3 dynamic table size update: only before the block's first field (§4.2).
                let (size, n) = integer(rest, 5)?;
                if fields_seen || size > self.table_bytes_allowed {
                    return Err(Error::SizeUpdate);
                }
                self.table_bytes_max = size;
                self.evict(0);
                at += n;
                continue;
            } else {
                // §6.2.2 without indexing, §6.2.3 never indexed: the value may stay on the wire.
                let sensitive = first & 0x10 != 0;
                let (index, mut n) = integer(rest, 4)?;
                let name = if index == 0 {
                    let (name, used) = string(&rest[n..])?;
                    n += used;
                    Some(name.decode(&rest[n - used..])?)
                } else {
                    None
                };
                let name = match &name {
                    Some(name) => name.as_slice(),
                    None => self.get(index)?.0,
                };
                let (value, used) = string(&rest[n..])?;
                fields.push_wire(name, value.at(at + n), sensitive);
                at += n + used;
            }
            fields_seen = true;
        }
        Ok(())
    }

    /// Index `index` of the static table followed by the dynamic one (§2.3.3).
    fn get(&self, index: usize) -> Result<(&[u8], &[u8]), Error> {
        match index {
            0 => Err(Error::Index),
            1..=STATIC_LEN => {
                let (name, value) = STATIC_TABLE[index - 1];
                Ok((name.as_bytes(), value.as_bytes()))
            }
            _ => self
                .table
                .get(index - STATIC_LEN - 1)
                .map(|(name, value)| (&name[..], &value[..]))
                .ok_or(Error::Index),
        }
    }

    /// §4.4: evicts until the entry fits, then adds it; an entry larger than the whole table
    /// empties it and is not added.
    fn insert(&mut self, name: Vec<u8>, value: Vec<u8>) {
        let size = name.len() + value.len() + ENTRY_OVERHEAD_BYTES;
        self.evict(size);
        if size <= self.table_bytes_max {
            self.table
                .push_front((name.into_boxed_slice(), value.into_boxed_slice()));
            self.table_bytes += size;
        }
        debug_assert!(self.table_bytes <= self.table_bytes_max);
    }

    /// Evicts the oldest entries until `room` more bytes fit, or the table is empty.
    fn evict(&mut self, room: usize) {
        while self.table_bytes + room > self.table_bytes_max {
            let Some((name, value)) = self.table.pop_back() else {
                break;
            };
            self.table_bytes -= name.len() + value.len() + ENTRY_OVERHEAD_BYTES;
        }
        debug_assert!(!self.table.is_empty() || self.table_bytes == 0);
    }
}

/// A block's fields. Names, table values and decoded values live in `bytes`; a literal value
/// not yet decoded is a span of the block it came in.
#[derive(Default)]
pub(super) struct Fields {
    bytes: Vec<u8>,
    list: Vec<Field>,
    /// The list's size as RFC 7541 counts it, undecoded values at their encoded length.
    size_bytes: usize,
    /// True if the list outgrew the bound; fields past it were not kept.
    pub(super) over_bound: bool,
    size_bytes_max: usize,
}

#[derive(Clone, Copy)]
struct Field {
    name: Span,
    value: Value,
    /// Sent "never indexed" (§6.2.3): kept so when the block is re-encoded.
    sensitive: bool,
}

#[derive(Clone, Copy)]
struct Span {
    start: usize,
    len: usize,
}

impl Span {
    fn of(self, bytes: &[u8]) -> &[u8] {
        &bytes[self.start..self.start + self.len]
    }
}

#[derive(Clone, Copy)]
enum Value {
    /// In `Fields::bytes`.
    Decoded(Span),
    /// In the block, as sent.
    Wire(Str),
}

impl Fields {
    pub(super) fn new(size_bytes_max: usize) -> Self {
        Fields {
            size_bytes_max,
            ..Fields::default()
        }
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.list.clear();
        self.size_bytes = 0;
        self.over_bound = false;
        super::release_if_large(&mut self.bytes);
    }

    fn counts(&mut self, len: usize) -> bool {
        self.size_bytes += len + ENTRY_OVERHEAD_BYTES;
        self.over_bound |= self.size_bytes > self.size_bytes_max;
        !self.over_bound
    }

    fn keep(&mut self, bytes: &[u8]) -> Span {
        let span = Span {
            start: self.bytes.len(),
            len: bytes.len(),
        };
        self.bytes.extend_from_slice(bytes);
        span
    }

    fn push_decoded(&mut self, name: &[u8], value: &[u8], sensitive: bool) {
        if self.counts(name.len() + value.len()) {
            let name = self.keep(name);
            let value = Value::Decoded(self.keep(value));
            self.list.push(Field {
                name,
                value,
                sensitive,
            });
        }
    }

    fn push_wire(&mut self, name: &[u8], value: Str, sensitive: bool) {
        if self.counts(name.len() + value.len) {
            let name = self.keep(name);
            self.list.push(Field {
                name,
                value: Value::Wire(value),
                sensitive,
            });
        }
    }

    /// The position of the first field named `name`.
    pub(super) fn find(&self, name: &[u8]) -> Option<usize> {
        self.list
            .iter()
            .position(|field| field.name.of(&self.bytes) == name)
    }

    /// Field `i`'s value, decoded now if it was not; `block` is the block decoded last.
    pub(super) fn value(&mut self, i: usize, block: &[u8]) -> Result<&[u8], Error> {
        let span = match self.list[i].value {
            Value::Decoded(span) => span,
            Value::Wire(s) => {
                let start = self.bytes.len();
                s.decode_into(&block[s.start..s.start + s.len], &mut self.bytes)?;
                let span = Span {
                    start,
                    len: self.bytes.len() - start,
                };
                self.list[i].value = Value::Decoded(span);
                span
            }
        };
        Ok(span.of(&self.bytes))
    }

    pub(super) fn set_value(&mut self, i: usize, value: &[u8]) {
        self.list[i].value = Value::Decoded(self.keep(value));
    }

    /// Decodes every value still on the wire.
    pub(super) fn resolve(&mut self, block: &[u8]) -> Result<(), Error> {
        for i in 0..self.list.len() {
            self.value(i, block)?;
        }
        Ok(())
    }

    /// Every field as (name, value, sensitive); values must be [`resolve`](Self::resolve)d.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8], bool)> {
        self.list.iter().map(|field| {
            let Value::Decoded(value) = field.value else {
                panic!("Fields::iter before Fields::resolve");
            };
            (
                field.name.of(&self.bytes),
                value.of(&self.bytes),
                field.sensitive,
            )
        })
    }
}

/// A string literal's content (§5.2): `len` bytes from `start`, Huffman coded or not.
#[derive(Clone, Copy)]
struct Str {
    huffman: bool,
    start: usize,
    len: usize,
}

impl Str {
    /// The same string, its start counted from `offset` further back.
    fn at(self, offset: usize) -> Str {
        Str {
            start: self.start + offset,
            ..self
        }
    }

    /// Decodes the string that starts `bytes` (the position `string` was called at).
    fn decode(self, bytes: &[u8]) -> Result<Vec<u8>, Error> {
        let mut out = Vec::new();
        self.decode_into(&bytes[self.start..self.start + self.len], &mut out)?;
        Ok(out)
    }

    fn decode_into(self, content: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
        if self.huffman {
            huffman_decode(content, out)
        } else {
            out.extend_from_slice(content);
            Ok(())
        }
    }
}

/// §5.2: the string literal at the start of `bytes`, and the bytes it takes (length included).
fn string(bytes: &[u8]) -> Result<(Str, usize), Error> {
    let huffman = bytes.first().ok_or(Error::String)? & 0x80 != 0;
    let (len, n) = integer(bytes, 7)?;
    if bytes.len() - n < len {
        return Err(Error::String);
    }
    Ok((
        Str {
            huffman,
            start: n,
            len,
        },
        n + len,
    ))
}

/// §5.1: the integer with an N-bit prefix at the start of `bytes`, and the bytes it takes.
/// Values beyond 2^28 are refused: no length or index here comes near.
pub(super) fn integer(bytes: &[u8], prefix_bits: u32) -> Result<(usize, usize), Error> {
    let prefix_max = (1usize << prefix_bits) - 1;
    let first = usize::from(*bytes.first().ok_or(Error::Integer)?) & prefix_max;
    if first < prefix_max {
        return Ok((first, 1));
    }
    let mut value = prefix_max;
    for (i, &byte) in bytes.iter().enumerate().skip(1).take(4) {
        value += usize::from(byte & 0x7f) << (7 * (i - 1));
        if byte & 0x80 == 0 {
            return Ok((value, i + 1));
        }
    }
    Err(Error::Integer)
}

/// §5.1, the other way: `value` with an N-bit prefix, the first byte's other bits `first_bits`.
pub(super) fn encode_integer(value: usize, prefix_bits: u32, first_bits: u8, out: &mut Vec<u8>) {
    let prefix_max = (1usize << prefix_bits) - 1;
    if value < prefix_max {
        out.push(first_bits | value as u8);
        return;
    }
    out.push(first_bits | prefix_max as u8);
    let mut rest = value - prefix_max;
    while rest >= 0x80 {
        out.push((rest & 0x7f) as u8 | 0x80);
        rest >>= 7;
    }
    out.push(rest as u8);
}

/// The Huffman code's length in bits for each symbol, 0 to 255 and EOS (256): RFC 7541
/// Appendix B. The code is canonical (codes of one length are consecutive, in symbol order, and
/// each length's first code follows the previous length's last), so the lengths define it.
const HUFFMAN_CODE_BITS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, // 0..15
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28, // 16..31
    6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, // 32..47
    5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, // 48..63
    13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, // 64..79
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, // 80..95
    15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5, // 96..111
    6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, // 112..127
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23, // 128..143
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, // 144..159
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, // 160..175
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23, // 176..191
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, // 192..207
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, // 208..223
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23, // 224..239
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, // 240..255
    30, // EOS
];

const HUFFMAN_BITS_MAX: usize = 30;
const EOS: u16 = 256;

/// The canonical code in the form decoding wants: per length, the first code, how many codes,
/// and where its symbols start in `symbols` (all symbols ordered by length, then value).
struct Canonical {
    first_code: [u32; HUFFMAN_BITS_MAX + 1],
    count: [u32; HUFFMAN_BITS_MAX + 1],
    first_symbol: [usize; HUFFMAN_BITS_MAX + 1],
    symbols: [u16; 257],
}

const CANONICAL: Canonical = canonical(&HUFFMAN_CODE_BITS);

const fn canonical(bits: &[u8; 257]) -> Canonical {
    let mut c = Canonical {
        first_code: [0; HUFFMAN_BITS_MAX + 1],
        count: [0; HUFFMAN_BITS_MAX + 1],
        first_symbol: [0; HUFFMAN_BITS_MAX + 1],
        symbols: [0; 257],
    };
    let mut s = 0;
    while s < 257 {
        c.count[bits[s] as usize] += 1;
        s += 1;
    }
    let mut code = 0;
    let mut next = 0;
    let mut len = 1;
    while len <= HUFFMAN_BITS_MAX {
        code = (code + c.count[len - 1]) << 1;
        c.first_code[len] = code;
        c.first_symbol[len] = next;
        let mut s = 0;
        while s < 257 {
            if bits[s] as usize == len {
                c.symbols[next] = s as u16;
                next += 1;
            }
            s += 1;
        }
        len += 1;
    }
    c
}

/// §5.2 and Appendix B: decodes `bytes` onto `out`. Refuses EOS inside the string and padding
/// that is 8 bits or more, or not the most significant bits of EOS (all ones).
fn huffman_decode(bytes: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
    let c = &CANONICAL;
    let mut code = 0u32;
    let mut len = 0;
    for &byte in bytes {
        for shift in (0..8).rev() {
            code = code << 1 | u32::from(byte >> shift & 1);
            len += 1;
            let offset = code.wrapping_sub(c.first_code[len]);
            if offset < c.count[len] {
                let symbol = c.symbols[c.first_symbol[len] + offset as usize];
                if symbol == EOS {
                    return Err(Error::Huffman);
                }
                out.push(symbol as u8);
                code = 0;
                len = 0;
            } else if len == HUFFMAN_BITS_MAX {
                return Err(Error::Huffman);
            }
        }
    }
    if len > 7 || code != (1 << len) - 1 {
        return Err(Error::Huffman);
    }
    Ok(())
}

/// Appendix A.
const STATIC_LEN: usize = 61;
const STATIC_TABLE: [(&str, &str); STATIC_LEN] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

#[cfg(test)]
mod tests;
