//! The key-value hash of etcd's `HashKV`, computed as etcd computes it, so that the same history
//! hashes to the same value on leasehold and on etcd, and on every member at one revision.
//!
//! etcd feeds CRC-32C (Castagnoli) with the name of its `key` bucket and then, in revision order,
//! each stored revision's bucket key (8 bytes main, `_`, 8 bytes sub, big-endian, and `t` on a
//! tombstone) and its value (the protobuf encoding of `mvccpb.KeyValue`; a tombstone's holds only
//! the key). It hashes the revisions above the compaction point up to the one asked for, and of
//! those at or below the compaction point only each key's newest at the asked revision that is
//! not a tombstone (all of them if no key has one). What this store keeps below the compaction
//! point is exactly what etcd's physical compaction keeps, so hashing the same selection of the
//! same versions gives etcd's value.

use crate::Revision;

/// What `HashKV` answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvHash {
    pub hash: u32,
    /// The revision hashed (the current one when 0 was asked for).
    pub hash_revision: i64,
    pub compact_revision: i64,
}

/// One stored revision as the hash reads it.
pub(crate) struct HashedVersion<'s> {
    pub rev: Revision,
    pub key: &'s [u8],
    /// `None` for a tombstone.
    pub value: Option<&'s [u8]>,
    pub create_revision: i64,
    pub version: i64,
    pub lease: i64,
}

/// etcd's hash, fed the selected versions one at a time in revision order: CRC-32C, as Go's
/// `crc32.MakeTable(crc32.Castagnoli)`, with the CPU's CRC32 instruction where it has one (a
/// compaction hashes every live value; docs/bench.md, "2026-12-06 (later)").
pub(crate) struct KvHasher {
    crc: u32,
    buf: Vec<u8>,
}

impl KvHasher {
    pub(crate) fn new() -> KvHasher {
        KvHasher {
            crc: crc32c::crc32c(b"key"),
            buf: Vec::new(),
        }
    }

    pub(crate) fn add(&mut self, v: &HashedVersion<'_>) {
        let mut bucket_key = [0u8; 18];
        bucket_key[..8].copy_from_slice(&v.rev.main.to_be_bytes());
        bucket_key[8] = b'_';
        bucket_key[9..17].copy_from_slice(&v.rev.sub.to_be_bytes());
        let len = if v.value.is_some() {
            17
        } else {
            bucket_key[17] = b't';
            18
        };
        self.crc = crc32c::crc32c_append(self.crc, &bucket_key[..len]);
        self.buf.clear();
        encode_key_value(&mut self.buf, v);
        self.crc = crc32c::crc32c_append(self.crc, &self.buf);
    }

    pub(crate) fn finish(self) -> u32 {
        self.crc
    }
}

/// `mvccpb.KeyValue` in protobuf's encoding, fields in number order and zero values left out,
/// as Go's marshaller writes it: key 1, create_revision 2, mod_revision 3, version 4, value 5,
/// lease 6. A tombstone carries only its key.
fn encode_key_value(out: &mut Vec<u8>, v: &HashedVersion<'_>) {
    bytes_field(out, 1, v.key);
    let Some(value) = v.value else {
        return;
    };
    varint_field(out, 2, v.create_revision);
    varint_field(out, 3, v.rev.main);
    varint_field(out, 4, v.version);
    bytes_field(out, 5, value);
    varint_field(out, 6, v.lease);
}

fn bytes_field(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    varint(out, field << 3 | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn varint_field(out: &mut Vec<u8>, field: u64, value: i64) {
    if value == 0 {
        return;
    }
    varint(out, field << 3);
    // An int64 is encoded as its two's-complement u64.
    varint(out, value as u64);
}

fn varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn castagnoli_check_value() {
        // The CRC-32C of "123456789" is 0xE3069283 (the catalogue's check value).
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
        // Fed in parts, as the hasher feeds it.
        assert_eq!(
            crc32c::crc32c_append(crc32c::crc32c(b"1234"), b"56789"),
            0xE306_9283
        );
    }

    #[test]
    fn key_value_encoding_matches_protobuf() {
        let mut out = Vec::new();
        encode_key_value(
            &mut out,
            &HashedVersion {
                rev: Revision { main: 300, sub: 0 },
                key: b"k",
                value: Some(b"v"),
                create_revision: 2,
                version: 1,
                lease: 0,
            },
        );
        // key "k"; create 2; mod 300 (varint ac 02); version 1; value "v"; no lease.
        assert_eq!(
            out,
            [
                0x0a, 1, b'k', 0x10, 2, 0x18, 0xac, 0x02, 0x20, 1, 0x2a, 1, b'v'
            ]
        );
        out.clear();
        encode_key_value(
            &mut out,
            &HashedVersion {
                rev: Revision { main: 3, sub: 1 },
                key: b"k",
                value: None,
                create_revision: 0,
                version: 0,
                lease: 0,
            },
        );
        assert_eq!(out, [0x0a, 1, b'k'], "a tombstone holds only its key");
    }
}
