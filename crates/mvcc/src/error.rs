use serde::{Deserialize, Serialize};

/// Why the store refused a request. Every variant is something a client can cause; the gRPC edge
/// maps each to etcd's status code and message. Nothing here means "this node must stop": the
/// store has no I/O.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum Error {
    #[error("mvcc: required revision has been compacted")]
    Compacted,
    #[error("mvcc: required revision is a future revision")]
    FutureRevision,
    /// `ignore_value` / `ignore_lease` on a key that does not exist.
    #[error("etcdserver: key not found")]
    KeyNotFound,
    #[error("etcdserver: requested lease not found")]
    LeaseNotFound,
}
