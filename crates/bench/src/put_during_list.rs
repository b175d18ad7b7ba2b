//! `put-during-list`: how long writes wait while big reads run. `--objects` keys are written under
//! a prefix first; then one writer puts in a loop (the latencies this report gives) while
//! `--readers` clients each read the whole prefix back to back, unpaged, as kube-apiserver's LIST
//! does when it reads a resource without a limit (its watch cache filling, or a consistent list).
//! With `--read-every-ms T` each reader starts a read at most every T ms instead, so that a
//! faster server is not handed more reads than a slower one.
//! The run lasts `--duration` seconds (default 10). The extra figures are the full reads: how
//! many, and their p50 and slowest.
//!
//! The readers are other clients, as in the issue that set this workload: they run on a runtime
//! of their own (their own threads and connections), as another process would. On the writer's
//! runtime, a reader decoding a 100 MB answer held a worker for tens of milliseconds, and the
//! writer's answers waited behind it in the benchmark itself; a faster server, handed more
//! reads, was charged more of that.
//!
//! With `--keepalive-leases N`, N leases of `--lease-ttl` seconds are granted first and kept
//! alive during the run over one `LeaseKeepAlive` stream, each renewed every third of its TTL as
//! clientv3 does; at the end, after the readers' last reads and with the keeper still renewing,
//! each is looked up (`leases_lost`: renewals answered TTL <= 0, or leases gone at the end).
//! Every run also reports `elections`: how far the highest Raft term any endpoint reports moved
//! during the run (0: no election).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use leasehold_api::etcdserverpb::{
    LeaseGrantRequest, LeaseKeepAliveRequest, LeaseTimeToLiveRequest, RangeRequest, StatusRequest,
    kv_client::KvClient, lease_client::LeaseClient, maintenance_client::MaintenanceClient,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::Channel;

use crate::{OP_TIMEOUT, Report, Run, Workload};

/// A full read of 100,000 KiB objects is ~100 MB: above every client's default receive limit.
const READ_BYTES_MAX: usize = 2 * 1024 * 1024 * 1024 - 1;

#[derive(Args, Debug, Clone)]
pub struct PutDuringList {
    /// The prefix the objects live under (and the readers read).
    #[arg(long, default_value = "/registry/pods/bench/")]
    prefix: String,
    /// Objects under the prefix, written before the run.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    objects: u64,
    /// Bytes per object.
    #[arg(long, default_value_t = 1024)]
    val_size: usize,
    /// Clients reading the whole prefix back to back.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    readers: u64,
    /// Start each reader's full reads at most this often (ms): the same read load on every
    /// server, where back to back a faster server is given more reads to serve. 0: back to
    /// back.
    #[arg(long, default_value_t = 0)]
    read_every_ms: u64,
    /// Leases kept alive over one stream during the run (see the module doc).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=100_000))]
    keepalive_leases: u64,
    /// Their TTL in seconds.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(i64).range(2..=3600))]
    lease_ttl: i64,
}

impl PutDuringList {
    fn key(&self, i: u64) -> Vec<u8> {
        format!("{}object-{i:08}", self.prefix).into_bytes()
    }
}

impl Workload for PutDuringList {
    const NAME: &'static str = "put-during-list";

