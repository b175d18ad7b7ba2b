//! `put-during-list`: how long writes wait while big reads run. `--objects` keys are written under
//! a prefix first; then one writer puts in a loop (the latencies this report gives) while
//! `--readers` clients each read the whole prefix back to back, unpaged, as kube-apiserver's LIST
//! does when it reads a resource without a limit (its watch cache filling, or a consistent list).
//! The run lasts `--duration` seconds (default 10). The extra figures are the full reads: how
//! many, and their p50 and slowest.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use leasehold_api::etcdserverpb::{PutRequest, RangeRequest, kv_client::KvClient};

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
        let mut readers = Vec::new();
        for r in 0..self.readers {
            let mut kv =
                KvClient::new(channel(r as usize + 1)).max_decoding_message_size(READ_BYTES_MAX);
            let (stop, objects) = (stop.clone(), self.objects);
            let prefix = self.prefix.clone().into_bytes();
            readers.push(tokio::spawn(async move {
                let mut reads = Histogram::<u64>::new(3).expect("valid sigfig");
                let mut wrong = 0u64;
                while !stop.load(Ordering::Relaxed) {
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
                (reads, wrong)
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
            let t = Instant::now();
            let put = writer.put(PutRequest {
                key: key.clone(),
                value: value.clone(),
                ..Default::default()
            });
            match tokio::time::timeout(OP_TIMEOUT, put).await {
                Ok(Ok(_)) => {
                    let _ = latency_us.record(t.elapsed().as_micros() as u64);
                }
                _ => errors += 1,
            }
        }
        let elapsed = started.elapsed();
        stop.store(true, Ordering::Relaxed);
        let mut reads = Histogram::<u64>::new(3).expect("valid sigfig");
        let mut wrong = 0;
        for r in readers {
            let (h, w) = r.await?;
            reads.add(h)?;
            wrong += w;
        }
        let ms = |us: u64| us as f64 / 1000.0;
        let mut extra = serde_json::Map::new();
        extra.insert("full_reads".into(), reads.len().into());
        extra.insert("full_reads_failed".into(), wrong.into());
        extra.insert(
            "full_read_p50_ms".into(),
            ms(reads.value_at_quantile(0.5)).into(),
        );
        extra.insert("full_read_max_ms".into(), ms(reads.max()).into());
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
