//! leasehold's end-to-end tests, one binary: each module starts real `leasehold` processes (and,
//! for the differential ones, a real etcd, etcdctl, python-etcd3 or Chromium) and talks to them as
//! users do. One binary links the whole stack once instead of once per file; select a module with
//! `cargo test -p leasehold --test e2e <module>::`.

mod alarms;
mod answers;
mod auth;
mod auto_compaction;
mod bench;
mod cluster;
mod cluster_id;
mod cluster_maintenance;
mod corruption;
mod crash;
mod ctl;
mod dashboard;
mod defrag;
mod disk_full;
mod etcd_flags;
mod etcdctl;
mod etcdctl_url_endpoints;
mod examples;
mod failover_leases;
mod gateway;
mod graceful_stop;
mod hashkv;
mod http_endpoints;
mod kv_differential;
mod lease_differential;
mod lease_etcdctl;
mod lease_permissions;
mod lease_restart;
mod linearizability;
mod lock_election_differential;
mod lock_etcdctl;
mod lock_safety;
mod members;
mod metrics;
mod move_leader;
mod partition;
mod python_client;
mod restart;
mod snapshot;
mod tls;
mod watch_differential;
mod watch_etcdctl;
mod watch_scale;
