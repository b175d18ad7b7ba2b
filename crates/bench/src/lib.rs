//! `leasehold bench`: load an etcd-compatible endpoint through the public v3 API and report
//! throughput and latency percentiles. It speaks only the wire protocol (our own generated
//! stubs), so the same run works against etcd and leasehold for side-by-side ratios.
//!
//! Each workload is one type implementing [`Workload`]: the closed-loop request workloads in
//! `closed_loop` (one client type each, driven the same way), and the workloads with their own
//! shape (`keepalive --leases`, `list-paged`, `put-during-list`, `watch-latency`, `expiry-lag`, `expiry-storm`, `lease-memory`) in their own
//! modules. Every run is bounded: `--total` requests, and at most `--timeout-secs` of wall time.

use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, Subcommand, ValueEnum};
use hdrhistogram::Histogram;
use leasehold_api::etcdserverpb::{
    LeaseGrantRequest, PutRequest, StatusRequest, WatchCreateRequest, WatchRequest, WatchResponse,
    kv_client::KvClient, lease_client::LeaseClient, maintenance_client::MaintenanceClient,
    watch_client::WatchClient, watch_request,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

mod closed_loop;
mod expiry_lag;
mod expiry_storm;
mod get_during_put;
mod keepalive;
mod lease_memory;
mod list_paged;
mod put_during_compact;
mod put_during_list;
mod watch_latency;

use closed_loop::{LeaseGrant, LeaseKeepalive, LeaseTimetolive, Put, PutWithLease, Range, TxnPut};
use expiry_lag::ExpiryLag;
use expiry_storm::ExpiryStorm;
use get_during_put::GetDuringPut;
use lease_memory::LeaseMemory;
use list_paged::ListPaged;
use put_during_compact::PutDuringCompact;
use put_during_list::PutDuringList;
use watch_latency::WatchLatency;

/// A request that takes longer than this counts as an error (and the run goes on).
const OP_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    workload: WorkloadArgs,
    /// Comma-separated gRPC endpoints; connections are spread over them.
    #[arg(long, global = true, default_value = "http://127.0.0.1:2379")]
    endpoints: String,
    /// Number of gRPC connections.
    #[arg(long, global = true, default_value_t = 1)]
    conns: usize,
    /// Number of concurrent clients (each waits for its reply before sending again).
    #[arg(long, global = true, default_value_t = 1)]
    clients: usize,
    /// Total number of requests.
    #[arg(long, global = true, default_value_t = 10_000)]
    total: u64,
    /// Run for this many seconds instead of a fixed `--total` (still bounded by
    /// `--timeout-secs`).
    #[arg(long, global = true)]
    duration: Option<u64>,
    /// Send only to the endpoint(s) of the current leader (asked with Maintenance.Status).
    #[arg(long, global = true)]
    target_leader: bool,
    /// Stop after this many seconds even if `--total` is not reached.
    #[arg(long, global = true, default_value_t = 300)]
    timeout_secs: u64,
    /// Output format.
    #[arg(short = 'w', long = "write-out", global = true, value_enum, default_value_t = Output::Simple)]
    write_out: Output,
    /// Allow endpoints that are not on loopback.
    #[arg(long, global = true)]
    allow_remote: bool,
}

#[derive(Subcommand, Debug, Clone)]
enum WorkloadArgs {
    Put(Put),
    Range(Range),
    ListPaged(ListPaged),
    PutDuringList(PutDuringList),
    PutDuringCompact(PutDuringCompact),
    GetDuringPut(GetDuringPut),
    TxnPut(TxnPut),
    LeaseTimetolive(LeaseTimetolive),
    LeaseGrant(LeaseGrant),
    LeaseKeepalive(LeaseKeepalive),
    PutWithLease(PutWithLease),
    ExpiryLag(ExpiryLag),
    WatchLatency(WatchLatency),
    ExpiryStorm(ExpiryStorm),
    LeaseMemory(LeaseMemory),
}

/// A `leasehold bench` workload.
trait Workload {
    /// The subcommand's name, as reports show it.
    const NAME: &'static str;

    /// Runs the workload against `run`'s connections, within its bounds.
    fn run(&self, run: &Run) -> impl Future<Output = anyhow::Result<Report>>;
}

/// What every workload gets: its connections and the run's bounds.
#[derive(Debug)]
struct Run {
    channels: Vec<Channel>,
    /// The endpoint each of `channels` is connected to, in the same order.
    urls: Vec<String>,
    clients: usize,
    /// `--total`: requests, or leases, or puts, as the workload counts.
    total: u64,
    /// `--duration`: run this long instead of until `total`.
    duration: Option<Duration>,
    /// `--timeout-secs`: no run takes longer.
    timeout: Duration,
}

impl Run {
    /// How long the run may go on.
    fn bound(&self) -> Duration {
        self.duration.unwrap_or(self.timeout).min(self.timeout)
    }

