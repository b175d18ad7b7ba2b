//! `leasehold bench`: load an etcd-compatible endpoint through the public v3 API and report
//! throughput and latency percentiles. It speaks only the wire protocol (our own generated
//! stubs), so the same run works against etcd and leasehold for side-by-side ratios.
//!
//! Every run is bounded: `--total` requests, and at most `--timeout-secs` of wall time.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, Subcommand, ValueEnum};
use hdrhistogram::Histogram;
use leasehold_api::etcdserverpb::{
    LeaseGrantRequest, LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseTimeToLiveRequest,
    PutRequest, RangeRequest, RequestOp, StatusRequest, TxnRequest, WatchCreateRequest,
    WatchRequest, WatchResponse, kv_client::KvClient, lease_client::LeaseClient,
    maintenance_client::MaintenanceClient, request_op, watch_client::WatchClient,
    watch_create_request, watch_request,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

mod keepalive;

/// A request that takes longer than this counts as an error (and the run goes on).
const OP_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    workload: Workload,
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
enum Workload {
    /// Puts of fixed-size values.
    Put {
        #[command(flatten)]
        keys: KeySpace,
        /// Use keys in sequence instead of spread over the key space.
        #[arg(long)]
        sequential_keys: bool,
    },
    /// Reads of one key.
    Range {
        #[arg(long, default_value = "bench-key")]
        key: String,
        /// `l` for linearizable, `s` for serializable.
        #[arg(long, default_value = "l", value_parser = ["l", "s"])]
        consistency: String,
    },
    /// Txns of `--txn-ops` puts each (etcd's `benchmark txn-put`).
    TxnPut {
        #[command(flatten)]
        keys: KeySpace,
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
        txn_ops: u64,
    },
    /// TimeToLive with keys: each client grants a lease, attaches `--keys-per-lease` keys and
    /// asks for its time to live (with keys) over and over.
    LeaseTimetolive {
        #[arg(long, default_value_t = 10)]
        keys_per_lease: u64,
    },
    /// Lease grants (TTL 100 s; the leases are left to expire).
    LeaseGrant,
    /// Keepalives. Without `--leases`: each client renews its own lease over its own long-lived
    /// stream, one request in flight at a time. With `--leases N`: etcd's client pattern, `N`
    /// leases spread over `--streams` streams (a stream carries all of its leases' renewals),
    /// each lease renewed again as soon as its answer arrives; reports `leases_lost` (renewals
    /// answered TTL <= 0). Runs for `--duration` seconds, or until `--total` renewals.
    LeaseKeepalive {
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        leases: Option<u64>,
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
        streams: u64,
        /// TTL of the leases the `--leases` mode grants.
        #[arg(long, default_value_t = 60)]
        ttl_secs: i64,
    },
    /// Puts attached to leases: one lease per `--keys-per-lease` keys, granted first.
    PutWithLease {
        #[arg(long, default_value_t = 10)]
        keys_per_lease: u64,
        #[arg(long, default_value_t = 256)]
        val_size: usize,
    },
    /// Expiry lag of sparse leases: `--total` leases granted one after another, `--gap-ms`
    /// apart, one key each; each key is polled from its lease's deadline until it is gone. The
    /// latency histogram is the lag from deadline to delete. Runs with one client.
    ExpiryLag {
        #[arg(long, default_value_t = 2)]
        ttl_secs: i64,
        #[arg(long, default_value_t = 100)]
        gap_ms: u64,
        #[arg(long, default_value = "lag/")]
        prefix: String,
    },
    /// Put-to-event latency: `--watchers` streams each watch one key; one writer puts it
    /// `--total` times, `--interval-ms` apart; every event's delay from its put being sent is
    /// recorded.
    WatchLatency {
        #[arg(long, default_value_t = 100)]
        watchers: usize,
        #[arg(long, default_value_t = 10)]
        interval_ms: u64,
        #[arg(long, default_value = "watch-bench")]
        key: String,
    },
    /// Mass expiry: `--total` leases with one key each and the same TTL, granted by `--clients`
    /// at once, while a watch on the prefix time-stamps every delete; the latency histogram is
    /// the lag from each key's deadline to its delete.
    ExpiryStorm {
        #[arg(long, default_value_t = 3)]
        ttl_secs: i64,
        /// The keys' common prefix (not empty: the storm watches exactly this prefix).
        #[arg(long, default_value = "storm/", value_parser = non_empty)]
        prefix: String,
        /// Give each lease `--ttl-secs` minus the whole seconds the grants have taken so far, so
        /// that every deadline falls in the same second however long granting takes: the
        /// deletes/s figure is then the server's revoke rate, not the grant rate.
        #[arg(long)]
        aligned: bool,
    },
}

/// The keys and values of the put workloads.
#[derive(Args, Debug, Clone)]
struct KeySpace {
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
    key_size: u64,
    #[arg(long, default_value_t = 256)]
    val_size: usize,
    /// Number of distinct keys (random keys are drawn from this space).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    key_space_size: u64,
}

impl KeySpace {
    /// Key number `k` (taken modulo the key space), zero-padded to the key size.
    fn key(&self, k: u64) -> Vec<u8> {
        let width = usize::try_from(self.key_size).unwrap_or(usize::MAX);
        let mut key = format!("{:0width$}", k % self.key_space_size).into_bytes();
        key.truncate(width);
        key
    }

    fn value(&self) -> Vec<u8> {
        vec![b'x'; self.val_size]
    }
}

fn non_empty(s: &str) -> Result<String, String> {
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
    for i in 0..args.conns {
        let url = &endpoints[i % endpoints.len()];
        let ch = Endpoint::from_shared(url.clone())?
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .with_context(|| format!("connect to {url}"))?;
        channels.push(ch);
    }
    let workload = args.workload.clone();
    if let Workload::ExpiryStorm {
        ttl_secs,
        prefix,
        aligned,
    } = &workload
    {
        return expiry_storm(args, &channels, *ttl_secs, prefix, *aligned).await;
    }
    if let Workload::WatchLatency {
        watchers,
        interval_ms,
        key,
    } = &workload
    {
        return watch_latency(args, &channels, *watchers, *interval_ms, key).await;
    }
    if let Workload::ExpiryLag {
        ttl_secs,
        gap_ms,
        prefix,
    } = &workload
    {
        return expiry_lag(args, &channels[0], *ttl_secs, *gap_ms, prefix).await;
    }
    if let Workload::LeaseKeepalive {
        leases: Some(leases),
        streams,
        ttl_secs,
    } = &workload
    {
        let bound = Duration::from_secs(
            args.duration
                .unwrap_or(args.timeout_secs)
                .min(args.timeout_secs),
        );
        let total = if args.duration.is_some() {
            u64::MAX
        } else {
            args.total
        };
        return keepalive::run(
            &channels,
            usize::try_from(*leases)?,
            usize::try_from(*streams)?,
            *ttl_secs,
            total,
            bound,
        )
        .await;
    }
    if let Workload::Range { key, .. } = &workload {
        // Make sure there is something to read.
        KvClient::new(channels[0].clone())
            .put(PutRequest {
                key: key.clone().into_bytes(),
                value: vec![b'v'; 256],
                ..Default::default()
            })
            .await?;
    }
    let issued = Arc::new(AtomicU64::new(0));
    let bound = Duration::from_secs(
        args.duration
            .unwrap_or(args.timeout_secs)
            .min(args.timeout_secs),
    );
    let deadline = Instant::now() + bound;
    let total = if args.duration.is_some() {
        u64::MAX
    } else {
        args.total
    };
    let start = Instant::now();
    let progress = tokio::spawn(show_progress(issued.clone(), total, deadline));
    let mut tasks = Vec::new();
    for c in 0..args.clients {
        let channel = channels[c % channels.len()].clone();
        let issued = issued.clone();
        let workload = workload.clone();
        tasks.push(tokio::spawn(async move {
            let mut hist = Histogram::<u64>::new(3).expect("valid sigfig");
            let mut errors = 0u64;
            let started =
                tokio::time::timeout(OP_TIMEOUT, Actor::new(channel, &workload, c as u64));
            let mut actor = match started.await.map_err(anyhow::Error::from).and_then(|r| r) {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("bench client {c} could not start: {e}");
                    return (hist, 1);
                }
            };
            loop {
                let n = issued.fetch_add(1, Ordering::Relaxed);
                if n >= total || Instant::now() >= deadline {
                    break;
                }
                let t = Instant::now();
                let ok = tokio::time::timeout(OP_TIMEOUT, actor.op(&workload, n)).await;
                if ok == Ok(true) {
                    let _ = hist.record(t.elapsed().as_micros() as u64);
                } else {
                    errors += 1;
                }
            }
            (hist, errors)
        }));
    }
    let mut latency_us = Histogram::<u64>::new(3).expect("valid sigfig");
    let mut errors = 0;
    for t in tasks {
        let (h, e) = t.await?;
        latency_us.add(h)?;
        errors += e;
    }
    let elapsed = start.elapsed();
    progress.abort();
    Ok(Report {
        workload: workload.name(),
        requests: latency_us.len(),
        errors,
        elapsed,
        latency_us,
        extra: serde_json::Map::new(),
    })
}

