//! `lease-keepalive --leases N --streams S`: etcd's Go client pattern. A clientv3 `Lease` sends
//! the renewals of all of a client's leases over one `LeaseKeepAlive` stream; here `N` leases
//! are spread over `S` such streams, and each lease is renewed again as soon as the answer to
//! its previous renewal arrives, so a stream carries up to `N / S` renewals in flight. Paced
//! (`--paced`), each lease is renewed a third of its TTL after its previous answer, as clientv3
//! does: an open loop offering `N / (TTL / 3)` renewals a second. With a window
//! (`--window W`), a stream keeps at most `W` renewals in flight and its other leases wait their
//! turn, round-robin: a closed loop of `W` per stream, whatever `N`.
//!
//! Reported besides throughput and latency: `leases_lost` (leases that got a renewal answered
//! with TTL <= 0 while their client was renewing them: a live client's lease was revoked),
//! `renewals_ttl_le_0` (every such answer), `leases_renewed` (leases with a measured renewal
//! answered) and `max_in_flight` (the most renewals one stream had unanswered).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
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
    /// Leases with a measured renewal answered TTL > 0.
    renewed: std::collections::HashSet<i64>,
    max_in_flight: usize,
}

/// Runs the workload until `deadline_after` past the end of the grants, or until `total`
/// renewals were sent in all after it. A lease is renewed from the moment its grant is answered,
/// as clientv3 starts keeping a lease alive once it is granted (here back to back rather than
/// every TTL/3): renewals during the grants keep the early leases alive, and count as lost if
/// answered TTL <= 0, but only renewals sent after the last grant are measured.
pub(super) async fn run(
    channels: &[Channel],
    leases: usize,
    streams: usize,
    ttl_secs: i64,
    pace: Option<Duration>,
    window: Option<usize>,
    total: u64,
    deadline_after: Duration,
) -> anyhow::Result<Report> {
    anyhow::ensure!(leases >= 1, "--leases must be at least 1");
    anyhow::ensure!(
        (1..=leases).contains(&streams),
        "--streams must be between 1 and --leases"
    );
    let measure = Arc::new(Measure {
        from: OnceLock::new(),
        deadline_after,
        issued: AtomicU64::new(0),
        total,
    });
    let mut tasks = Vec::with_capacity(streams);
    let mut granted_to = Vec::with_capacity(streams);
    for s in 0..streams {
        let (tx, rx) = mpsc::unbounded_channel();
        granted_to.push(tx);
        let channel = channels[s % channels.len()].clone();
        tasks.push(tokio::spawn(renew_over_one_stream(
            channel,
            rx,
            measure.clone(),
            pace,
            window.unwrap_or(usize::MAX),
        )));
    }
    let grants_started = Instant::now();
    let granted = grant_all(channels, leases, ttl_secs, granted_to).await;
    let grant_phase = grants_started.elapsed();
    let start = Instant::now();
    let _ = measure.from.set(start);
    let ids = match granted {
        Ok(ids) => ids,
        Err(e) => {
            for task in &tasks {
                task.abort();
            }
            return Err(e);
        }
    };
    let mut latency_us = Histogram::<u64>::new(3).expect("valid sigfig");
    let (mut requests, mut errors, mut lost, mut ttl_le_0) = (0, 0, 0, 0);
    let (mut renewed, mut max_in_flight) = (0, 0);
    for task in tasks {
        let tally = task.await?;
        if let Some(h) = tally.latency_us {
            latency_us.add(h)?;
        }
        requests += tally.answered;
        errors += tally.errors;
        lost += tally.leases_lost;
        ttl_le_0 += tally.renewals_ttl_le_0;
        renewed += tally.renewed.len();
        max_in_flight = max_in_flight.max(tally.max_in_flight);
    }
    let elapsed = start.elapsed();
    revoke_all(channels, &ids).await;
    let mut extra = serde_json::Map::new();
    extra.insert("leases".into(), leases.into());
    extra.insert("streams".into(), streams.into());
    extra.insert("ttl_secs".into(), ttl_secs.into());
    if let Some(pace) = pace {
        extra.insert("renew_every_ms".into(), (pace.as_millis() as u64).into());
        let offered = leases as f64 / pace.as_secs_f64().max(1e-3);
        extra.insert("offered_per_s".into(), offered.into());
    }
    if let Some(window) = window {
        extra.insert("window".into(), window.into());
    }
    extra.insert("grant_phase_s".into(), grant_phase.as_secs_f64().into());
    extra.insert("leases_lost".into(), lost.into());
    extra.insert("renewals_ttl_le_0".into(), ttl_le_0.into());
    extra.insert("leases_renewed".into(), renewed.into());
    extra.insert("max_in_flight".into(), max_in_flight.into());
    Ok(Report {
        workload: "lease-keepalive",
        requests,
        errors,
        elapsed,
        latency_us,
        extra,
    })
}

/// The measured part of a run: from the end of the grants, for `deadline_after` or `total`
/// renewals.
struct Measure {
    /// Set when the last grant was answered.
    from: OnceLock<Instant>,
    deadline_after: Duration,
    /// Renewals sent since `from`, by all streams.
    issued: AtomicU64,
    total: u64,
}

impl Measure {
    /// When the measured part ends at the latest (unknown until the grants are done).
    fn window_end(&self) -> Option<Instant> {
        self.from.get().map(|from| *from + self.deadline_after)
    }

    /// Whether to send one more renewal, and whether it counts.
    fn may_send(&self) -> Option<bool> {
        let Some(from) = self.from.get() else {
            return Some(false);
        };
        let go = Instant::now() < *from + self.deadline_after
            && self.issued.fetch_add(1, Ordering::Relaxed) < self.total;
        go.then_some(true)
    }
}

