//! Printers: etcdctl 3.4's `simple` and `json` output, byte for byte.
//!
//! etcdctl's JSON is Go's `encoding/json` applied to the Go protobuf structs (or to clientv3's
//! wrappers of them), so the rules are Go's: fields in declaration order, `omitempty` fields left
//! out when zero, bytes as standard base64, 64-bit integers as JSON numbers, and clientv3's lease
//! responses embed `*ResponseHeader`, which flattens the header's fields into the object. The
//! JSON is written by hand here (not through a map) so that field order is explicit.

use std::fmt::Write as _;

use leasehold_api::etcdserverpb::{
    DeleteRangeResponse, LeaseGrantResponse, LeaseKeepAliveResponse, LeaseLeasesResponse,
    LeaseRevokeResponse, LeaseTimeToLiveResponse, PutResponse, RangeResponse, ResponseHeader,
    WatchResponse,
};
use leasehold_api::mvccpb::{Event, KeyValue, event::EventType};
use leasehold_api::v3electionpb::LeaderResponse;

use super::goparse::hex16;
use super::{CtlError, EXIT_BAD_FEATURE};

/// `-w/--write-out`. etcdctl also knows `table`, `fields` and `protobuf`; like etcdctl for the
/// commands here, `table` is refused when printing, and so are `fields` and `protobuf` (which
/// etcdctl supports and we do not).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Simple,
    Json,
    Table,
    Fields,
    Protobuf,
}

impl Format {
    /// etcdctl: `Error: unsupported output format` (exit 4) for an unknown name.
    pub fn parse(name: &str) -> Result<Format, CtlError> {
        match name {
            "simple" => Ok(Format::Simple),
            "json" => Ok(Format::Json),
            "table" => Ok(Format::Table),
            "fields" => Ok(Format::Fields),
            "protobuf" => Ok(Format::Protobuf),
            _ => Err(CtlError::new(EXIT_BAD_FEATURE, "unsupported output format")),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Format::Simple => "simple",
            Format::Json => "json",
            Format::Table => "table",
            Format::Fields => "fields",
            Format::Protobuf => "protobuf",
        }
    }
}

/// What a command prints, in the chosen format.
#[derive(Clone, Copy, Debug)]
pub struct Printer {
    pub format: Format,
    /// `--hex`: keys and values as `\x..` escapes (simple format only, like etcdctl).
    pub hex: bool,
    /// `get --print-value-only`.
    pub value_only: bool,
}

type Printed = Result<Vec<u8>, CtlError>;

impl Printer {
    pub fn new(format: Format, hex: bool) -> Printer {
        Printer {
            format,
            hex,
            value_only: false,
        }
    }

    pub fn is_simple(&self) -> bool {
        self.format == Format::Simple
    }

    /// Simple or JSON; any other format is refused here, when printing, as etcdctl does.
    fn pick(&self, simple: impl FnOnce() -> Vec<u8>, json: impl FnOnce() -> String) -> Printed {
        match self.format {
            Format::Simple => Ok(simple()),
            Format::Json => {
                let mut line = json().into_bytes();
                line.push(b'\n');
                Ok(line)
            }
            other => Err(CtlError::new(
                EXIT_BAD_FEATURE,
                format!("{} not supported as output format", other.name()),
            )),
        }
    }

    /// One key-value: the key line (unless value-only), then the value line.
    fn kv_lines(&self, out: &mut Vec<u8>, kv: &KeyValue) {
        let (key, value) = if self.hex {
            (hex_escaped(&kv.key), hex_escaped(&kv.value))
        } else {
            (kv.key.clone(), kv.value.to_vec())
        };
        if !self.value_only {
            out.extend_from_slice(&key);
            out.push(b'\n');
        }
        out.extend_from_slice(&value);
        out.push(b'\n');
    }

