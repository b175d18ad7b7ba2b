//! The bbolt crate's integration tests, one binary: round trips through its writer and reader,
//! corrupt files, and Go's bbolt (through etcdctl) as the oracle.

#[allow(dead_code)]
mod common;
mod corrupt;
mod etcd_oracle;
mod roundtrip;
