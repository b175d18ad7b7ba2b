//! `get-during-put`: linearizable reads of one object while objects are updated, both at fixed
//! rates, as kube-apiserver reads and writes its store (its `get` of one object, and the read of
//! the current revision each consistent list from its watch cache begins with). `--objects`
//! objects of `--val-size` bytes are written under a prefix first; then, for the run's
//! `--duration` (default 10 s), `--writers` clients update random objects, `--put-rate` puts a
//! second between them, while `--readers` clients read random objects, `--read-rate` reads a
//! second between them. Both rates are offered: each client sends one request a period and
//! waits for its answer, so a slower server is handed no less work, only fewer requests once an
//! answer outlasts the period. The clients spread over the connections (`--conns`), and those
//! over the endpoints: on a cluster, reads on a follower ask the leader for a read index and
//! writes on a follower go to the leader.
//!
//! The latencies this report gives are the reads'. The extra figures are the puts': how many,
//! their p50, p99 and slowest, and how many failed.

use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use leasehold_api::etcdserverpb::{RangeRequest, kv_client::KvClient};
use tokio::time::MissedTickBehavior;
use tonic::transport::Channel;

use crate::{OP_TIMEOUT, Report, Run, Workload};

#[derive(Args, Debug, Clone)]
pub struct GetDuringPut {
    /// The prefix the objects live under.
    #[arg(long, default_value = "/registry/pods/bench/")]
    prefix: String,
    /// Objects under the prefix, written before the run.
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(1..))]
    objects: u64,
    /// Bytes per object (kube-apiserver's pods are about 2.5 KB).
    #[arg(long, default_value_t = 2_500)]
    val_size: usize,
    /// Clients updating objects.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=1024))]
    writers: u64,
    /// Puts a second, offered, over all the writers.
    #[arg(long, default_value_t = 400, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    put_rate: u64,
    /// Clients reading objects.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=1024))]
    readers: u64,
    /// Linearizable reads a second, offered, over all the readers.
    #[arg(long, default_value_t = 400, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    read_rate: u64,
}

/// One client's figures: its latencies and its failed requests.
type Tally = (Histogram<u64>, u64);

/// The period between one client's requests when `clients` share `rate` requests a second.
fn period(clients: u64, rate: u64) -> Duration {
    Duration::from_secs_f64(clients as f64 / rate as f64)
}

/// Object `i`'s key under `prefix`.
fn object_key(prefix: &str, i: u64) -> Vec<u8> {
    format!("{prefix}object-{i:08}").into_bytes()
}

/// A cheap random sequence per client (xorshift64), so that clients touch different objects.
struct Draw(u64);

impl Draw {
    fn new(client: u64) -> Draw {
        Draw((client + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// What a writer or a reader does once a period.
#[derive(Clone, Copy)]
enum Role {
    Writer,
    Reader,
}

impl GetDuringPut {
    /// One client in `role`: a request every `period` on `kv` until `deadline`.
    async fn client(
        self,
        role: Role,
        client: u64,
        mut kv: KvClient<Channel>,
        period: Duration,
        deadline: Instant,
    ) -> Tally {
        let mut latency_us = Histogram::<u64>::new(3).expect("valid sigfig");
        let mut failed = 0u64;
        let mut draw = Draw::new(client);
        let value = vec![b'u'; self.val_size];
        let mut ticks = tokio::time::interval(period);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            if Instant::now() >= deadline {
                break;
            }
            let key = object_key(&self.prefix, draw.below(self.objects));
            let answered = match role {
                Role::Writer => crate::timed_put(&mut kv, &key, &value, &mut latency_us)
                    .await
                    .is_some(),
                Role::Reader => {
                    let t = Instant::now();
                    let read = kv.range(RangeRequest {
                        key,
                        ..Default::default()
                    });
                    let ok = matches!(tokio::time::timeout(OP_TIMEOUT, read).await, Ok(Ok(_)));
                    if ok {
                        let _ = latency_us.record(t.elapsed().as_micros() as u64);
                    }
                    ok
                }
            };
            if !answered {
                failed += 1;
            }
        }
        (latency_us, failed)
    }
}

/// The tallies of `clients`, merged.
async fn merged(clients: Vec<tokio::task::JoinHandle<Tally>>) -> anyhow::Result<Tally> {
    let mut all = Histogram::<u64>::new(3).expect("valid sigfig");
    let mut failed = 0;
    for client in clients {
        let (latency_us, client_failed) = client.await?;
        all.add(&latency_us)?;
        failed += client_failed;
    }
    Ok((all, failed))
}

impl Workload for GetDuringPut {
    const NAME: &'static str = "get-during-put";

    async fn run(&self, run: &Run) -> anyhow::Result<Report> {
        let channel = |n: u64| run.channels[n as usize % run.channels.len()].clone();
        let value = vec![b'v'; self.val_size];
        crate::fill_objects(&mut KvClient::new(channel(0)), self.objects, &value, |i| {
            object_key(&self.prefix, i)
        })
        .await?;
        let bound = run
            .duration
            .unwrap_or(Duration::from_secs(10))
            .min(run.timeout);
        let started = Instant::now();
        let deadline = started + bound;
        let spawn = |role: Role, client: u64, conn: u64, period: Duration| {
            let kv = KvClient::new(channel(conn));
            tokio::spawn(self.clone().client(role, client, kv, period, deadline))
        };
        let writers: Vec<_> = (0..self.writers)
            .map(|i| spawn(Role::Writer, i, i, period(self.writers, self.put_rate)))
            .collect();
        let readers: Vec<_> = (0..self.readers)
            .map(|i| {
                let (client, conn) = (self.writers + i, i);
                spawn(
                    Role::Reader,
                    client,
                    conn,
                    period(self.readers, self.read_rate),
                )
            })
            .collect();
        let (puts, puts_failed) = merged(writers).await?;
        let (reads, reads_failed) = merged(readers).await?;
        let elapsed = started.elapsed();
        let mut extra = serde_json::Map::new();
        extra.insert("puts".into(), puts.len().into());
        extra.insert("puts_failed".into(), puts_failed.into());
        crate::insert_latencies(&mut extra, "put", &puts, &[("p50", 0.5), ("p99", 0.99)]);
        Ok(Report {
            workload: Self::NAME,
            requests: reads.len(),
            errors: reads_failed,
            elapsed,
            latency_us: reads,
            extra,
        })
    }
}