    pub fn put(&self, r: &PutResponse) -> Printed {
        self.pick(
            || {
                let mut out = b"OK\n".to_vec();
                if let Some(prev) = &r.prev_kv {
                    self.kv_lines(&mut out, prev);
                }
                out
            },
            || {
                let mut o = Obj::new();
                o.header("header", r.header.as_ref());
                if let Some(prev) = &r.prev_kv {
                    o.raw("prev_kv", &kv_json(prev));
                }
                o.finish()
            },
        )
    }

    pub fn get(&self, r: &RangeResponse) -> Printed {
        self.pick(
            || {
                let mut out = Vec::new();
                for kv in &r.kvs {
                    self.kv_lines(&mut out, kv);
                }
                out
            },
            || range_json(r),
        )
    }

    pub fn del(&self, r: &DeleteRangeResponse) -> Printed {
        self.pick(
            || {
                let mut out = format!("{}\n", r.deleted).into_bytes();
                for kv in &r.prev_kvs {
                    self.kv_lines(&mut out, kv);
                }
                out
            },
            || {
                let mut o = Obj::new();
                o.header("header", r.header.as_ref());
                o.i64_nz("deleted", r.deleted);
                o.kvs_nz("prev_kvs", &r.prev_kvs);
                o.finish()
            },
        )
    }

