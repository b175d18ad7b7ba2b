//! One leasehold member as a library: etcd's server flags ([`NodeConfig`]; also read from
//! `ETCD_*` variables or etcd's YAML config file, [`NodeConfig::from_sources`]), the identity etcd
//! derives from them, and [`Node::start`], which opens the replica (redb + the raft-rs core) and serves
//! clients and peers on listeners the caller bound, until the caller's shutdown future
//! completes or storage fails. The `leasehold` binary and the test kit's in-process cluster are
//! its two callers.
//!
//! ```text
//! flags, ETCD_* or --config-file ──> NodeConfig::from_sources ──> NodeConfig (+ notices to log)
//! NodeConfig ──> Listeners::bind ──> Node::start(config, listeners, shutdown)
//!                                      ├─ Replica (raft)      ├─ client server (server)
//!                                      ├─ peer server (peer)  └─ lease expiry driver (server)
//!                                   Node::wait ──> Ok on shutdown, Err when storage failed
//! ```
//!
//! **Architecture Invariant:** this crate wires; it has no behaviour of its own. It never
//! parses a client request or touches storage except through `Replica`, but for the data dir's
//! `member-ids` (`member_ids.rs`), which names the member before the replica opens.

mod config;
mod inert;
mod member_ids;
mod node;
mod sources;
mod tls;
mod transport;
mod values;

pub use config::{
    INITIAL_ADVERTISE_PEER_URLS_DEFAULT, INITIAL_CLUSTER_TOKEN_DEFAULT, Identity, ListenAddr,
    ListenUrl, LogFormat, LogLevel, LogTarget, NodeConfig,
};
pub use inert::InertFlags;
pub use leasehold_server::ETCD_API_VERSION;
pub use member_ids::write_for as write_member_ids;
pub use node::{ClientListener, Listeners, Node};
pub use sources::{Notice, NoticeLevel, Resolved, normalize_args};
pub use tls::{ClientTls, PeerTls, TlsFlags};
pub use values::parse_duration;
