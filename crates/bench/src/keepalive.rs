//! `lease-keepalive --leases N --streams S`: etcd's Go client pattern. A clientv3 `Lease` sends
//! the renewals of all of a client's leases over one `LeaseKeepAlive` stream; here `N` leases
//! are spread over `S` such streams, and each lease is renewed again as soon as the answer to
//! its previous renewal arrives, so a stream carries up to `N / S` renewals in flight.
//!
//! Reported besides throughput and latency: `leases_lost` (leases that got a renewal answered
//! with TTL <= 0 while their client was renewing them: a live client's lease was revoked) and
//! `renewals_ttl_le_0` (every such answer).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hdrhistogram::Histogram;
use leasehold_api::etcdserverpb::{
    LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest, lease_client::LeaseClient,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::Channel;

use super::{OP_TIMEOUT, Report};

/// Grants (and, at the end, revokes) run this many at a time.
const SETUP_CONCURRENCY: usize = 64;

/// What one stream saw.
#[derive(Default)]
struct StreamTally {
    latency_us: Option<Histogram<u64>>,
    answered: u64,
    errors: u64,
    leases_lost: u64,
    renewals_ttl_le_0: u64,
}

/// Runs the workload until `deadline` or until `total` renewals were answered in all.
pub(super) async fn run(
    channels: &[Channel],
    leases: usize,
    streams: usize,
    ttl_secs: i64,
    total: u64,
    deadline_after: Duration,
) -> anyhow::Result<Report> {
    anyhow::ensure!(leases >= 1, "--leases must be at least 1");
    anyhow::ensure!(
        (1..=leases).contains(&streams),
        "--streams must be between 1 and --leases"
    );
    let ids = grant_all(channels, leases, ttl_secs).await?;
    let issued = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + deadline_after;
    let mut tasks = Vec::with_capacity(streams);
    for s in 0..streams {
        let mine: Vec<i64> = ids.iter().copied().skip(s).step_by(streams).collect();
        let channel = channels[s % channels.len()].clone();
        let issued = issued.clone();
        tasks.push(tokio::spawn(renew_over_one_stream(
            channel, mine, issued, total, deadline,
        )));
    }
    let mut latency_us = Histogram::<u64>::new(3).expect("valid sigfig");
    let (mut requests, mut errors, mut lost, mut ttl_le_0) = (0, 0, 0, 0);
    for task in tasks {
        let tally = task.await?;
        if let Some(h) = tally.latency_us {
            latency_us.add(h)?;
        }
        requests += tally.answered;
        errors += tally.errors;
        lost += tally.leases_lost;
        ttl_le_0 += tally.renewals_ttl_le_0;
    }
    let elapsed = start.elapsed();
    revoke_all(channels, &ids).await;
    let mut extra = serde_json::Map::new();
    extra.insert("leases".into(), leases.into());
    extra.insert("streams".into(), streams.into());
    extra.insert("ttl_secs".into(), ttl_secs.into());
    extra.insert("leases_lost".into(), lost.into());
    extra.insert("renewals_ttl_le_0".into(), ttl_le_0.into());
    Ok(Report {
        workload: "lease-keepalive",
        requests,
        errors,
        elapsed,
        latency_us,
        extra,
    })
}

/// Renews `ids` over one stream: all of them at once, then each again when its answer arrives,
/// until `total` renewals were sent by all streams or `deadline` passed. Answers come in request
/// order (as etcd and leasehold both answer a stream), so the oldest request in flight is the
/// one answered.
async fn renew_over_one_stream(
    channel: Channel,
    ids: Vec<i64>,
    issued: Arc<AtomicU64>,
    total: u64,
    deadline: Instant,
) -> StreamTally {
    let may_send = || issued.fetch_add(1, Ordering::Relaxed) < total && Instant::now() < deadline;
    let mut tally = StreamTally {
        latency_us: Some(Histogram::<u64>::new(3).expect("valid sigfig")),
        ..StreamTally::default()
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let mut in_flight: VecDeque<(i64, Instant)> = VecDeque::with_capacity(ids.len());
    // Queue the first renewals before opening the stream: etcd sends a stream's response
    // headers only with its first response.
    for id in &ids {
        if !may_send() {
            break;
        }
        in_flight.push_back((*id, Instant::now()));
        let _ = tx.send(LeaseKeepAliveRequest { id: *id });
    }
    let opened = tokio::time::timeout(
        OP_TIMEOUT,
        LeaseClient::new(channel).lease_keep_alive(UnboundedReceiverStream::new(rx)),
    )
    .await;
    let mut stream = match opened {
        Ok(Ok(response)) => response.into_inner(),
        Ok(Err(e)) => {
            tracing::warn!("keepalive stream: {e}");
            tally.errors += 1;
            return tally;
        }
        Err(_) => {
            tally.errors += 1;
            return tally;
        }
    };
    let mut lost = std::collections::HashSet::new();
    while let Some((id, sent)) = in_flight.pop_front() {
        let message = tokio::time::timeout(OP_TIMEOUT, stream.message()).await;
        let response = match message {
            Ok(Ok(Some(r))) => r,
            Ok(Ok(None)) | Ok(Err(_)) | Err(_) => {
                tally.errors += 1 + in_flight.len() as u64;
                break;
            }
        };
        if response.id != id {
            // Out of order or not ours: the stream broke its contract.
            tally.errors += 1;
            continue;
        }
        let _ = tally
            .latency_us
            .as_mut()
            .expect("set above")
            .record(sent.elapsed().as_micros() as u64);
        tally.answered += 1;
        if response.ttl <= 0 {
            tally.renewals_ttl_le_0 += 1;
            if lost.insert(id) {
                tally.leases_lost += 1;
            }
            continue; // A lost lease is not renewed again.
        }
        if may_send() {
            in_flight.push_back((id, Instant::now()));
            let _ = tx.send(LeaseKeepAliveRequest { id });
        }
    }
    tally
}

async fn grant_all(channels: &[Channel], n: usize, ttl_secs: i64) -> anyhow::Result<Vec<i64>> {
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for w in 0..SETUP_CONCURRENCY.min(n) {
        let mut client = LeaseClient::new(channels[w % channels.len()].clone());
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < n as u64 {
                let grant = client.lease_grant(LeaseGrantRequest {
                    ttl: ttl_secs,
                    id: 0,
                });
                let id = tokio::time::timeout(OP_TIMEOUT, grant)
                    .await
                    .context("lease grant timed out")??
                    .into_inner()
                    .id;
                ids.push(id);
            }
            anyhow::Ok(ids)
        }));
    }
    let mut ids = Vec::with_capacity(n);
    for task in tasks {
        ids.extend(task.await??);
    }
    Ok(ids)
}

/// Revokes what the run granted (best effort), so the leases do not expire under the next run.
async fn revoke_all(channels: &[Channel], ids: &[i64]) {
    let ids = Arc::new(ids.to_vec());
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for w in 0..SETUP_CONCURRENCY.min(ids.len()) {
        let mut client = LeaseClient::new(channels[w % channels.len()].clone());
        let (ids, next) = (ids.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                let Some(id) = ids.get(i) else { break };
                let revoke = client.lease_revoke(LeaseRevokeRequest { id: *id });
                let _ = tokio::time::timeout(OP_TIMEOUT, revoke).await;
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
}