    async fn run(&self, run: &Run) -> anyhow::Result<Report> {
        let channel = |n: usize| run.channels[n % run.channels.len()].clone();
        let mut writer = KvClient::new(channel(0));
        crate::fill_objects(&mut writer, self.objects, &vec![b'v'; self.val_size], |i| {
            self.key(i)
        })
        .await?;
        let bound = run
            .duration
            .unwrap_or(Duration::from_secs(10))
            .min(run.timeout);
        let stop = Arc::new(AtomicBool::new(false));
        let term_before = highest_term(&run.channels).await?;
        let mut leases = Vec::new();
        let mut grants = LeaseClient::new(channel(0));
        for _ in 0..self.keepalive_leases {
            let grant = grants.lease_grant(LeaseGrantRequest {
                ttl: self.lease_ttl,
                id: 0,
            });
            leases.push(
                tokio::time::timeout(OP_TIMEOUT, grant)
                    .await??
                    .into_inner()
                    .id,
            );
        }
        // The keeper has its own stop: it renews until every lease has been looked up at the
        // end, after the readers' last reads (a read of a million objects can outlast a TTL).
        let keeping_done = Arc::new(AtomicBool::new(false));
        let keeper = (!leases.is_empty()).then(|| {
            let period = Duration::from_secs(self.lease_ttl as u64) / 3;
            tokio::spawn(keep_alive(
                channel(0),
                leases.clone(),
                period,
                keeping_done.clone(),
            ))
        });
        let readers_runtime = ReadersRuntime(Some(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(self.readers.min(2) as usize)
                .thread_name("bench-reader")
                .enable_all()
                .build()?,
        ));
        let mut readers = Vec::new();
        for r in 0..self.readers {
            let url = run.urls[(r as usize + 1) % run.urls.len()].clone();
            let (stop, objects) = (stop.clone(), self.objects);
            let every = Duration::from_millis(self.read_every_ms);
            let prefix = self.prefix.clone().into_bytes();
            readers.push(readers_runtime.spawn(async move {
                let mut kv = KvClient::new(crate::connect(&url).await?)
                    .max_decoding_message_size(READ_BYTES_MAX);
                let mut reads = Histogram::<u64>::new(3).expect("valid sigfig");
                let mut wrong = 0u64;
                let mut next = tokio::time::Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    tokio::time::sleep_until(next).await;
                    next = tokio::time::Instant::now() + every;
                    let t = Instant::now();
                    let read = kv.range(RangeRequest {
                        range_end: leasehold_types::prefix_range_end(&prefix),
                        key: prefix.clone(),
                        ..Default::default()
                    });
                    match tokio::time::timeout(OP_TIMEOUT * 3, read).await {
                        Ok(Ok(resp)) if resp.get_ref().kvs.len() as u64 == objects => {
                            let _ = reads.record(t.elapsed().as_micros() as u64);
                        }
                        _ => wrong += 1,
                    }
                }
                anyhow::Ok((reads, wrong))
            }));
        }
        // The readers start their first read before the writer measures anything.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut latency_us = Histogram::<u64>::new(3).expect("valid sigfig");
        let mut errors = 0u64;
        let value = vec![b'w'; self.val_size];
        // Outside the prefix, so every full read returns exactly the objects.
        let key = format!("{}-writer", self.prefix.trim_end_matches('/')).into_bytes();
        let started = Instant::now();
        while started.elapsed() < bound {
            if crate::timed_put(&mut writer, &key, &value, &mut latency_us)
                .await
                .is_none()
            {
                errors += 1;
            }
        }
        let elapsed = started.elapsed();
        stop.store(true, Ordering::Relaxed);
        let mut reads = Histogram::<u64>::new(3).expect("valid sigfig");
        let mut wrong = 0;
        for r in readers {
            let (h, w) = r.await??;
            reads.add(h)?;
            wrong += w;
        }
        drop(readers_runtime);
        let mut gone = HashSet::new();
        for id in leases {
            let ask = grants.lease_time_to_live(LeaseTimeToLiveRequest { id, keys: false });
            let ttl = tokio::time::timeout(OP_TIMEOUT, ask)
                .await??
                .into_inner()
                .ttl;
            if ttl <= 0 {
                gone.insert(id);
            }
        }
        keeping_done.store(true, Ordering::Relaxed);
        let mut lost = match keeper {
            Some(keeper) => keeper.await??,
            None => HashSet::new(),
        };
        lost.extend(gone);
        let term_after = highest_term(&run.channels).await?;
        let mut extra = serde_json::Map::new();
        extra.insert("full_reads".into(), reads.len().into());
        extra.insert("full_reads_failed".into(), wrong.into());
        crate::insert_latencies(&mut extra, "full_read", &reads, &[("p50", 0.5)]);
        extra.insert("leases_kept".into(), self.keepalive_leases.into());
        extra.insert("leases_lost".into(), lost.len().into());
        extra.insert("elections".into(), (term_after - term_before).into());
        Ok(Report {
            workload: Self::NAME,
            requests: latency_us.len(),
            errors,
            elapsed,
            latency_us,
            extra,
        })
    }
}

/// The readers' runtime, shut down without waiting when the run ends, however it ends (a
/// runtime cannot be dropped the ordinary way from within another's task).
struct ReadersRuntime(Option<tokio::runtime::Runtime>);

impl ReadersRuntime {
    fn spawn<F>(&self, task: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.0.as_ref().expect("only taken on drop").spawn(task)
    }
}

impl Drop for ReadersRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// The highest Raft term any of `channels` reports.
async fn highest_term(channels: &[Channel]) -> anyhow::Result<u64> {
    let mut term = 0;
    for channel in channels {
        let mut client = MaintenanceClient::new(channel.clone());
        let status = tokio::time::timeout(OP_TIMEOUT, client.status(StatusRequest {})).await??;
        term = term.max(status.into_inner().raft_term);
    }
    Ok(term)
}

/// Renews every lease of `ids` each `period` over one `LeaseKeepAlive` stream (opened again if
/// it breaks) until `stop`: the leases any renewal found gone (answered TTL <= 0).
async fn keep_alive(
    channel: Channel,
    ids: Vec<i64>,
    period: Duration,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<HashSet<i64>> {
    let mut client = LeaseClient::new(channel);
    let mut lost = HashSet::new();
    let mut next = tokio::time::Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let (tx, rx) = mpsc::unbounded_channel();
        // The first renewals go before the stream is awaited: a server answers the call's
        // headers with its first answer.
        for &id in &ids {
            let _ = tx.send(LeaseKeepAliveRequest { id });
        }
        next += period;
        let open = client.lease_keep_alive(UnboundedReceiverStream::new(rx));
        let Ok(Ok(stream)) = tokio::time::timeout(OP_TIMEOUT, open).await else {
            tokio::time::sleep_until(next).await;
            continue;
        };
        let mut answers = stream.into_inner();
        'stream: loop {
            loop {
                tokio::select! {
                    answer = answers.message() => match answer {
                        Ok(Some(answer)) if answer.ttl <= 0 => {
                            lost.insert(answer.id);
                        }
                        Ok(Some(_)) => {}
                        _ => break 'stream,
                    },
                    () = tokio::time::sleep_until(next) => break,
                }
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
            for &id in &ids {
                if tx.send(LeaseKeepAliveRequest { id }).is_err() {
                    break 'stream;
                }
            }
            next += period;
        }
    }
    Ok(lost)
}