    /// How many requests to issue: `--total`, or no limit when the run is timed.
    fn request_limit(&self) -> u64 {
        if self.duration.is_some() {
            u64::MAX
        } else {
            self.total
        }
    }
}

pub(crate) fn non_empty(s: &str) -> Result<String, String> {
    if s.is_empty() {
        Err("must not be empty".into())
    } else {
        Ok(s.to_owned())
    }
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Output {
    Simple,
    Json,
}

/// What one run measured.
#[derive(Debug)]
pub struct Report {
    pub workload: &'static str,
    pub requests: u64,
    pub errors: u64,
    pub elapsed: Duration,
    pub latency_us: Histogram<u64>,
    /// Workload-specific figures (expiry-storm's lags).
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Report {
    pub fn throughput(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn ms(&self, quantile: f64) -> f64 {
        self.latency_us.value_at_quantile(quantile) as f64 / 1000.0
    }

    fn json(&self, args: &BenchArgs) -> serde_json::Value {
        let mut out = serde_json::json!({
            "workload": self.workload,
            "clients": args.clients,
            "conns": args.conns,
            "requests": self.requests,
            "errors": self.errors,
            "duration_s": self.elapsed.as_secs_f64(),
            "throughput_per_s": self.throughput(),
            "p50_ms": self.ms(0.50),
            "p90_ms": self.ms(0.90),
            "p99_ms": self.ms(0.99),
            "p999_ms": self.ms(0.999),
            "max_ms": self.latency_us.max() as f64 / 1000.0,
        });
        if let Some(obj) = out.as_object_mut() {
            obj.extend(self.extra.clone());
        }
        out
    }
}

/// Refuses non-loopback endpoints unless the user insists: a benchmark is a load test.
fn check_endpoints(endpoints: &[String], allow_remote: bool) -> anyhow::Result<()> {
    for e in endpoints {
        let host = e
            .trim_start_matches("http://")
            .rsplit_once(':')
            .map(|(h, _)| h.trim_matches(['[', ']']))
            .unwrap_or("");
        let loopback =
            host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
        if !loopback && !allow_remote {
            bail!("endpoint {e} is not on loopback; pass --allow-remote to load it anyway");
        }
    }
    Ok(())
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let report = execute(&args).await?;
    match args.write_out {
        Output::Json => println!("{}", report.json(&args)),
        Output::Simple => {
            println!("Summary ({}):", report.workload);
            println!(
                "  Requests:\t{} ({} errors)",
                report.requests, report.errors
            );
            println!("  Total:\t{:.4} secs.", report.elapsed.as_secs_f64());
            println!("  Requests/sec:\t{:.1}", report.throughput());
            for (name, q) in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999)] {
                println!("  {name}:\t{:.3} ms", report.ms(q));
            }
            println!("  max:\t{:.3} ms", report.latency_us.max() as f64 / 1000.0);
            for (k, v) in &report.extra {
                println!("  {k}:\t{v}");
            }
        }
    }
    Ok(())
}

pub async fn execute(args: &BenchArgs) -> anyhow::Result<Report> {
    let endpoints: Vec<String> = args
        .endpoints
        .split(',')
        .map(|s| s.trim().to_owned())
        .collect();
    check_endpoints(&endpoints, args.allow_remote)?;
    if args.clients == 0 || args.conns == 0 {
        bail!("--clients and --conns must be at least 1");
    }
    let endpoints = if args.target_leader {
        leader_endpoints(&endpoints).await?
    } else {
        endpoints
    };
    let mut channels: Vec<Channel> = Vec::new();
    let mut urls = Vec::new();
    for i in 0..args.conns {
        let url = &endpoints[i % endpoints.len()];
        channels.push(connect(url).await?);
        urls.push(url.clone());
    }
    let run = Run {
        channels,
        urls,
        clients: args.clients,
        total: args.total,
        duration: args.duration.map(Duration::from_secs),
        timeout: Duration::from_secs(args.timeout_secs),
    };
    match &args.workload {
        WorkloadArgs::Put(w) => w.run(&run).await,
        WorkloadArgs::Range(w) => w.run(&run).await,
        WorkloadArgs::ListPaged(w) => w.run(&run).await,
        WorkloadArgs::PutDuringList(w) => w.run(&run).await,
        WorkloadArgs::PutDuringCompact(w) => w.run(&run).await,
        WorkloadArgs::GetDuringPut(w) => w.run(&run).await,
        WorkloadArgs::TxnPut(w) => w.run(&run).await,
        WorkloadArgs::LeaseTimetolive(w) => w.run(&run).await,
        WorkloadArgs::LeaseGrant(w) => w.run(&run).await,
        WorkloadArgs::LeaseKeepalive(w) => w.run(&run).await,
        WorkloadArgs::PutWithLease(w) => w.run(&run).await,
        WorkloadArgs::ExpiryLag(w) => w.run(&run).await,
        WorkloadArgs::WatchLatency(w) => w.run(&run).await,
        WorkloadArgs::ExpiryStorm(w) => w.run(&run).await,
        WorkloadArgs::LeaseMemory(w) => w.run(&run).await,
    }
}

/// One connection to `url`, as every workload makes them.
async fn connect(url: &str) -> anyhow::Result<Channel> {
    Endpoint::from_shared(url.to_owned())?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .with_context(|| format!("connect to {url}"))
}

/// A progress line on stderr while the run goes (only when stderr is a terminal).
async fn show_progress(issued: Arc<AtomicU64>, total: u64, deadline: Instant) {
    use std::io::{IsTerminal, Write};
    if !std::io::stderr().is_terminal() {
        return;
    }
    let started = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let done = issued.load(Ordering::Relaxed);
        let line = if total == u64::MAX {
            let left = deadline.saturating_duration_since(Instant::now()).as_secs();
            format!("{done} requests, {left} s left")
        } else {
            let pct = done.min(total) * 100 / total.max(1);
            format!("{}/{total} ({pct}%)", done.min(total))
        };
        let rate = done as f64 / started.elapsed().as_secs_f64().max(1e-9);
        eprint!("\r  {line}, {rate:.0}/s   ");
        let _ = std::io::stderr().flush();
    }
}

