//! The closed-loop workloads: `--clients` clients, each sending its next request as soon as its
//! previous one is answered, until `--total` requests or `--duration`. One type per workload
//! says how a client starts and what request number `n` is ([`Requests`]); [`run`] drives them
//! all the same way.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use leasehold_api::etcdserverpb::{
    LeaseGrantRequest, LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseTimeToLiveRequest,
    PutRequest, RangeRequest, RequestOp, TxnRequest, kv_client::KvClient,
    lease_client::LeaseClient, request_op,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use crate::{OP_TIMEOUT, Report, Run, Workload, keepalive, show_progress};

/// TTL of the leases the closed-loop workloads grant (left to expire).
const LEASE_TTL_SECS: i64 = 100;

/// A closed-loop workload: how one client starts, and its request number `n`.
pub(crate) trait Requests: Clone + Send + Sync + 'static {
    /// One client's connections and state.
    type Client: Send + 'static;

    /// Connects client number `seed` and prepares what its requests need.
    fn start(
        &self,
        channel: Channel,
        seed: u64,
    ) -> impl Future<Output = anyhow::Result<Self::Client>> + Send;

    /// Issues request number `n`; true when it succeeded.
    fn request(&self, client: &mut Self::Client, n: u64) -> impl Future<Output = bool> + Send;
}

