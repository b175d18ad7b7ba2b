//! Generates the etcd v3 wire types and gRPC stubs from `proto/` with protox (pure Rust, no
//! `protoc` needed) and tonic-prost-build, and, from the same descriptor set, the JSON mapping
//! of etcd's packages with pbjson-build (serde impls, as etcd's grpc-gateway prints them).

use prost::Message as _;

const PROTOS: [&str; 7] = [
    "proto/mvccpb/kv.proto",
    "proto/leasepb/lease.proto",
    "proto/authpb/auth.proto",
    "proto/etcdserverpb/rpc.proto",
    "proto/v3lockpb/v3lock.proto",
    "proto/v3electionpb/v3election.proto",
    "proto/leaseholdpeerpb/peer.proto",
];

/// The packages the JSON gateway speaks (leasehold's own peer protocol has no JSON form).
const JSON_PACKAGES: [&str; 5] = [
    ".mvccpb",
    ".authpb",
    ".etcdserverpb",
    ".v3lockpb",
    ".v3electionpb",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fds = protox::compile(PROTOS, ["proto"])?;
    let descriptors = fds.encode_to_vec();
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .generate_default_stubs(true)
        // tonic-prost's codec, with an encoder that reserves each message's length first.
        .codec_path("crate::codec::SizedCodec")
        // A key-value's value is shared bytes, so an answer carries the store's own values
        // (reference counts) into the encoder instead of a copy of each.
        .bytes(".mvccpb.KeyValue.value")
        .compile_fds(fds)?;
    // etcd's gateway marshals with the proto field names (`cluster_id`, `TTL`, `dbSize`),
    // omits zero values, prints enums by name and ignores fields it does not know.
    pbjson_build::Builder::new()
        .register_descriptors(&descriptors)?
        .preserve_proto_field_names()
        .ignore_unknown_fields()
        .build(&JSON_PACKAGES)?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
