//! The etcd v3 wire types for leasehold.
//!
//! This crate owns leasehold's own `.proto` description of the etcd v3 gRPC
//! API (packages `etcdserverpb`, `mvccpb`, `authpb`, `v3lockpb` and
//! `v3electionpb`, wire-compatible with etcd 3.5, and `leasepb`, the lease record of etcd's
//! snapshot files), leasehold's own peer
//! transport (`leaseholdpeerpb`), and the prost/tonic code generated from them, plus the JSON
//! mapping of etcd's packages (serde `Serialize`/`Deserialize` from pbjson-build: proto field
//! names, int64 as strings, bytes as base64, zero values omitted, as etcd's gateway prints them).
//! It contains no logic and must never depend on any other leasehold crate. Besides the generated code it holds one table of protocol facts,
//! grpc-go's names of the status codes, and the codec the generated stubs use (`codec`).

#[allow(
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
    missing_docs,
    unreachable_pub,
    rustdoc::all
)]
mod generated {
    /// One package: its prost types and tonic stubs, and (`json`) the serde impls pbjson-build
    /// made for them, which must sit in the same module as the types they describe.
    macro_rules! package {
        ($name:ident) => {
            pub mod $name {
                include!(concat!(env!("OUT_DIR"), "/", stringify!($name), ".rs"));
            }
        };
        ($name:ident, json) => {
            pub mod $name {
                include!(concat!(env!("OUT_DIR"), "/", stringify!($name), ".rs"));
                include!(concat!(
                    env!("OUT_DIR"),
                    "/",
                    stringify!($name),
                    ".serde.rs"
                ));
            }
        };
    }
    package!(mvccpb, json);
    package!(authpb, json);
    package!(etcdserverpb, json);
    package!(v3lockpb, json);
    package!(v3electionpb, json);
    package!(leaseholdpeerpb);
    package!(leasepb);
}

pub use generated::*;

pub mod codec;

/// grpc-go's names of the status codes, as etcd's clients print them and grpc-go's Prometheus
/// labels carry them (`Canceled`, not tonic's `Cancelled`). A protocol fact, kept here so the
/// server's metrics and the client commands share one table.
pub fn go_code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}