impl Workload {
    fn name(&self) -> &'static str {
        match self {
            Workload::Put { .. } => "put",
            Workload::Range { .. } => "range",
            Workload::TxnPut { .. } => "txn-put",
            Workload::LeaseTimetolive { .. } => "lease-timetolive",
            Workload::LeaseGrant => "lease-grant",
            Workload::LeaseKeepalive { .. } => "lease-keepalive",
            Workload::PutWithLease { .. } => "put-with-lease",
            Workload::ExpiryStorm { .. } => "expiry-storm",
            Workload::ExpiryLag { .. } => "expiry-lag",
            Workload::WatchLatency { .. } => "watch-latency",
        }
    }
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

/// One bench client's connections and state.
struct Actor {
    kv: KvClient<Channel>,
    lease: LeaseClient<Channel>,
    rng: u64,
    /// For keepalive: this client's lease and its stream.
    keepalive: Option<(
        i64,
        mpsc::Sender<LeaseKeepAliveRequest>,
        tonic::Streaming<LeaseKeepAliveResponse>,
    )>,
    /// For put-with-lease: the lease the next keys attach to; for lease-timetolive: the lease
    /// asked about.
    current_lease: i64,
}

impl Actor {
    async fn new(channel: Channel, workload: &Workload, seed: u64) -> anyhow::Result<Actor> {
        let mut lease = LeaseClient::new(channel.clone());
        let keepalive = if let Workload::LeaseKeepalive { .. } = workload {
            let id = lease
                .lease_grant(LeaseGrantRequest { ttl: 100, id: 0 })
                .await?
                .into_inner()
                .id;
            // Queue the first request before opening the stream: some servers (etcd) send the
            // response headers only with the first response.
            let (tx, rx) = mpsc::channel(1);
            tx.send(LeaseKeepAliveRequest { id }).await?;
            let mut stream = lease
                .lease_keep_alive(ReceiverStream::new(rx))
                .await?
                .into_inner();
            stream.message().await?;
            Some((id, tx, stream))
        } else {
            None
        };
        let mut kv = KvClient::new(channel);
        let mut current_lease = 0;
        if let Workload::LeaseTimetolive { keys_per_lease } = workload {
            current_lease = lease
                .lease_grant(LeaseGrantRequest { ttl: 100, id: 0 })
                .await?
                .into_inner()
                .id;
            for k in 0..*keys_per_lease {
                kv.put(PutRequest {
                    key: format!("ttl-key/{seed}/{k}").into_bytes(),
                    lease: current_lease,
                    ..Default::default()
                })
                .await?;
            }
        }
        Ok(Actor {
            kv,
            lease,
            rng: (seed + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            keepalive,
            current_lease,
        })
    }

    fn next_random(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// Issues request number `n`; true when it succeeded.
    async fn op(&mut self, workload: &Workload, n: u64) -> bool {
        match workload {
            Workload::Put {
                keys,
                sequential_keys,
            } => {
                let k = if *sequential_keys {
                    n
                } else {
                    self.next_random()
                };
                self.kv
                    .put(PutRequest {
                        key: keys.key(k),
                        value: keys.value(),
                        ..Default::default()
                    })
                    .await
                    .is_ok()
            }
            Workload::Range { key, consistency } => self
                .kv
                .range(RangeRequest {
                    key: key.clone().into_bytes(),
                    serializable: consistency == "s",
                    ..Default::default()
                })
                .await
                .is_ok(),
            Workload::TxnPut { keys, txn_ops } => {
                let ops = (0..*txn_ops)
                    .map(|i| {
                        let key = keys.key(n.wrapping_mul(*txn_ops).wrapping_add(i));
                        RequestOp {
                            request: Some(request_op::Request::RequestPut(PutRequest {
                                key,
                                value: keys.value(),
                                ..Default::default()
                            })),
                        }
                    })
                    .collect();
                self.kv
                    .txn(TxnRequest {
                        compare: vec![],
                        success: ops,
                        failure: vec![],
                    })
                    .await
                    .is_ok()
            }
            Workload::LeaseTimetolive { .. } => matches!(
                self.lease
                    .lease_time_to_live(LeaseTimeToLiveRequest { id: self.current_lease, keys: true })
                    .await,
                Ok(r) if r.get_ref().ttl > 0
            ),
            Workload::LeaseGrant => self
                .lease
                .lease_grant(LeaseGrantRequest { ttl: 100, id: 0 })
                .await
                .is_ok(),
            Workload::LeaseKeepalive { .. } => {
                let Some((id, tx, stream)) = &mut self.keepalive else {
                    return false;
                };
                if tx.send(LeaseKeepAliveRequest { id: *id }).await.is_err() {
                    return false;
                }
                matches!(stream.message().await, Ok(Some(r)) if r.ttl > 0)
            }
            Workload::PutWithLease {
                keys_per_lease,
                val_size,
            } => {
                if self.current_lease == 0 || n.is_multiple_of(*keys_per_lease.max(&1)) {
                    match self
                        .lease
                        .lease_grant(LeaseGrantRequest { ttl: 100, id: 0 })
                        .await
                    {
                        Ok(r) => self.current_lease = r.into_inner().id,
                        Err(_) => return false,
                    }
                }
                let key = format!("lease-key/{n:010}").into_bytes();
                self.kv
                    .put(PutRequest {
                        key,
                        value: vec![b'x'; *val_size],
                        lease: self.current_lease,
                        ..Default::default()
                    })
                    .await
                    .is_ok()
            }
            Workload::ExpiryStorm { .. }
            | Workload::ExpiryLag { .. }
            | Workload::WatchLatency { .. } => false,
        }
    }
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

/// Opens `watchers` watch streams on `key`, then puts it `--total` times; records for every
/// event the time from its put being sent to its arrival.
async fn watch_latency(
    args: &BenchArgs,
    channels: &[Channel],
    watchers: usize,
    interval_ms: u64,
    key: &str,
) -> anyhow::Result<Report> {
    let total = args.total;
    let mut arrivals = Vec::new();
    for w in 0..watchers {
        let create = WatchCreateRequest {
            key: key.as_bytes().to_vec(),
            ..Default::default()
        };
        let (tx, mut stream) = open_watch(channels[w % channels.len()].clone(), create).await?;
        arrivals.push(tokio::spawn(async move {
            let _keep_open = tx;
            let mut seen: Vec<(i64, Instant)> = Vec::new();
            while (seen.len() as u64) < total {
                match tokio::time::timeout(OP_TIMEOUT, stream.message()).await {
                    Ok(Ok(Some(resp))) => {
                        let now = Instant::now();
                        seen.extend(
                            resp.events
                                .iter()
                                .filter_map(|e| e.kv.as_ref())
                                .map(|kv| (kv.mod_revision, now)),
                        );
                    }
                    _ => break,
                }
            }
            seen
        }));
    }
    let mut kv = KvClient::new(channels[0].clone());
    let mut sent_at = std::collections::HashMap::new();
    let started = Instant::now();
    for n in 0..total {
        let t = Instant::now();
        let resp = kv
            .put(PutRequest {
                key: key.as_bytes().to_vec(),
                value: n.to_string().into_bytes(),
                ..Default::default()
            })
            .await?;
        let rev = resp.into_inner().header.map_or(0, |h| h.revision);
        sent_at.insert(rev, t);
        tokio::time::sleep(Duration::from_millis(interval_ms)).await;
    }
    let mut latency_us = Histogram::<u64>::new(3).expect("valid sigfig");
    let mut errors = 0u64;
    for a in arrivals {
        let seen = a.await?;
        errors += total.saturating_sub(seen.len() as u64);
        for (rev, at) in seen {
            match sent_at.get(&rev) {
                Some(t) => {
                    let _ = latency_us.record(at.saturating_duration_since(*t).as_micros() as u64);
                }
                None => errors += 1,
            }
        }
    }
    let mut extra = serde_json::Map::new();
    extra.insert("watchers".into(), watchers.into());
    extra.insert("events_expected".into(), (total * watchers as u64).into());
    Ok(Report {
        workload: "watch-latency",
        requests: latency_us.len(),
        errors,
        elapsed: started.elapsed(),
        latency_us,
        extra,
    })
}

/// Grants leases one by one, `gap_ms` apart, each with one key, and measures for each the time
/// from its deadline (taken at the client: grant sent + TTL, an upper bound on the server's
/// deadline... so the lag is an upper bound too) to the first poll that finds its key gone. A key
/// gone before that deadline is an early expiry and counts as an error.
async fn expiry_lag(
    args: &BenchArgs,
    channel: &Channel,
    ttl_secs: i64,
    gap_ms: u64,
    prefix: &str,
) -> anyhow::Result<Report> {
    let mut lease = LeaseClient::new(channel.clone());
    let mut kv = KvClient::new(channel.clone());
    let ttl = Duration::from_secs(u64::try_from(ttl_secs).unwrap_or(0));
    let poll = Duration::from_millis(1);
    let started = Instant::now();
    // Keys with their deadlines, in deadline order.
    let mut pending: std::collections::VecDeque<(Vec<u8>, Instant)> = Default::default();
    let mut latency_us = Histogram::<u64>::new(3).expect("valid sigfig");
    let mut errors = 0;
    let mut next_grant = Instant::now();
    let mut granted = 0;
    let give_up = Instant::now() + Duration::from_secs(args.timeout_secs);
    while (granted < args.total || !pending.is_empty()) && Instant::now() < give_up {
        let now = Instant::now();
        if granted < args.total && now >= next_grant {
            let sent = Instant::now();
            let key = format!("{prefix}{granted:08}").into_bytes();
            grant_with_key(&mut lease, &mut kv, ttl_secs, key.clone()).await?;
            pending.push_back((key, sent + ttl));
            granted += 1;
            next_grant = sent + Duration::from_millis(gap_ms);
            continue;
        }
        if let Some((key, deadline)) = pending.front().cloned() {
            let resp = kv
                .range(RangeRequest {
                    key,
                    count_only: true,
                    ..Default::default()
                })
                .await?;
            let gone = resp.into_inner().count == 0;
            let now = Instant::now();
            if gone {
                if now < deadline {
                    errors += 1;
                } else {
                    let _ = latency_us.record((now - deadline).as_micros() as u64);
                }
                pending.pop_front();
                continue;
            }
        }
        tokio::time::sleep(poll).await;
    }
    errors += pending.len() as u64;
    Ok(Report {
        workload: "expiry-lag",
        requests: latency_us.len(),
        errors,
        elapsed: started.elapsed(),
        latency_us,
        extra: serde_json::Map::new(),
    })
}

/// Grants `--total` leases of `ttl_secs` with one key each while a watch on the prefix
/// time-stamps every DELETE. A key's deadline is taken at the client: its grant was sent, plus the
/// TTL (the server's deadline is no earlier), so a delete before it is an early expiry (a
/// correctness failure) and the lag is an upper bound.
async fn expiry_storm(
    args: &BenchArgs,
    channels: &[Channel],
    ttl_secs: i64,
    prefix: &str,
    aligned: bool,
) -> anyhow::Result<Report> {
    let total = args.total;
    let end = leasehold_mvcc::prefix_range_end(prefix.as_bytes());
    // The watch first, so that no delete can be missed.
    let create = WatchCreateRequest {
        key: prefix.as_bytes().to_vec(),
        range_end: end,
        filters: vec![watch_create_request::FilterType::Noput as i32],
        ..Default::default()
    };
    let (watch_tx, mut events) = open_watch(channels[0].clone(), create).await?;
    let give_up = Duration::from_secs(args.timeout_secs.min(300));
    let deletes = tokio::spawn(async move {
        let _keep_open = watch_tx;
        let mut seen: Vec<(Vec<u8>, Instant)> = Vec::new();
        let stop = Instant::now() + give_up;
        while (seen.len() as u64) < total {
            let left = stop.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, events.message()).await {
                Ok(Ok(Some(resp))) => {
                    let now = Instant::now();
                    seen.extend(
                        resp.events
                            .into_iter()
                            .filter_map(|e| e.kv)
                            .map(|kv| (kv.key, now)),
                    );
                }
                _ => break,
            }
        }
        seen
    });
    // Each key's deadline as the client sees it: its grant sent + its TTL (the server's is no
    // earlier).
    let deadlines = Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
    let issued = Arc::new(AtomicU64::new(0));
    let first_sent = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..args.clients {
        let channel = channels[c % channels.len()].clone();
        let issued = issued.clone();
        let deadlines = deadlines.clone();
        let prefix = prefix.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut lease = LeaseClient::new(channel.clone());
            let mut kv = KvClient::new(channel);
            loop {
                let n = issued.fetch_add(1, Ordering::Relaxed);
                if n >= total {
                    return Ok::<_, tonic::Status>(());
                }
                let key = format!("{prefix}{n:08}").into_bytes();
                let sent = Instant::now();
                let ttl_secs = if aligned {
                    let taken = i64::try_from(sent.duration_since(first_sent).as_secs())
                        .unwrap_or(i64::MAX);
                    ttl_secs.saturating_sub(taken)
                } else {
                    ttl_secs
                };
                if ttl_secs < 2 {
                    return Err(tonic::Status::deadline_exceeded(
                        "--aligned: granting took longer than --ttl-secs allows",
                    ));
                }
                let ttl = Duration::from_secs(u64::try_from(ttl_secs).unwrap_or(0));
                deadlines
                    .lock()
                    .expect("not poisoned")
                    .insert(key.clone(), sent + ttl);
                grant_with_key(&mut lease, &mut kv, ttl_secs, key).await?;
            }
        }));
    }
    let grants = async {
        for t in tasks {
            t.await??;
        }
        Ok::<(), anyhow::Error>(())
    };
    tokio::time::timeout(Duration::from_secs(args.timeout_secs), grants).await??;
    let last_granted = Instant::now();
    let seen = deletes.await?;
    let deadlines = deadlines.lock().expect("not poisoned");
    let earliest_deadline = deadlines.values().min().copied().unwrap_or(first_sent);
    let latest_deadline = deadlines.values().max().copied().unwrap_or(last_granted);
    let mut latency_us = Histogram::<u64>::new(3).expect("valid sigfig");
    let mut early = 0u64;
    let mut early_by_max = Duration::ZERO;
    for (key, at) in &seen {
        let deadline = deadlines.get(key).copied().unwrap_or(first_sent);
        match at.checked_duration_since(deadline) {
            Some(lag) => {
                let _ = latency_us.record(lag.as_micros() as u64);
            }
            None => {
                early += 1;
                early_by_max = early_by_max.max(deadline - *at);
            }
        }
    }
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let signed_ms =
        |a: Option<Instant>, b: Instant| a.map(|a| if a >= b { ms(a - b) } else { -ms(b - a) });
    let first_delete = seen.iter().map(|(_, t)| *t).min();
    let last_delete = seen.iter().map(|(_, t)| *t).max();
    let all_deleted = seen.len() as u64 == total;
    let mut extra = serde_json::Map::new();
    extra.insert("leases".into(), total.into());
    extra.insert("ttl_s".into(), ttl_secs.into());
    extra.insert("aligned".into(), aligned.into());
    extra.insert(
        "deadline_span_ms".into(),
        ms(latest_deadline.saturating_duration_since(earliest_deadline)).into(),
    );
    extra.insert(
        "grant_phase_s".into(),
        (last_granted - first_sent).as_secs_f64().into(),
    );
    extra.insert(
        "first_delete_after_earliest_deadline_ms".into(),
        signed_ms(first_delete, earliest_deadline).into(),
    );
    extra.insert(
        "last_delete_after_latest_deadline_ms".into(),
        signed_ms(last_delete, latest_deadline).into(),
    );
    extra.insert("all_deleted".into(), all_deleted.into());
    extra.insert("early_deletes".into(), early.into());
    extra.insert("early_by_ms_max".into(), ms(early_by_max).into());
    if let (Some(a), Some(b)) = (first_delete, last_delete) {
        let span = (b - a).as_secs_f64().max(1e-3);
        extra.insert("deletes_per_s".into(), (seen.len() as f64 / span).into());
    }
    Ok(Report {
        workload: "expiry-storm",
        requests: latency_us.len(),
        errors: total - seen.len() as u64 + early,
        elapsed: last_granted - first_sent,
        latency_us,
        extra,
    })
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
        assert!(matches!(a.workload, Workload::TxnPut { txn_ops: 4, .. }));
        let a = parse(&[
            "expiry-storm",
            "--ttl-secs",
            "3",
            "--total",
            "10000",
            "--duration",
            "5",
        ]);
        assert!(matches!(
            a.workload,
            Workload::ExpiryStorm { ttl_secs: 3, .. }
        ));
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
        let Workload::Put { keys, .. } = a.workload else {
            panic!()
        };
        assert_eq!(keys.key(7), b"0007");
        assert_eq!(keys.key(17), b"0007", "modulo the key space");
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