    /// A watch response as clientv3 hands it to etcdctl (`WatchResponse` with exported Go field
    /// names and no `omitempty`; `Events` is never null).
    pub fn watch(&self, r: &WatchResponse) -> Printed {
        self.pick(
            || {
                let mut out = Vec::new();
                for e in &r.events {
                    out.extend_from_slice(event_type_name(e.r#type).as_bytes());
                    out.push(b'\n');
                    if let Some(prev) = &e.prev_kv {
                        self.kv_lines(&mut out, prev);
                    }
                    match &e.kv {
                        Some(kv) => self.kv_lines(&mut out, kv),
                        // etcdctl would dereference nil here; print an empty key and value.
                        None => {
                            out.extend_from_slice(if self.value_only { b"\n" } else { b"\n\n" })
                        }
                    }
                }
                out
            },
            || {
                let mut o = Obj::new();
                o.raw(
                    "Header",
                    &header_json(r.header.as_ref().unwrap_or(&ResponseHeader::default())),
                );
                let events: Vec<String> = r.events.iter().map(event_json).collect();
                o.raw("Events", &format!("[{}]", events.join(",")));
                o.i64("CompactRevision", r.compact_revision);
                o.bool("Canceled", r.canceled);
                o.bool("Created", r.created);
                o.finish()
            },
        )
    }

    pub fn grant(&self, r: &LeaseGrantResponse) -> Printed {
        self.pick(
            || format!("lease {} granted with TTL({}s)\n", hex16(r.id), r.ttl).into_bytes(),
            || {
                let mut o = Obj::new();
                o.flat_header(r.header.as_ref());
                o.i64("ID", r.id);
                o.i64("TTL", r.ttl);
                o.str("Error", &r.error);
                o.finish()
            },
        )
    }

    /// etcdctl prints the ID it was given, not one from the response.
    pub fn revoke(&self, id: i64, r: &LeaseRevokeResponse) -> Printed {
        self.pick(
            || format!("lease {} revoked\n", hex16(id)).into_bytes(),
            || {
                let mut o = Obj::new();
                o.header("header", r.header.as_ref());
                o.finish()
            },
        )
    }

    pub fn keep_alive(&self, r: &LeaseKeepAliveResponse) -> Printed {
        self.pick(
            || format!("lease {} keepalived with TTL({})\n", hex16(r.id), r.ttl).into_bytes(),
            || {
                let mut o = Obj::new();
                o.flat_header(r.header.as_ref());
                o.i64("ID", r.id);
                o.i64("TTL", r.ttl);
                o.finish()
            },
        )
    }

    pub fn time_to_live(&self, r: &LeaseTimeToLiveResponse, with_keys: bool) -> Printed {
        self.pick(
            || {
                if r.granted_ttl == 0 && r.ttl == -1 {
                    return format!("lease {} already expired\n", hex16(r.id)).into_bytes();
                }
                let mut line = format!(
                    "lease {} granted with TTL({}s), remaining({}s)",
                    hex16(r.id),
                    r.granted_ttl,
                    r.ttl
                )
                .into_bytes();
                if with_keys {
                    // Go's `%v` of a []string: `[a b c]`.
                    line.extend_from_slice(b", attached keys([");
                    for (i, key) in r.keys.iter().enumerate() {
                        if i > 0 {
                            line.push(b' ');
                        }
                        line.extend_from_slice(key);
                    }
                    line.extend_from_slice(b"])");
                }
                line.push(b'\n');
                line
            },
            || {
                let mut o = Obj::new();
                o.flat_header(r.header.as_ref());
                o.i64("id", r.id);
                o.i64("ttl", r.ttl);
                o.i64("granted-ttl", r.granted_ttl);
                if r.keys.is_empty() {
                    o.raw("keys", "null");
                } else {
                    let keys: Vec<String> = r
                        .keys
                        .iter()
                        .map(|k| format!("\"{}\"", base64(k)))
                        .collect();
                    o.raw("keys", &format!("[{}]", keys.join(",")));
                }
                o.finish()
            },
        )
    }

    pub fn leases(&self, r: &LeaseLeasesResponse) -> Printed {
        self.pick(
            || {
                let mut out = format!("found {} leases\n", r.leases.len());
                for lease in &r.leases {
                    let _ = writeln!(out, "{}", hex16(lease.id));
                }
                out.into_bytes()
            },
            || {
                let mut o = Obj::new();
                o.flat_header(r.header.as_ref());
                let leases: Vec<String> = r
                    .leases
                    .iter()
                    .map(|l| format!("{{\"id\":{}}}", l.id))
                    .collect();
                o.raw("leases", &format!("[{}]", leases.join(",")));
                o.finish()
            },
        )
    }

    /// An election leader as etcdctl's observer prints it: a get response holding only the
    /// header and the leader's key-value (no count).
    pub fn leader(&self, r: &LeaderResponse) -> Printed {
        let kvs: Vec<KeyValue> = r.kv.iter().cloned().collect();
        self.pick(
            || {
                let mut out = Vec::new();
                for kv in &kvs {
                    self.kv_lines(&mut out, kv);
                }
                out
            },
            || {
                let mut o = Obj::new();
                o.header("header", r.header.as_ref());
                o.kvs_nz("kvs", &kvs);
                o.finish()
            },
        )
    }
}

/// `PUT` / `DELETE`, as Go prints the enum.
fn event_type_name(t: i32) -> String {
    match EventType::try_from(t) {
        Ok(EventType::Put) => "PUT".to_string(),
        Ok(EventType::Delete) => "DELETE".to_string(),
        Err(_) => t.to_string(),
    }
}

/// etcdctl's `--hex`: every byte as `\xNN`.
fn hex_escaped(bytes: &[u8]) -> Vec<u8> {
    let mut out = String::with_capacity(bytes.len() * 4);
    for b in bytes {
        let _ = write!(out, "\\x{b:02x}");
    }
    out.into_bytes()
}

pub fn range_json(r: &RangeResponse) -> String {
    let mut o = Obj::new();
    o.header("header", r.header.as_ref());
    o.kvs_nz("kvs", &r.kvs);
    o.bool_nz("more", r.more);
    o.i64_nz("count", r.count);
    o.finish()
}

pub fn header_json(h: &ResponseHeader) -> String {
    let mut o = Obj::new();
    o.header_fields(h);
    o.finish()
}

pub fn kv_json(kv: &KeyValue) -> String {
    let mut o = Obj::new();
    o.bytes_nz("key", &kv.key);
    o.i64_nz("create_revision", kv.create_revision);
    o.i64_nz("mod_revision", kv.mod_revision);
    o.i64_nz("version", kv.version);
    o.bytes_nz("value", &kv.value);
    o.i64_nz("lease", kv.lease);
    o.finish()
}

fn event_json(e: &Event) -> String {
    let mut o = Obj::new();
    o.i64_nz("type", i64::from(e.r#type));
    if let Some(kv) = &e.kv {
        o.raw("kv", &kv_json(kv));
    }
    if let Some(prev) = &e.prev_kv {
        o.raw("prev_kv", &kv_json(prev));
    }
    o.finish()
}

/// A JSON object written field by field, in order.
struct Obj {
    buf: String,
    empty: bool,
}

impl Obj {
    fn new() -> Obj {
        Obj {
            buf: String::from("{"),
            empty: true,
        }
    }

    fn raw(&mut self, name: &str, json: &str) {
        if !self.empty {
            self.buf.push(',');
        }
        self.empty = false;
        self.buf.push_str(&json_string(name));
        self.buf.push(':');
        self.buf.push_str(json);
    }

    fn i64(&mut self, name: &str, v: i64) {
        self.raw(name, &v.to_string());
    }

    fn i64_nz(&mut self, name: &str, v: i64) {
        if v != 0 {
            self.i64(name, v);
        }
    }

    fn u64_nz(&mut self, name: &str, v: u64) {
        if v != 0 {
            self.raw(name, &v.to_string());
        }
    }

    fn bool(&mut self, name: &str, v: bool) {
        self.raw(name, if v { "true" } else { "false" });
    }

    fn bool_nz(&mut self, name: &str, v: bool) {
        if v {
            self.bool(name, v);
        }
    }

    fn str(&mut self, name: &str, v: &str) {
        self.raw(name, &json_string(v));
    }

    fn bytes_nz(&mut self, name: &str, v: &[u8]) {
        if !v.is_empty() {
            self.raw(name, &format!("\"{}\"", base64(v)));
        }
    }

    fn kvs_nz(&mut self, name: &str, kvs: &[KeyValue]) {
        if !kvs.is_empty() {
            let items: Vec<String> = kvs.iter().map(kv_json).collect();
            self.raw(name, &format!("[{}]", items.join(",")));
        }
    }

    /// `"header":{...}` for a `*ResponseHeader` field with `omitempty` (absent when nil).
    fn header(&mut self, name: &str, h: Option<&ResponseHeader>) {
        if let Some(h) = h {
            self.raw(name, &header_json(h));
        }
    }

    /// The fields of an embedded `*ResponseHeader`, promoted into this object.
    fn flat_header(&mut self, h: Option<&ResponseHeader>) {
        if let Some(h) = h {
            self.header_fields(h);
        }
    }

    fn header_fields(&mut self, h: &ResponseHeader) {
        self.u64_nz("cluster_id", h.cluster_id);
        self.u64_nz("member_id", h.member_id);
        self.i64_nz("revision", h.revision);
        self.u64_nz("raft_term", h.raft_term);
    }

    fn finish(mut self) -> String {
        self.buf.push('}');
        self.buf
    }
}

/// A JSON string as Go's `encoding/json` writes it (HTML-safe: `<`, `>`, `&` escaped, and
/// U+2028/U+2029).
pub fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Standard base64 with padding (Go's `encoding/json` for `[]byte`).
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        out.push(ALPHABET[(n >> 18) as usize & 63] as char);
        out.push(ALPHABET[(n >> 12) as usize & 63] as char);
        out.push(if chunk.len() > 1 {
            ALPHABET[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        out.push(if chunk.len() > 2 {
            ALPHABET[n as usize & 63] as char
        } else {
            '='
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_api::etcdserverpb::LeaseStatus;

    fn header(revision: i64) -> Option<ResponseHeader> {
        Some(ResponseHeader {
            cluster_id: 15118495548433857066,
            member_id: 13668033151171901709,
            revision,
            raft_term: 2,
        })
    }

    fn kv(
        key: &str,
        value: &str,
        create: i64,
        modified: i64,
        version: i64,
        lease: i64,
    ) -> KeyValue {
        KeyValue {
            key: key.into(),
            create_revision: create,
            mod_revision: modified,
            version,
            value: value.as_bytes().to_vec().into(),
            lease,
        }
    }

    fn simple() -> Printer {
        Printer::new(Format::Simple, false)
    }

    fn json() -> Printer {
        Printer::new(Format::Json, false)
    }

    fn text(p: Printed) -> String {
        String::from_utf8(p.expect("printed")).expect("utf-8")
    }

    const HDR: &str = r#"{"cluster_id":15118495548433857066,"member_id":13668033151171901709,"revision":4,"raft_term":2}"#;

    #[test]
    fn base64_like_go() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"bar2"), "YmFyMg==");
        assert_eq!(base64(&[0xff, 0xfe]), "//4=");
    }

    #[test]
    fn json_strings_are_html_safe_like_go() {
        assert_eq!(
            json_string("a<b>&\"\\\n\u{1}"),
            r#""a\u003cb\u003e\u0026\"\\\n\u0001""#
        );
    }

    /// Captured from etcdctl 3.4.23: `put foo bar3 --prev-kv -w json`.
    #[test]
    fn put_json_with_prev_kv() {
        let r = PutResponse {
            header: header(4),
            prev_kv: Some(kv("foo", "bar2", 2, 3, 2, 0)),
        };
        assert_eq!(
            text(json().put(&r)),
            format!(
                "{{\"header\":{HDR},\"prev_kv\":{{\"key\":\"Zm9v\",\"create_revision\":2,\"mod_revision\":3,\"version\":2,\"value\":\"YmFyMg==\"}}}}\n"
            )
        );
        assert_eq!(text(simple().put(&r)), "OK\nfoo\nbar2\n");
    }

    #[test]
    fn get_json_omits_zero_fields() {
        let r = RangeResponse {
            header: header(4),
            kvs: vec![],
            more: false,
            count: 0,
        };
        assert_eq!(text(json().get(&r)), format!("{{\"header\":{HDR}}}\n"));
        let r = RangeResponse {
            header: header(4),
            kvs: vec![kv("a", "", 7, 11, 4, 0x10)],
            more: true,
            count: 3,
        };
        assert_eq!(
            text(json().get(&r)),
            format!(
                "{{\"header\":{HDR},\"kvs\":[{{\"key\":\"YQ==\",\"create_revision\":7,\"mod_revision\":11,\"version\":4,\"lease\":16}}],\"more\":true,\"count\":3}}\n"
            )
        );
    }

    #[test]
    fn get_simple_value_only_and_hex() {
        let r = RangeResponse {
            header: header(4),
            kvs: vec![kv("a", "1", 1, 1, 1, 0), kv("b", "2", 1, 1, 1, 0)],
            more: false,
            count: 2,
        };
        assert_eq!(text(simple().get(&r)), "a\n1\nb\n2\n");
        let mut p = simple();
        p.value_only = true;
        assert_eq!(text(p.get(&r)), "1\n2\n");
        let p = Printer::new(Format::Simple, true);
        assert_eq!(text(p.get(&r)), "\\x61\n\\x31\n\\x62\n\\x32\n");
    }

    #[test]
    fn del_simple_and_json() {
        let r = DeleteRangeResponse {
            header: header(4),
            deleted: 1,
            prev_kvs: vec![kv("a", "1", 15, 15, 1, 0)],
        };
        assert_eq!(text(simple().del(&r)), "1\na\n1\n");
        assert_eq!(
            text(json().del(&r)),
            format!(
                "{{\"header\":{HDR},\"deleted\":1,\"prev_kvs\":[{{\"key\":\"YQ==\",\"create_revision\":15,\"mod_revision\":15,\"version\":1,\"value\":\"MQ==\"}}]}}\n"
            )
        );
        let none = DeleteRangeResponse {
            header: header(4),
            deleted: 0,
            prev_kvs: vec![],
        };
        assert_eq!(text(simple().del(&none)), "0\n");
        assert_eq!(text(json().del(&none)), format!("{{\"header\":{HDR}}}\n"));
    }

    /// Captured from etcdctl 3.4.23: a delete event and a compaction cancel.
    #[test]
    fn watch_json_like_clientv3() {
        let r = WatchResponse {
            header: header(4),
            events: vec![Event {
                r#type: EventType::Delete as i32,
                kv: Some(kv("w1", "", 0, 27, 0, 0)),
                prev_kv: None,
            }],
            ..Default::default()
        };
        assert_eq!(
            text(json().watch(&r)),
            format!(
                "{{\"Header\":{HDR},\"Events\":[{{\"type\":1,\"kv\":{{\"key\":\"dzE=\",\"mod_revision\":27}}}}],\"CompactRevision\":0,\"Canceled\":false,\"Created\":false}}\n"
            )
        );
        assert_eq!(text(simple().watch(&r)), "DELETE\nw1\n\n");
        let canceled = WatchResponse {
            header: Some(ResponseHeader {
                revision: 0,
                ..header(0).unwrap()
            }),
            canceled: true,
            compact_revision: 20,
            ..Default::default()
        };
        assert_eq!(
            text(json().watch(&canceled)),
            "{\"Header\":{\"cluster_id\":15118495548433857066,\"member_id\":13668033151171901709,\"raft_term\":2},\"Events\":[],\"CompactRevision\":20,\"Canceled\":true,\"Created\":false}\n"
        );
    }

    #[test]
    fn watch_simple_with_prev_kv() {
        let r = WatchResponse {
            header: header(4),
            events: vec![Event {
                r#type: EventType::Put as i32,
                kv: Some(kv("w1", "b", 24, 25, 2, 0)),
                prev_kv: Some(kv("w1", "a", 24, 24, 1, 0)),
            }],
            ..Default::default()
        };
        assert_eq!(text(simple().watch(&r)), "PUT\nw1\na\nw1\nb\n");
    }

    /// Captured from etcdctl 3.4.23 (`lease grant 100 -w json`, `keep-alive --once -w json`).
    #[test]
    fn lease_grant_and_keep_alive_flatten_the_header() {
        let g = LeaseGrantResponse {
            header: header(4),
            id: 4111120162112841793,
            ttl: 100,
            error: String::new(),
        };
        assert_eq!(
            text(json().grant(&g)),
            "{\"cluster_id\":15118495548433857066,\"member_id\":13668033151171901709,\"revision\":4,\"raft_term\":2,\"ID\":4111120162112841793,\"TTL\":100,\"Error\":\"\"}\n"
        );
        assert_eq!(
            text(simple().grant(&g)),
            "lease 390da2017baea841 granted with TTL(100s)\n"
        );
        let k = LeaseKeepAliveResponse {
            header: header(4),
            id: 0x1234,
            ttl: 100,
        };
        assert_eq!(
            text(json().keep_alive(&k)),
            "{\"cluster_id\":15118495548433857066,\"member_id\":13668033151171901709,\"revision\":4,\"raft_term\":2,\"ID\":4660,\"TTL\":100}\n"
        );
        assert_eq!(
            text(simple().keep_alive(&k)),
            "lease 0000000000001234 keepalived with TTL(100)\n"
        );
    }

    #[test]
    fn lease_revoke_keeps_the_header_nested() {
        let r = LeaseRevokeResponse { header: header(4) };
        assert_eq!(
            text(json().revoke(0x1234, &r)),
            format!("{{\"header\":{HDR}}}\n")
        );
        assert_eq!(
            text(simple().revoke(0x1234, &r)),
            "lease 0000000000001234 revoked\n"
        );
    }

    /// Captured from etcdctl 3.4.23 (`lease timetolive [--keys] -w json`, known and unknown).
    #[test]
    fn lease_time_to_live_simple_and_json() {
        let live = LeaseTimeToLiveResponse {
            header: header(4),
            id: 0x390da2017baea8aa,
            ttl: 99,
            granted_ttl: 100,
            keys: vec![b"k2".to_vec(), b"k1".to_vec()],
        };
        assert_eq!(
            text(simple().time_to_live(&live, true)),
            "lease 390da2017baea8aa granted with TTL(100s), remaining(99s), attached keys([k2 k1])\n"
        );
        assert_eq!(
            text(simple().time_to_live(&live, false)),
            "lease 390da2017baea8aa granted with TTL(100s), remaining(99s)\n"
        );
        assert_eq!(
            text(json().time_to_live(&live, true)),
            "{\"cluster_id\":15118495548433857066,\"member_id\":13668033151171901709,\"revision\":4,\"raft_term\":2,\"id\":4111120162112841898,\"ttl\":99,\"granted-ttl\":100,\"keys\":[\"azI=\",\"azE=\"]}\n"
        );
        let gone = LeaseTimeToLiveResponse {
            header: header(4),
            id: 0x1234,
            ttl: -1,
            granted_ttl: 0,
            keys: vec![],
        };
        assert_eq!(
            text(simple().time_to_live(&gone, true)),
            "lease 0000000000001234 already expired\n"
        );
        assert_eq!(
            text(json().time_to_live(&gone, true)),
            "{\"cluster_id\":15118495548433857066,\"member_id\":13668033151171901709,\"revision\":4,\"raft_term\":2,\"id\":4660,\"ttl\":-1,\"granted-ttl\":0,\"keys\":null}\n"
        );
    }

    #[test]
    fn lease_list_simple_and_json() {
        let r = LeaseLeasesResponse {
            header: header(4),
            leases: vec![LeaseStatus { id: 0x10 }, LeaseStatus { id: 0x20 }],
        };
        assert_eq!(
            text(simple().leases(&r)),
            "found 2 leases\n0000000000000010\n0000000000000020\n"
        );
        assert_eq!(
            text(json().leases(&r)),
            "{\"cluster_id\":15118495548433857066,\"member_id\":13668033151171901709,\"revision\":4,\"raft_term\":2,\"leases\":[{\"id\":16},{\"id\":32}]}\n"
        );
        let none = LeaseLeasesResponse {
            header: header(4),
            leases: vec![],
        };
        assert_eq!(text(simple().leases(&none)), "found 0 leases\n");
        assert!(text(json().leases(&none)).ends_with(",\"leases\":[]}\n"));
    }

    #[test]
    fn leader_prints_like_an_observed_get() {
        let r = LeaderResponse {
            header: header(4),
            kv: Some(kv("e/1", "p", 3, 3, 1, 0x20)),
        };
        assert_eq!(text(simple().leader(&r)), "e/1\np\n");
        assert_eq!(
            text(json().leader(&r)),
            format!(
                "{{\"header\":{HDR},\"kvs\":[{{\"key\":\"ZS8x\",\"create_revision\":3,\"mod_revision\":3,\"version\":1,\"value\":\"cA==\",\"lease\":32}}]}}\n"
            )
        );
    }

    #[test]
    fn unsupported_formats_fail_when_printing() {
        for (format, name) in [
            (Format::Table, "table"),
            (Format::Fields, "fields"),
            (Format::Protobuf, "protobuf"),
        ] {
            let err = Printer::new(format, false)
                .put(&PutResponse::default())
                .unwrap_err();
            assert_eq!(err.code, EXIT_BAD_FEATURE);
            assert_eq!(
                err.message,
                format!("{name} not supported as output format")
            );
        }
        let err = Format::parse("yaml").unwrap_err();
        assert_eq!(
            (err.code, err.message.as_str()),
            (4, "unsupported output format")
        );
    }
}