/// Renews the leases granted to this stream, each from the moment its grant is answered and
/// again whenever its answer arrives (or `pace` after it), until the measured part of the run
/// ends, with at most `window` renewals in flight (the rest wait in `waiting`, oldest first).
/// Answers come in request order (as etcd and leasehold both answer a stream), so the oldest
/// request in flight is the one answered.
async fn renew_over_one_stream(
    channel: Channel,
    mut granted: mpsc::UnboundedReceiver<i64>,
    measure: Arc<Measure>,
    pace: Option<Duration>,
    window: usize,
) -> StreamTally {
    let mut tally = StreamTally {
        latency_us: Some(Histogram::<u64>::new(3).expect("valid sigfig")),
        ..StreamTally::default()
    };
    // Queue the first renewal before opening the stream: etcd sends a stream's response headers
    // only with its first response.
    let Some(first) = granted.recv().await else {
        return tally;
    };
    let (tx, rx) = mpsc::unbounded_channel();
    // (lease, sent at, measured)
    let mut in_flight: VecDeque<(i64, Instant, bool)> = VecDeque::new();
    in_flight.push_back((first, Instant::now(), false));
    let _ = tx.send(LeaseKeepAliveRequest { id: first });
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
    let mut granting = true;
    let mut lost = std::collections::HashSet::new();
    // Paced: (due, lease), in due order, since every lease waits the same `pace` after an
    // answer and answers come in order.
    let mut due: VecDeque<(tokio::time::Instant, i64)> = VecDeque::new();
    // Leases whose renewal is due but waits for room in the window, and whether it counts.
    let mut waiting: VecDeque<(i64, bool)> = VecDeque::new();
    loop {
        while in_flight.len() < window
            && let Some((id, measured)) = waiting.pop_front()
        {
            in_flight.push_back((id, Instant::now(), measured));
            let _ = tx.send(LeaseKeepAliveRequest { id });
        }
        tally.max_in_flight = tally.max_in_flight.max(in_flight.len());
        if in_flight.is_empty() && !granting && due.is_empty() {
            break;
        }
        let next_due = due.front().map(|(at, _)| *at);
        let window_end = measure.window_end().filter(|_| !due.is_empty());
        let message = tokio::select! {
            // Paced renewals not yet due when the run ends are not sent: the run ends now,
            // not a pace later.
            () = tokio::time::sleep_until(window_end.map_or_else(tokio::time::Instant::now, tokio::time::Instant::from_std)), if window_end.is_some() => {
                due.clear();
                continue;
            }
            () = tokio::time::sleep_until(next_due.unwrap_or_else(tokio::time::Instant::now)), if next_due.is_some() => {
                let now = tokio::time::Instant::now();
                while let Some(&(at, id)) = due.front() {
                    if at > now {
                        break;
                    }
                    due.pop_front();
                    if let Some(measured) = measure.may_send() {
                        waiting.push_back((id, measured));
                    }
                }
                continue;
            }
            id = granted.recv(), if granting => {
                match id {
                    Some(id) => waiting.push_back((id, false)),
                    None => granting = false,
                }
                continue;
            }
            message = tokio::time::timeout(OP_TIMEOUT, stream.message()), if !in_flight.is_empty() => message,
        };
        let (id, sent, measured) = in_flight.pop_front().expect("a renewal in flight");
        let response = match message {
            Ok(Ok(Some(r))) => r,
            Ok(Ok(None)) | Ok(Err(_)) | Err(_) => {
                // The stream broke: every measured renewal it left unanswered, and the break
                // itself if it came in the measured part of the run.
                let unanswered = in_flight
                    .iter()
                    .filter(|(_, _, measured)| *measured)
                    .count()
                    + waiting.iter().filter(|(_, measured)| *measured).count();
                let broke_measured = measure.from.get().is_some();
                tally.errors += u64::from(broke_measured) + unanswered as u64;
                break;
            }
        };
        if response.id != id {
            // Out of order or not ours: the stream broke its contract.
            tally.errors += 1;
            continue;
        }
        if measured {
            let _ = tally
                .latency_us
                .as_mut()
                .expect("set above")
                .record(sent.elapsed().as_micros() as u64);
            tally.answered += 1;
        }
        if response.ttl <= 0 {
            tally.renewals_ttl_le_0 += 1;
            if lost.insert(id) {
                tally.leases_lost += 1;
            }
            continue; // A lost lease is not renewed again.
        }
        if measured {
            tally.renewed.insert(id);
        }
        if let Some(pace) = pace {
            due.push_back((tokio::time::Instant::now() + pace, id));
        } else if let Some(measured) = measure.may_send() {
            waiting.push_back((id, measured));
        }
    }
    tally
}

/// Grants `n` leases, `SETUP_CONCURRENCY` at a time, and hands each to its stream (round-robin)
/// the moment it is granted.
async fn grant_all(
    channels: &[Channel],
    n: usize,
    ttl_secs: i64,
    streams: Vec<mpsc::UnboundedSender<i64>>,
) -> anyhow::Result<Vec<i64>> {
    let next = Arc::new(AtomicU64::new(0));
    let streams = Arc::new(streams);
    let mut tasks = Vec::new();
    for w in 0..SETUP_CONCURRENCY.min(n) {
        let mut client = LeaseClient::new(channels[w % channels.len()].clone());
        let (next, streams) = (next.clone(), streams.clone());
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n as u64 {
                    break;
                }
                let grant = client.lease_grant(LeaseGrantRequest {
                    ttl: ttl_secs,
                    id: 0,
                });
                let id = tokio::time::timeout(OP_TIMEOUT, grant)
                    .await
                    .context("lease grant timed out")??
                    .into_inner()
                    .id;
                let _ = streams[i as usize % streams.len()].send(id);
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
