use serde::{Deserialize, Serialize};

/// Why the store refused a request. Every variant but [`Error::Unreadable`] is something a client
/// can cause; the gRPC edge maps each to etcd's status code and message.
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
    /// A released value could not be read back from the caller's [`crate::ValueSource`]: the
    /// member's own storage failed, which no client caused. A write that meets it must not be
    /// taken as answered (the store may be part-way through it): the member stops.
    #[error("etcdserver: a stored value could not be read: {0}")]
    Unreadable(String),
}
