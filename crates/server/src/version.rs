//! The etcd release leasehold answers as.

/// The etcd release whose API and rules leasehold follows (Status, `/version`, `--version`);
/// clients compare it to enable features. kube-apiserver trusts watch progress responses from
/// 3.5.13 on (etcd#15220, etcd#17507): leasehold's never run ahead of the events they cover
/// (`watch.rs`). etcd's e2e framework reads it from `--version` to pick flag spellings.
pub const ETCD_API_VERSION: &str = "3.7.3";