/// The endpoints whose member is the leader, asked of each endpoint with Maintenance.Status.
async fn leader_endpoints(endpoints: &[String]) -> anyhow::Result<Vec<String>> {
    let mut leaders = Vec::new();
    for e in endpoints {
        let channel = Endpoint::from_shared(e.clone())?
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .with_context(|| format!("connect to {e}"))?;
        let status = MaintenanceClient::new(channel)
            .status(StatusRequest {})
            .await?
            .into_inner();
        if status.header.is_some_and(|h| h.member_id == status.leader) {
            leaders.push(e.clone());
        }
    }
    if leaders.is_empty() {
        bail!("--target-leader: no endpoint is the leader");
    }
    Ok(leaders)
}

/// Opens a watch stream with one watcher and waits for it to be created. The create request is
/// queued before the stream opens: etcd answers a stream's headers with its first response. The
/// sender must be kept alive as long as the stream is read.
async fn open_watch(
    channel: Channel,
    create: WatchCreateRequest,
) -> anyhow::Result<(mpsc::Sender<WatchRequest>, tonic::Streaming<WatchResponse>)> {
    let (tx, rx) = mpsc::channel(1);
    tx.send(WatchRequest {
        request_union: Some(watch_request::RequestUnion::CreateRequest(create)),
    })
    .await?;
    let mut client = WatchClient::new(channel);
    let mut stream = tokio::time::timeout(OP_TIMEOUT, client.watch(ReceiverStream::new(rx)))
        .await??
        .into_inner();
    let created = tokio::time::timeout(OP_TIMEOUT, stream.message()).await??;
    anyhow::ensure!(
        created.is_some_and(|r| r.created),
        "the watch was not created"
    );
    Ok((tx, stream))
}

/// Puts per txn while filling a prefix (within etcd's default `--max-txn-ops` of 128).
const FILL_BATCH: u64 = 100;

/// Writes objects `0..objects` (`key(i)`, each with `value`) in txns of [`FILL_BATCH`] puts:
/// what the LIST workloads read.
async fn fill_objects(
    kv: &mut KvClient<Channel>,
    objects: u64,
    value: &[u8],
    key: impl Fn(u64) -> Vec<u8>,
) -> anyhow::Result<()> {
    use leasehold_api::etcdserverpb::{RequestOp, TxnRequest, request_op};
    for first in (0..objects).step_by(FILL_BATCH as usize) {
        let success = (first..(first + FILL_BATCH).min(objects))
            .map(|i| RequestOp {
                request: Some(request_op::Request::RequestPut(PutRequest {
                    key: key(i),
                    value: value.to_vec(),
                    ..Default::default()
                })),
            })
            .collect();
        kv.txn(TxnRequest {
            success,
            ..Default::default()
        })
        .await?;
    }
    Ok(())
}

/// Grants a lease of `ttl_secs` and puts `key` attached to it; returns the lease id.
async fn grant_with_key(
    lease: &mut LeaseClient<Channel>,
    kv: &mut KvClient<Channel>,
    ttl_secs: i64,
    key: Vec<u8>,
) -> Result<i64, tonic::Status> {
    let id = lease
        .lease_grant(LeaseGrantRequest {
            ttl: ttl_secs,
            id: 0,
        })
        .await?
        .into_inner()
        .id;
    kv.put(PutRequest {
        key,
        lease: id,
        ..Default::default()
    })
    .await?;
    Ok(id)
}

