//! Recording client responses as JSON, so that two servers' answers can be compared.

use std::fmt::Write as _;

use etcd_client::{
    CampaignResponse, CompactionResponse, DeleteResponse, Error as EtcdError, GetResponse,
    KeyValue, LeaderKey, LeaderResponse, LeaseGrantResponse, LeaseKeepAliveResponse,
    LeaseLeasesResponse, LeaseRevokeResponse, LeaseTimeToLiveResponse, LockResponse,
    ProclaimResponse, PutResponse, ResignResponse, ResponseHeader, TxnOpResponse, TxnResponse,
    UnlockResponse, WatchResponse, WatchStream,
};
use serde_json::{Value, json};

use crate::*;

// ---------------------------------------------------------------------------------------------
// Recording responses as JSON
// ---------------------------------------------------------------------------------------------

/// Bytes as a string when they are short UTF-8, else hex; long values as length + hash.
pub fn bytes_json(bytes: &[u8]) -> Value {
    if bytes.len() > RECORDED_BYTES_LEN_MAX {
        return json!({ "len": bytes.len(), "fnv1a64": format!("{:016x}", fnv1a64(bytes)) });
    }
    match std::str::from_utf8(bytes) {
        Ok(text) => Value::String(text.to_string()),
        Err(_) => json!({ "hex": hex(bytes) }),
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The header without what differs between any two clusters: cluster_id, member_id and
/// raft_term are dropped, the revision is kept.
pub fn header_json(header: Option<&ResponseHeader>) -> Value {
    match header {
        Some(h) => json!({ "revision": h.revision() }),
        None => Value::Null,
    }
}

/// Every field of a key-value.
pub fn kv_json(kv: &KeyValue) -> Value {
    json!({
        "key": bytes_json(kv.key()),
        "value": bytes_json(kv.value()),
        "create_revision": kv.create_revision(),
        "mod_revision": kv.mod_revision(),
        "version": kv.version(),
        "lease": kv.lease(),
    })
}

pub fn kvs_json(kvs: &[KeyValue]) -> Value {
    Value::Array(kvs.iter().map(kv_json).collect())
}

/// `{code, message}` of a gRPC status; any other client error as its text.
pub fn error_json(error: &EtcdError) -> Value {
    match error {
        EtcdError::GRpcStatus(status) => json!({
            "error": { "code": format!("{:?}", status.code()), "message": status.message() }
        }),
        other => json!({ "error": { "client": other.to_string() } }),
    }
}

/// A response that can be recorded.
pub trait Record {
    fn to_json(&self) -> Value;
}

impl Record for PutResponse {
    fn to_json(&self) -> Value {
        json!({ "put": {
            "header": header_json(self.header()),
            "prev_kv": self.prev_key().map_or(Value::Null, kv_json),
        }})
    }
}

impl Record for GetResponse {
    fn to_json(&self) -> Value {
        json!({ "range": {
            "header": header_json(self.header()),
            "kvs": kvs_json(self.kvs()),
            "more": self.more(),
            "count": self.count(),
        }})
    }
}

impl Record for DeleteResponse {
    fn to_json(&self) -> Value {
        json!({ "delete_range": {
            "header": header_json(self.header()),
            "deleted": self.deleted(),
            "prev_kvs": kvs_json(self.prev_kvs()),
        }})
    }
}

impl Record for TxnResponse {
    fn to_json(&self) -> Value {
        let responses: Vec<Value> = self
            .op_responses()
            .iter()
            .map(|op| match op {
                TxnOpResponse::Put(r) => r.to_json(),
                TxnOpResponse::Get(r) => r.to_json(),
                TxnOpResponse::Delete(r) => r.to_json(),
                TxnOpResponse::Txn(r) => r.to_json(),
            })
            .collect();
        json!({ "txn": {
            "header": header_json(self.header()),
            "succeeded": self.succeeded(),
            "responses": responses,
        }})
    }
}

impl Record for CompactionResponse {
    fn to_json(&self) -> Value {
        json!({ "compact": { "header": header_json(self.header()) } })
    }
}

impl Record for LeaseGrantResponse {
    fn to_json(&self) -> Value {
        json!({ "lease_grant": {
            "header": header_json(self.header()),
            "id": self.id(),
            "ttl": self.ttl(),
            "error": self.error(),
        }})
    }
}

impl Record for LeaseRevokeResponse {
    fn to_json(&self) -> Value {
        json!({ "lease_revoke": { "header": header_json(self.header()) } })
    }
}

impl Record for LeaseKeepAliveResponse {
    fn to_json(&self) -> Value {
        json!({ "lease_keep_alive": {
            "header": header_json(self.header()),
            "id": self.id(),
            "ttl": self.ttl(),
        }})
    }
}

/// A stream's next message: the message, or the end of the stream.
impl<T: Record> Record for Option<T> {
    fn to_json(&self) -> Value {
        match self {
            Some(message) => message.to_json(),
            None => json!("end of stream"),
        }
    }
}

/// The attached keys of a TimeToLive response, sorted: their order is unspecified (etcd sends
/// them in map order).
pub fn lease_keys_json(response: &LeaseTimeToLiveResponse) -> Value {
    let mut keys: Vec<&Vec<u8>> = response.keys().iter().collect();
    keys.sort();
    Value::Array(keys.into_iter().map(|k| bytes_json(k)).collect())
}

/// Every field as-is (keys sorted). The remaining `ttl` depends on time: record this only where
/// it is deterministic (an unknown lease's -1); otherwise record derived facts.
impl Record for LeaseTimeToLiveResponse {
    fn to_json(&self) -> Value {
        json!({ "lease_time_to_live": {
            "header": header_json(self.header()),
            "id": self.id(),
            "ttl": self.ttl(),
            "granted_ttl": self.granted_ttl(),
            "keys": lease_keys_json(self),
        }})
    }
}

/// The IDs in the server's order (ascending remaining time).
impl Record for LeaseLeasesResponse {
    fn to_json(&self) -> Value {
        let ids: Vec<i64> = self.leases().iter().map(|l| l.id()).collect();
        json!({ "lease_leases": { "header": header_json(self.header()), "ids": ids } })
    }
}

impl Record for LockResponse {
    fn to_json(&self) -> Value {
        json!({ "lock": { "header": header_json(self.header()), "key": bytes_json(self.key()) } })
    }
}

impl Record for UnlockResponse {
    fn to_json(&self) -> Value {
        json!({ "unlock": { "header": header_json(self.header()) } })
    }
}

/// Every field of an election's leader key.
pub fn leader_key_json(leader: &LeaderKey) -> Value {
    json!({
        "name": bytes_json(leader.name()),
        "key": bytes_json(leader.key()),
        "rev": leader.rev(),
        "lease": leader.lease(),
    })
}

impl Record for CampaignResponse {
    fn to_json(&self) -> Value {
        json!({ "campaign": {
            "header": header_json(self.header()),
            "leader": self.leader().map_or(Value::Null, leader_key_json),
        }})
    }
}

impl Record for ProclaimResponse {
    fn to_json(&self) -> Value {
        json!({ "proclaim": { "header": header_json(self.header()) } })
    }
}

impl Record for LeaderResponse {
    fn to_json(&self) -> Value {
        json!({ "leader": {
            "header": header_json(self.header()),
            "kv": self.kv().map_or(Value::Null, kv_json),
        }})
    }
}

impl Record for ResignResponse {
    fn to_json(&self) -> Value {
        json!({ "resign": { "header": header_json(self.header()) } })
    }
}

/// One watch event: its type, every field of its kv and of its prev_kv.
pub fn watch_event_json(event: &etcd_client::Event) -> Value {
    json!({
        "type": format!("{:?}", event.event_type()),
        "kv": event.kv().map_or(Value::Null, kv_json),
        "prev_kv": event.prev_kv().map_or(Value::Null, kv_json),
    })
}

/// Every field etcd-client exposes of a watch response (it has no accessor for `fragment`).
/// The watch ID is recorded as-is: both servers number the watchers of a stream from 0.
impl Record for WatchResponse {
    fn to_json(&self) -> Value {
        let events: Vec<Value> = self.events().iter().map(watch_event_json).collect();
        json!({ "watch": {
            "header": header_json(self.header()),
            "watch_id": self.watch_id(),
            "created": self.created(),
            "canceled": self.canceled(),
            "compact_revision": self.compact_revision(),
            "cancel_reason": self.cancel_reason(),
            "events": events,
        }})
    }
}

/// The next message of a watch stream, waiting at most [`WATCH_MESSAGE_TIMEOUT`]. Anything but
/// a message (time-out, end of stream, error) comes back as a recordable `Err`.
pub async fn next_watch_message(stream: &mut WatchStream) -> Result<WatchResponse, Value> {
    match tokio::time::timeout(WATCH_MESSAGE_TIMEOUT, stream.message()).await {
        Ok(Ok(Some(response))) => Ok(response),
        Ok(Ok(None)) => Err(json!({ "watch stream": "ended" })),
        Ok(Err(error)) => Err(error_json(&error)),
        Err(_) => Err(json!({
            "watch stream": format!("no message within {WATCH_MESSAGE_TIMEOUT:?}")
        })),
    }
}

/// The masked results of one run of a scenario, step by step.
#[derive(Debug, Default)]
pub struct Recorder {
    pub(crate) steps: Vec<(String, Value)>,
}

impl Recorder {
    /// Records the response or the error under `label` and hands the response back, so a
    /// scenario can also use it (for example to read a revision).
    pub fn record<T: Record>(
        &mut self,
        label: impl Into<String>,
        result: Result<T, EtcdError>,
    ) -> Option<T> {
        match result {
            Ok(response) => {
                self.note(label, response.to_json());
                Some(response)
            }
            Err(error) => {
                self.note(label, error_json(&error));
                None
            }
        }
    }

    /// Records an error by its gRPC code only, for errors whose message is the gRPC library's
    /// own text (grpc-go's and tonic's differ and no client matches on them).
    pub fn record_code_only<T: Record>(
        &mut self,
        label: impl Into<String>,
        result: Result<T, EtcdError>,
    ) -> Option<T> {
        match result {
            Ok(response) => {
                self.note(label, response.to_json());
                Some(response)
            }
            Err(EtcdError::GRpcStatus(status)) => {
                self.note(
                    label,
                    json!({ "error": { "code": format!("{:?}", status.code()) } }),
                );
                None
            }
            Err(error) => {
                self.note(label, error_json(&error));
                None
            }
        }
    }

    /// Waits (bounded, [`next_watch_message`]) for the next message of `stream` and records it,
    /// or records why there was none.
    pub async fn record_watch(
        &mut self,
        label: impl Into<String>,
        stream: &mut WatchStream,
    ) -> Option<WatchResponse> {
        match next_watch_message(stream).await {
            Ok(response) => {
                self.note(label, response.to_json());
                Some(response)
            }
            Err(why) => {
                self.note(label, why);
                None
            }
        }
    }

    /// Records a fact the scenario relies on and asserts it, so that a fact false on both
    /// servers fails instead of agreeing.
    #[allow(dead_code)]
    pub fn fact(&mut self, label: impl Into<String>, holds: bool) {
        let label = label.into();
        assert!(holds, "expected to hold: {label}");
        self.note(label, Value::Bool(holds));
    }

    /// Records an arbitrary value.
    pub fn note(&mut self, label: impl Into<String>, value: Value) {
        self.steps.push((label.into(), value));
    }

    pub fn steps(&self) -> &[(String, Value)] {
        &self.steps
    }
}
