//! The core's own request, response and record types. They mirror etcd's wire messages closely
//! (so conversion at the gRPC edge is one function per message), but use newtypes and `Option`
//! where the wire uses sentinels.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

pub use leasehold_types::LeaseId;

/// A point in the store's history: `main` is the revision clients see; `sub` orders the changes
/// made by one write (a txn with several ops) at the same main revision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Revision {
    pub main: i64,
    pub sub: i64,
}

impl Revision {
    /// Big-endian encoding, so that byte order equals revision order (the on-disk key).
    pub fn to_bytes(self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&self.main.to_be_bytes());
        out[8..].copy_from_slice(&self.sub.to_be_bytes());
        out
    }

    /// Inverse of [`Revision::to_bytes`].
    pub fn from_bytes(bytes: [u8; 16]) -> Revision {
        let (main, sub) = bytes.split_at(8);
        Revision {
            main: i64::from_be_bytes(main.try_into().expect("8 bytes")),
            sub: i64::from_be_bytes(sub.try_into().expect("8 bytes")),
        }
    }
}

/// One version of a key, as etcd's `mvccpb.KeyValue`. Keys and values go through serde as
/// byte strings (`serde_bytes`, and `Bytes`' own impl), not sequences of `u8`: postcard writes
/// both the same way (a length, then the bytes), so stored rows and snapshots are unchanged, but
/// a byte string is read in one copy instead of one call per byte (reading every row at start-up
/// and for a snapshot spent a tenth of its time there: docs/bench.md).
///
/// The value is shared, not owned: a read hands out the store's own bytes (a reference count),
/// so a read of a gigabyte copies no value under the state lock, and the answer's encoder reads
/// them in place.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyValue {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    pub value: Bytes,
    pub lease: Option<LeaseId>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SortOrder {
    #[default]
    None,
    Ascend,
    Descend,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SortTarget {
    #[default]
    Key,
    Version,
    Create,
    Mod,
    Value,
}

/// etcd's `RangeRequest`. `range_end` follows etcd: empty means the single key `key`, `[0]` means
/// every key `>= key`, anything else is the half-open interval `[key, range_end)`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeRequest {
    pub key: Vec<u8>,
    pub range_end: Vec<u8>,
    /// `<= 0` means no limit.
    pub limit: i64,
    /// `<= 0` means the current revision.
    pub revision: i64,
    pub sort_order: SortOrder,
    pub sort_target: SortTarget,
    pub serializable: bool,
    pub keys_only: bool,
    pub count_only: bool,
    pub min_mod_revision: i64,
    pub max_mod_revision: i64,
    pub min_create_revision: i64,
    pub max_create_revision: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeResponse {
    /// The store revision the header carries (the current one, not the one read at).
    pub revision: i64,
    pub kvs: Vec<KeyValue>,
    pub more: bool,
    pub count: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PutRequest {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub lease: Option<LeaseId>,
    pub prev_kv: bool,
    pub ignore_value: bool,
    pub ignore_lease: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PutResponse {
    pub revision: i64,
    pub prev_kv: Option<KeyValue>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteRangeRequest {
    pub key: Vec<u8>,
    pub range_end: Vec<u8>,
    pub prev_kv: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteRangeResponse {
    pub revision: i64,
    pub deleted: i64,
    pub prev_kvs: Vec<KeyValue>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompareResult {
    Equal,
    Greater,
    Less,
    NotEqual,
}

/// What a compare looks at, with the operand. etcd carries the operand in a oneof that may
/// disagree with the target; the edge resolves that (a missing operand is zero or empty).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompareTarget {
    Version(i64),
    Create(i64),
    Mod(i64),
    Value(Vec<u8>),
    Lease(i64),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compare {
    pub result: CompareResult,
    pub target: CompareTarget,
    pub key: Vec<u8>,
    pub range_end: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RequestOp {
    Range(RangeRequest),
    Put(PutRequest),
    DeleteRange(DeleteRangeRequest),
    Txn(TxnRequest),
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnRequest {
    pub compare: Vec<Compare>,
    pub success: Vec<RequestOp>,
    pub failure: Vec<RequestOp>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResponseOp {
    Range(RangeResponse),
    Put(PutResponse),
    DeleteRange(DeleteRangeResponse),
    Txn(TxnResponse),
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnResponse {
    pub revision: i64,
    pub succeeded: bool,
    pub responses: Vec<ResponseOp>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    Put,
    Delete,
}

/// One change as a watcher sees it (etcd's `mvccpb.Event`). A delete's `kv` holds only the key
/// and the revision of the delete; `prev_kv` is the version before, if it is still stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub kind: EventKind,
    pub kv: KeyValue,
    pub prev_kv: Option<KeyValue>,
}

/// A change to persist, in the order made. The storage layer writes these to its revision table;
/// later the watch hub turns them into events.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Change {
    /// A new version of a key, or its deletion (`kv.value` empty, `tombstone` set).
    Write { rev: Revision, record: Record },
    /// A revision physically removed by compaction.
    Remove { rev: Revision },
}

/// What the store keeps at one revision of one key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Record {
    Put(KeyValue),
    Tombstone {
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
    },
}

impl Record {
    pub fn key(&self) -> &[u8] {
        match self {
            Record::Put(kv) => &kv.key,
            Record::Tombstone { key } => key,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stored encoding before keys and values went through serde as byte strings.
    #[derive(Serialize, Deserialize)]
    enum SeqRecord {
        Put {
            key: Vec<u8>,
            create_revision: i64,
            mod_revision: i64,
            version: i64,
            value: Vec<u8>,
            lease: Option<LeaseId>,
        },
        Tombstone {
            key: Vec<u8>,
        },
    }

    #[test]
    fn records_encode_as_they_always_did() {
        let kv = KeyValue {
            key: b"key".to_vec(),
            create_revision: 2,
            mod_revision: 7,
            version: 3,
            value: vec![0, 1, 255, 128].into(),
            lease: LeaseId::from_wire(-5),
        };
        let old = SeqRecord::Put {
            key: kv.key.clone(),
            create_revision: 2,
            mod_revision: 7,
            version: 3,
            value: kv.value.to_vec(),
            lease: kv.lease,
        };
        let new = postcard::to_stdvec(&Record::Put(kv.clone())).expect("encode");
        assert_eq!(new, postcard::to_stdvec(&old).expect("encode"));
        let back: Record = postcard::from_bytes(&postcard::to_stdvec(&old).expect("encode"))
            .expect("decode the old encoding");
        assert_eq!(back, Record::Put(kv));
        let tomb = SeqRecord::Tombstone { key: b"k".to_vec() };
        let tomb_new = Record::Tombstone { key: b"k".to_vec() };
        assert_eq!(
            postcard::to_stdvec(&tomb_new).expect("encode"),
            postcard::to_stdvec(&tomb).expect("encode")
        );
    }
}