/// Runs `workload` with `run.clients` clients until `--total` requests or the run's bound.
pub(crate) async fn run<R: Requests>(
    name: &'static str,
    workload: &R,
    run: &Run,
) -> anyhow::Result<Report> {
    let issued = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + run.bound();
    let total = run.request_limit();
    let start = Instant::now();
    let progress = tokio::spawn(show_progress(issued.clone(), total, deadline));
    let mut tasks = Vec::new();
    for c in 0..run.clients {
        let channel = run.channels[c % run.channels.len()].clone();
        let issued = issued.clone();
        let workload = workload.clone();
        tasks.push(tokio::spawn(async move {
            let mut hist = Histogram::<u64>::new(3).expect("valid sigfig");
            let mut errors = 0u64;
            let started = tokio::time::timeout(OP_TIMEOUT, workload.start(channel, c as u64));
            let mut client = match started.await.map_err(anyhow::Error::from).and_then(|r| r) {
                Ok(client) => client,
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
                let ok = tokio::time::timeout(OP_TIMEOUT, workload.request(&mut client, n)).await;
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
        workload: name,
        requests: latency_us.len(),
        errors,
        elapsed,
        latency_us,
        extra: serde_json::Map::new(),
    })
}

/// The keys and values of the put workloads.
#[derive(Args, Debug, Clone)]
pub struct KeySpace {
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
    pub(crate) fn key(&self, k: u64) -> Vec<u8> {
        let width = usize::try_from(self.key_size).unwrap_or(usize::MAX);
        let mut key = format!("{:0width$}", k % self.key_space_size).into_bytes();
        key.truncate(width);
        key
    }

    fn value(&self) -> Vec<u8> {
        vec![b'x'; self.val_size]
    }
}

/// Puts of fixed-size values.
#[derive(Args, Debug, Clone)]
pub struct Put {
    #[command(flatten)]
    pub(crate) keys: KeySpace,
    /// Use keys in sequence instead of spread over the key space.
    #[arg(long)]
    sequential_keys: bool,
}

/// A put client: its connection and its random key sequence.
pub(crate) struct PutClient {
    kv: KvClient<Channel>,
    rng: u64,
}

impl Requests for Put {
    type Client = PutClient;

    async fn start(&self, channel: Channel, seed: u64) -> anyhow::Result<PutClient> {
        Ok(PutClient {
            kv: KvClient::new(channel),
            rng: (seed + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        })
    }

    async fn request(&self, client: &mut PutClient, n: u64) -> bool {
        let k = if self.sequential_keys {
            n
        } else {
            // xorshift64: cheap, and every client draws its own sequence.
            client.rng ^= client.rng << 13;
            client.rng ^= client.rng >> 7;
            client.rng ^= client.rng << 17;
            client.rng
        };
        client
            .kv
            .put(PutRequest {
                key: self.keys.key(k),
                value: self.keys.value(),
                ..Default::default()
            })
            .await
            .is_ok()
    }
}

impl Workload for Put {
    const NAME: &'static str = "put";

    async fn run(&self, run: &Run) -> anyhow::Result<Report> {
        self::run(Self::NAME, self, run).await
    }
}

/// Reads of one key.
#[derive(Args, Debug, Clone)]
pub struct Range {
    #[arg(long, default_value = "bench-key")]
    key: String,
    /// `l` for linearizable, `s` for serializable.
    #[arg(long, default_value = "l", value_parser = ["l", "s"])]
    consistency: String,
}

impl Requests for Range {
    type Client = KvClient<Channel>;

    async fn start(&self, channel: Channel, _seed: u64) -> anyhow::Result<KvClient<Channel>> {
        Ok(KvClient::new(channel))
    }

    async fn request(&self, kv: &mut KvClient<Channel>, _n: u64) -> bool {
        kv.range(RangeRequest {
            key: self.key.clone().into_bytes(),
            serializable: self.consistency == "s",
            ..Default::default()
        })
        .await
        .is_ok()
    }
}

impl Workload for Range {
    const NAME: &'static str = "range";

    async fn run(&self, run: &Run) -> anyhow::Result<Report> {
        // Make sure there is something to read.
        KvClient::new(run.channels[0].clone())
            .put(PutRequest {
                key: self.key.clone().into_bytes(),
                value: vec![b'v'; 256],
                ..Default::default()
            })
            .await?;
        self::run(Self::NAME, self, run).await
    }
}

/// Txns of `--txn-ops` puts each (etcd's `benchmark txn-put`).
#[derive(Args, Debug, Clone)]
pub struct TxnPut {
    #[command(flatten)]
    keys: KeySpace,
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) txn_ops: u64,
}

impl Requests for TxnPut {
    type Client = KvClient<Channel>;

    async fn start(&self, channel: Channel, _seed: u64) -> anyhow::Result<KvClient<Channel>> {
        Ok(KvClient::new(channel))
    }

    async fn request(&self, kv: &mut KvClient<Channel>, n: u64) -> bool {
        let ops = (0..self.txn_ops)
            .map(|i| RequestOp {
                request: Some(request_op::Request::RequestPut(PutRequest {
                    key: self.keys.key(n.wrapping_mul(self.txn_ops).wrapping_add(i)),
                    value: self.keys.value(),
                    ..Default::default()
                })),
            })
            .collect();
        kv.txn(TxnRequest {
            compare: vec![],
            success: ops,
            failure: vec![],
        })
        .await
        .is_ok()
    }
}

impl Workload for TxnPut {
    const NAME: &'static str = "txn-put";

    async fn run(&self, run: &Run) -> anyhow::Result<Report> {
        self::run(Self::NAME, self, run).await
    }
}

/// TimeToLive with keys: each client grants a lease, attaches `--keys-per-lease` keys and asks
/// for its time to live (with keys) over and over.
#[derive(Args, Debug, Clone)]
pub struct LeaseTimetolive {
    #[arg(long, default_value_t = 10)]
    keys_per_lease: u64,
}

impl Requests for LeaseTimetolive {
    /// The client and the lease it asks about.
    type Client = (LeaseClient<Channel>, i64);

    async fn start(&self, channel: Channel, seed: u64) -> anyhow::Result<Self::Client> {
        let mut lease = LeaseClient::new(channel.clone());
        let mut kv = KvClient::new(channel);
        let id = grant(&mut lease).await?;
        for k in 0..self.keys_per_lease {
            kv.put(PutRequest {
                key: format!("ttl-key/{seed}/{k}").into_bytes(),
                lease: id,
                ..Default::default()
            })
            .await?;
        }
        Ok((lease, id))
    }

    async fn request(&self, (lease, id): &mut Self::Client, _n: u64) -> bool {
        let asked = lease
            .lease_time_to_live(LeaseTimeToLiveRequest {
                id: *id,
                keys: true,
            })
            .await;
        matches!(asked, Ok(r) if r.get_ref().ttl > 0)
    }
}

impl Workload for LeaseTimetolive {
    const NAME: &'static str = "lease-timetolive";

    async fn run(&self, run: &Run) -> anyhow::Result<Report> {
        self::run(Self::NAME, self, run).await
    }
}

/// Lease grants (TTL 100 s; the leases are left to expire).
#[derive(Args, Debug, Clone)]
pub struct LeaseGrant;

impl Requests for LeaseGrant {
    type Client = LeaseClient<Channel>;

    async fn start(&self, channel: Channel, _seed: u64) -> anyhow::Result<LeaseClient<Channel>> {
        Ok(LeaseClient::new(channel))
    }

    async fn request(&self, lease: &mut LeaseClient<Channel>, _n: u64) -> bool {
        grant(lease).await.is_ok()
    }
}

impl Workload for LeaseGrant {
    const NAME: &'static str = "lease-grant";

    async fn run(&self, run: &Run) -> anyhow::Result<Report> {
        self::run(Self::NAME, self, run).await
    }
}

/// Keepalives. Without `--leases`: each client renews its own lease over its own long-lived
/// stream, one request in flight at a time. With `--leases N`: etcd's client pattern, `N`
/// leases spread over `--streams` streams (a stream carries all of its leases' renewals), each
/// lease renewed again as soon as its answer arrives (or, with `--paced`, TTL/3 after it, as
/// clientv3 renews), at most `--window` renewals in flight a stream if given; reports
/// `leases_lost` (renewals answered TTL <= 0). Runs for `--duration`
/// seconds, or until `--total` renewals.
#[derive(Args, Debug, Clone)]
pub struct LeaseKeepalive {
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    leases: Option<u64>,
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    streams: u64,
    /// TTL of the leases the `--leases` mode grants.
    #[arg(long, default_value_t = 60)]
    ttl_secs: i64,
    /// With `--leases`: renew each lease a third of its TTL after its last answer, as etcd's Go
    /// client does, instead of at once. The offered load is then `leases / (TTL / 3)` renewals
    /// a second, and latency is the server's, not a closed loop's queue.
    #[arg(long, requires = "leases")]
    paced: bool,
    /// With `--leases`: at most this many renewals in flight on a stream; the stream's other
    /// leases wait their turn, renewed round-robin as answers arrive. A client that renews
    /// leases from a bounded pool of tasks. Without it, every lease always has a renewal in
    /// flight, and latency is that queue.
    #[arg(long, requires = "leases", value_parser = clap::value_parser!(u64).range(1..))]
    window: Option<u64>,
}

/// A keepalive client: its lease, and the stream that renews it.
pub(crate) struct KeepaliveClient {
    id: i64,
    requests: mpsc::Sender<LeaseKeepAliveRequest>,
    answers: tonic::Streaming<LeaseKeepAliveResponse>,
}

impl Requests for LeaseKeepalive {
    type Client = KeepaliveClient;

    async fn start(&self, channel: Channel, _seed: u64) -> anyhow::Result<KeepaliveClient> {
        let mut lease = LeaseClient::new(channel);
        let id = grant(&mut lease).await?;
        // Queue the first request before opening the stream: some servers (etcd) send the
        // response headers only with the first response.
        let (requests, rx) = mpsc::channel(1);
        requests.send(LeaseKeepAliveRequest { id }).await?;
        let mut answers = lease
            .lease_keep_alive(ReceiverStream::new(rx))
            .await?
            .into_inner();
        answers.message().await?;
        Ok(KeepaliveClient {
            id,
            requests,
            answers,
        })
    }

    async fn request(&self, client: &mut KeepaliveClient, _n: u64) -> bool {
        let renewal = LeaseKeepAliveRequest { id: client.id };
        if client.requests.send(renewal).await.is_err() {
            return false;
        }
        matches!(client.answers.message().await, Ok(Some(r)) if r.ttl > 0)
    }
}

impl Workload for LeaseKeepalive {
    const NAME: &'static str = "lease-keepalive";

    async fn run(&self, run: &Run) -> anyhow::Result<Report> {
        match self.leases {
            Some(leases) => {
                keepalive::run(
                    &run.channels,
                    usize::try_from(leases)?,
                    usize::try_from(self.streams)?,
                    self.ttl_secs,
                    self.paced.then(|| {
                        Duration::from_millis(u64::try_from(self.ttl_secs).unwrap_or(0) * 1000 / 3)
                    }),
                    self.window.map(usize::try_from).transpose()?,
                    run.request_limit(),
                    run.bound(),
                )
                .await
            }
            None => self::run(Self::NAME, self, run).await,
        }
    }
}

/// Puts attached to leases: one lease per `--keys-per-lease` keys, granted first.
#[derive(Args, Debug, Clone)]
pub struct PutWithLease {
    #[arg(long, default_value_t = 10)]
    keys_per_lease: u64,
    #[arg(long, default_value_t = 256)]
    val_size: usize,
}

/// A put-with-lease client: its connections and the lease its next keys attach to.
pub(crate) struct PutWithLeaseClient {
    kv: KvClient<Channel>,
    lease: LeaseClient<Channel>,
    current: Option<i64>,
}

impl Requests for PutWithLease {
    type Client = PutWithLeaseClient;

    async fn start(&self, channel: Channel, _seed: u64) -> anyhow::Result<PutWithLeaseClient> {
        Ok(PutWithLeaseClient {
            kv: KvClient::new(channel.clone()),
            lease: LeaseClient::new(channel),
            current: None,
        })
    }

    async fn request(&self, client: &mut PutWithLeaseClient, n: u64) -> bool {
        let lease = match client.current {
            Some(id) if !n.is_multiple_of(self.keys_per_lease.max(1)) => id,
            _ => match grant(&mut client.lease).await {
                Ok(id) => {
                    client.current = Some(id);
                    id
                }
                Err(_) => return false,
            },
        };
        client
            .kv
            .put(PutRequest {
                key: format!("lease-key/{n:010}").into_bytes(),
                value: vec![b'x'; self.val_size],
                lease,
                ..Default::default()
            })
            .await
            .is_ok()
    }
}

impl Workload for PutWithLease {
    const NAME: &'static str = "put-with-lease";

    async fn run(&self, run: &Run) -> anyhow::Result<Report> {
        self::run(Self::NAME, self, run).await
    }
}

/// Grants a lease of [`LEASE_TTL_SECS`].
async fn grant(lease: &mut LeaseClient<Channel>) -> Result<i64, tonic::Status> {
    let granted = lease
        .lease_grant(LeaseGrantRequest {
            ttl: LEASE_TTL_SECS,
            id: 0,
        })
        .await?;
    Ok(granted.into_inner().id)
}
