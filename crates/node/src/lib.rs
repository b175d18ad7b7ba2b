//! One leasehold member as a library: etcd's server flags ([`NodeConfig`]), the identity etcd
//! derives from them, and [`Node::start`], which opens the replica (redb + openraft) and serves
//! clients and peers on listeners the caller bound, until the caller's shutdown future
//! completes or storage fails. The `leasehold` binary and the test kit's in-process cluster are
//! its two callers.
//!
//! ```text
//! NodeConfig ──> Listeners::bind ──> Node::start(config, listeners, shutdown)
//!                                      ├─ Replica (raft)      ├─ client server (server)
//!                                      ├─ peer server (peer)  └─ lease expiry driver (server)
//!                                   Node::wait ──> Ok on shutdown, Err when storage failed
//! ```
//!
//! **Architecture Invariant:** this crate wires; it has no behaviour of its own. It never
//! parses a client request or touches storage except through `Replica`.

mod config;
mod node;

pub use config::{Identity, NodeConfig, parse_duration};
pub use node::{Listeners, Node};
