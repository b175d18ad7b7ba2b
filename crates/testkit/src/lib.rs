//! The test kit: real `leasehold` and real `etcd` processes on loopback ([`process`]), members
//! started in-process without a process ([`inprocess`]), the differential machinery that runs one
//! scenario against both servers and compares the results ([`differential`], [`record`],
//! [`etcdctl`]), network namespaces for partition tests ([`netns`]), a linearizability
//! checker ([`history`]) and headless Chromium for the dashboard ([`browser`]).
//!
//! Invariants the harness keeps, so that a test can never hang CI or leak a process:
//! - every server binds `127.0.0.1` on ports reserved by [`free_ports`] (below the ephemeral
//!   range, locked per port across test processes), never on a port 0 picked and released;
//! - every wait is bounded ([`READY_TIMEOUT`], [`STOP_TIMEOUT`], [`ETCDCTL_TIMEOUT`],
//!   [`REQUEST_TIMEOUT`], [`SCENARIO_TIMEOUT`]) and panics with the server's log when exceeded;
//! - a [`Server`] SIGKILLs and reaps its process on drop, also while a test unwinds, and then
//!   prints the tail of the process's log so the failure explains itself.
//!
//! Switch: `LEASEHOLD_DIFF_AGAINST_ETCD=1` starts real etcd wherever a test asks for leasehold.
//! Running the suite that way checks the tests themselves (a differential scenario must pass
//! etcd-vs-etcd before it says anything about leasehold).
//!
//! `LEASEHOLD_DIFF_DUMP=<dir>` writes every differential recording there; `LEASEHOLD_TEST_KEEP=1`
//! keeps the log and data dir of every server of a failed test.
//!
//! Real etcd comes from Debian's `etcd-server` and `etcd-client` packages (3.4); the README's
//! test script installs them. A missing `etcd` is a loud failure, never a silent skip.

pub mod browser;
pub mod certs;
pub mod differential;
pub mod etcdctl;
pub use leasehold_history as history;
pub mod http;
pub mod inprocess;
pub mod netns;
pub mod ports;
pub mod process;
pub mod prometheus;
pub mod record;
pub mod shortcuts;
pub mod snapshots;

pub use differential::*;
pub use etcdctl::*;
pub use http::{curl, curl_with};
pub use inprocess::InProcessCluster;
pub use ports::*;
pub use process::*;
pub use record::*;
pub use shortcuts::*;
pub use snapshots::*;

use std::time::Duration;

/// How long a started server has to answer a Range.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a server has to exit after SIGTERM.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Per-request deadline of every client the harness hands out.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one `etcdctl` invocation may take.
pub const ETCDCTL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one side of a differential scenario may take.
pub const SCENARIO_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a test waits for the next message of a watch stream.
pub const WATCH_MESSAGE_TIMEOUT: Duration = Duration::from_secs(5);

const READY_POLL_INTERVAL: Duration = Duration::from_millis(50);
const STOP_POLL_INTERVAL: Duration = Duration::from_millis(20);
const LOG_TAIL_BYTES_MAX: usize = 64 * 1024;
/// Values longer than this are recorded as length + hash, so a 2 MiB value does not end up in
/// a diff.
const RECORDED_BYTES_LEN_MAX: usize = 512;

/// `--name` of every server: the same on both sides so that `member list` output compares.
pub const MEMBER_NAME: &str = "node-1";

const AGAINST_ETCD_VAR: &str = "LEASEHOLD_DIFF_AGAINST_ETCD";
/// `LEASEHOLD_BIN=<path>` runs that binary instead of the one cargo built.
const BIN_VAR: &str = "LEASEHOLD_BIN";
const DUMP_VAR: &str = "LEASEHOLD_DIFF_DUMP";
/// `LEASEHOLD_TEST_KEEP=1` keeps a failed test's server dirs (log and data) for inspection.
const KEEP_VAR: &str = "LEASEHOLD_TEST_KEEP";

const MISSING_ETCD: &str = "is not on PATH. The end-to-end tests compare leasehold with real etcd \
     3.4 (Debian packages etcd-server and etcd-client): run the test script described in \
     README.md, which installs them, or `apt-get install etcd-server etcd-client`.";
