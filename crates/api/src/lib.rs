//! The etcd v3 wire types for leasehold.
//!
//! This crate owns leasehold's own `.proto` description of the etcd v3 gRPC
//! API (packages `etcdserverpb`, `mvccpb`, `authpb`, `v3lockpb` and
//! `v3electionpb`, wire-compatible with etcd 3.5), leasehold's own peer
//! transport (`leaseholdpeerpb`), and the prost/tonic code generated from them. It contains no logic and must never depend on any
//! other leasehold crate.

#[allow(
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
    missing_docs,
    unreachable_pub,
    rustdoc::all
)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/_includes.rs"));
}

pub use generated::*;