/// One put of `value` at `key`, its time recorded in `latency_us` when it is answered within
/// [`OP_TIMEOUT`]: its answer, or `None` when it failed or timed out (the caller counts those).
/// Adds `{name}_p50_ms` (and so on, one per quantile in `quantiles`) and `{name}_max_ms` from
/// a histogram of microseconds to a report's extra figures.
fn insert_latencies(
    extra: &mut serde_json::Map<String, serde_json::Value>,
    name: &str,
    us: &Histogram<u64>,
    quantiles: &[(&str, f64)],
) {
    let ms = |us: u64| us as f64 / 1000.0;
    for (label, q) in quantiles {
        extra.insert(
            format!("{name}_{label}_ms"),
            ms(us.value_at_quantile(*q)).into(),
        );
    }
    extra.insert(format!("{name}_max_ms"), ms(us.max()).into());
}

async fn timed_put(
    kv: &mut KvClient<Channel>,
    key: &[u8],
    value: &[u8],
    latency_us: &mut Histogram<u64>,
) -> Option<leasehold_api::etcdserverpb::PutResponse> {
    let t = Instant::now();
    let put = kv.put(PutRequest {
        key: key.to_vec(),
        value: value.to_vec(),
        ..Default::default()
    });
    let answer = tokio::time::timeout(OP_TIMEOUT, put).await.ok()?.ok()?;
    let _ = latency_us.record(t.elapsed().as_micros() as u64);
    Some(answer.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct P {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn parse(args: &[&str]) -> BenchArgs {
        use clap::Parser;
        P::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
            .unwrap()
            .bench
    }

    #[test]
    fn workload_flags_parse() {
        let a = parse(&[
            "--clients",
            "64",
            "--conns",
            "8",
            "txn-put",
            "--txn-ops",
            "4",
            "-w",
            "json",
        ]);
        assert_eq!((a.clients, a.conns, a.write_out), (64, 8, Output::Json));
        assert!(matches!(&a.workload, WorkloadArgs::TxnPut(w) if w.txn_ops == 4));
        let a = parse(&[
            "expiry-storm",
            "--ttl-secs",
            "3",
            "--total",
            "10000",
            "--duration",
            "5",
        ]);
        assert!(matches!(a.workload, WorkloadArgs::ExpiryStorm(_)));
        assert_eq!((a.total, a.duration), (10_000, Some(5)));
        assert!(<P as clap::Parser>::try_parse_from(["bench", "no-such-workload"]).is_err());
    }

    #[test]
    fn bad_workload_arguments_are_refused_not_panicked_on() {
        for args in [
            &["put", "--key-space-size", "0"][..],
            &["put", "--key-size", "0"],
            &["txn-put", "--txn-ops", "0"],
            &["range", "--consistency", "x"],
            &["expiry-storm", "--prefix", ""],
            &["lease-keepalive", "--leases", "10", "--window", "0"],
            &["lease-keepalive", "--window", "8"],
        ] {
            assert!(
                <P as clap::Parser>::try_parse_from(
                    std::iter::once("bench").chain(args.iter().copied())
                )
                .is_err(),
                "{args:?} was accepted"
            );
        }
    }

    #[test]
    fn keys_fill_the_key_space() {
        let a = parse(&["put", "--key-size", "4", "--key-space-size", "10"]);
        let WorkloadArgs::Put(put) = a.workload else {
            panic!()
        };
        assert_eq!(put.keys.key(7), b"0007");
        assert_eq!(put.keys.key(17), b"0007", "modulo the key space");
    }

    #[test]
    fn only_loopback_without_the_flag() {
        let e = |s: &str| vec![s.to_string()];
        assert!(check_endpoints(&e("http://127.0.0.1:2379"), false).is_ok());
        assert!(check_endpoints(&e("http://localhost:2379"), false).is_ok());
        assert!(check_endpoints(&e("http://[::1]:2379"), false).is_ok());
        assert!(check_endpoints(&e("http://10.0.0.1:2379"), false).is_err());
        assert!(check_endpoints(&e("http://10.0.0.1:2379"), true).is_ok());
    }

    #[test]
    fn percentiles_come_from_the_samples() {
        let mut h = Histogram::<u64>::new(3).unwrap();
        for v in 1..=1000u64 {
            h.record(v * 1000).unwrap();
        }
        let r = Report {
            workload: "put",
            requests: 1000,
            errors: 0,
            elapsed: Duration::from_secs(2),
            latency_us: h,
            extra: serde_json::Map::new(),
        };
        assert!((r.ms(0.5) - 500.0).abs() < 1.0);
        assert!((r.ms(0.99) - 990.0).abs() < 1.0);
        assert!((r.throughput() - 500.0).abs() < 1e-9);
    }
}
