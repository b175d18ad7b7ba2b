//! Generates the etcd v3 wire types and gRPC stubs from `proto/` with protox
//! (pure Rust, no `protoc` needed) and tonic-prost-build.

const PROTOS: [&str; 6] = [
    "proto/mvccpb/kv.proto",
    "proto/authpb/auth.proto",
    "proto/etcdserverpb/rpc.proto",
    "proto/v3lockpb/v3lock.proto",
    "proto/v3electionpb/v3election.proto",
    "proto/leaseholdpeerpb/peer.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fds = protox::compile(PROTOS, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .generate_default_stubs(true)
        .include_file("_includes.rs")
        .compile_fds(fds)?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
