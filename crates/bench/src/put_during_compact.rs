//! `put-during-compact`: how long writes wait while the store compacts, as kube-apiserver
//! compacts every 5 minutes (or `--etcd-compaction-interval`). `--objects` keys under a prefix
//! are written `--versions` times first, so that there is history to drop and a large live set
//! for the compaction's hash to cover. Then one writer puts in a loop (the latencies this report
//! gives) while another client asks, every `--compact-every-ms`, for a compaction at the newest
//! revision the writer has seen: `--compactions` of them, not physical (kube-apiserver's way).
//! The extra figures are the compactions' own times: p50 and slowest.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use leasehold_api::etcdserverpb::{CompactionRequest, kv_client::KvClient};

use crate::{OP_TIMEOUT, Report, Run, Workload};

#[derive(Args, Debug, Clone)]
pub struct PutDuringCompact {
    /// The prefix the objects live under.
    #[arg(long, default_value = "/registry/pods/bench/")]
    prefix: String,
    /// Objects under the prefix, written before the run.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..))]
    objects: u64,
    /// Bytes per object (kube-apiserver's pods are about 2.5 KB).
    #[arg(long, default_value_t = 2_500)]
    val_size: usize,
    /// Times each object is written before the run.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=100))]
    versions: u64,
    /// Compactions during the run.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=1000))]
    compactions: u64,
    /// Time from the run's start (and from each compaction's answer) to the next compaction.
    #[arg(long, default_value_t = 2_000)]
    compact_every_ms: u64,
}

impl Workload for PutDuringCompact {
    const NAME: &'static str = "put-during-compact";

    async fn run(&self, run: &Run) -> anyhow::Result<Report> {
        let channel = |n: usize| run.channels[n % run.channels.len()].clone();
        let mut writer = KvClient::new(channel(0));
        for round in 0..self.versions {
            let value = vec![b'a' + (round % 26) as u8; self.val_size];
            crate::fill_objects(&mut writer, self.objects, &value, |i| {
                format!("{}object-{i:08}", self.prefix).into_bytes()
            })
            .await?;
        }
        let seen = Arc::new(AtomicI64::new(0));
        let compactor = {
            let (mut kv, seen) = (KvClient::new(channel(1)), seen.clone());
            let (every, count) = (
                Duration::from_millis(self.compact_every_ms),
                self.compactions,
            );
            tokio::spawn(async move {
                let mut took = Histogram::<u64>::new(3).expect("valid sigfig");
                let mut failed = 0u64;
                for _ in 0..count {
                    tokio::time::sleep(every).await;
                    let revision = seen.load(Ordering::Relaxed);
                    let t = Instant::now();
                    let compact = kv.compact(CompactionRequest {
                        revision,
                        physical: false,
                    });
                    match tokio::time::timeout(OP_TIMEOUT, compact).await {
                        Ok(Ok(_)) => {
                            let _ = took.record(t.elapsed().as_micros() as u64);
                        }
                        _ => failed += 1,
                    }
                }
                (took, failed)
            })
        };
        let mut latency_us = Histogram::<u64>::new(3).expect("valid sigfig");
        let mut errors = 0u64;
        let value = vec![b'w'; self.val_size];
        // Outside the prefix: the writer adds history, not live objects.
        let key = format!("{}-writer", self.prefix.trim_end_matches('/')).into_bytes();
        let started = Instant::now();
        // Until the last compaction has been answered, and within the run's bound.
        while !compactor.is_finished() && started.elapsed() < run.timeout {
            match crate::timed_put(&mut writer, &key, &value, &mut latency_us).await {
                Some(answer) => {
                    if let Some(header) = answer.header {
                        seen.fetch_max(header.revision, Ordering::Relaxed);
                    }
                }
                None => errors += 1,
            }
        }
        let elapsed = started.elapsed();
        compactor.abort();
        let (took, failed) = match compactor.await {
            Ok(result) => result,
            Err(_) => anyhow::bail!("the compactions did not finish within the run's bound"),
        };
        let mut extra = serde_json::Map::new();
        extra.insert("compactions".into(), took.len().into());
        extra.insert("compactions_failed".into(), failed.into());
        crate::insert_latencies(&mut extra, "compaction", &took, &[("p50", 0.5)]);
        crate::insert_latencies(&mut extra, "put", &latency_us, &[]);
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
