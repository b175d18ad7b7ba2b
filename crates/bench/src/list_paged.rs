//! `list-paged`: kube-apiserver's LIST of one resource, as it reads it from etcd when the watch
//! cache does not answer (`pagedChunks` in apiserver's `storage/etcd3/store.go`): the first page
//! is `[prefix, prefix_end)` with a limit at the current revision; every next page starts just
//! after the last key of the one before, pinned to the first page's revision, until `more` is
//! false. One request is one whole list.

use clap::Args;
use leasehold_api::etcdserverpb::{RangeRequest, kv_client::KvClient};
use tonic::transport::Channel;

use crate::closed_loop::{self, Requests};
use crate::{Report, Run, Workload};

#[derive(Args, Debug, Clone)]
pub struct ListPaged {
    /// The resource's prefix, as kube-apiserver lays keys out.
    #[arg(long, default_value = "/registry/configmaps/bench/")]
    prefix: String,
    /// Objects under the prefix, written before the run.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    objects: u64,
    /// Bytes per object.
    #[arg(long, default_value_t = 1024)]
    val_size: usize,
    /// Keys per page (kubectl's --chunk-size default is 500).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(i64).range(1..))]
    page: i64,
}

impl ListPaged {
    fn key(&self, i: u64) -> Vec<u8> {
        format!("{}object-{i:08}", self.prefix).into_bytes()
    }
}

impl Requests for ListPaged {
    type Client = KvClient<Channel>;

    async fn start(&self, channel: Channel, _seed: u64) -> anyhow::Result<KvClient<Channel>> {
        Ok(KvClient::new(channel))
    }

    /// One whole list; true only when it returned every object once, in key order.
    async fn request(&self, kv: &mut KvClient<Channel>, _n: u64) -> bool {
        let end = leasehold_types::prefix_range_end(self.prefix.as_bytes());
        let mut from = self.prefix.clone().into_bytes();
        let mut revision = 0;
        let mut seen = 0u64;
        loop {
            let page = kv
                .range(RangeRequest {
                    key: from.clone(),
                    range_end: end.clone(),
                    limit: self.page,
                    revision,
                    ..Default::default()
                })
                .await;
            let Ok(page) = page.map(tonic::Response::into_inner) else {
                return false;
            };
            if revision == 0 {
                revision = page.header.as_ref().map_or(0, |h| h.revision);
            }
            seen += page.kvs.len() as u64;
            match page.kvs.last() {
                Some(last) if page.more => {
                    from = last.key.clone();
                    from.push(0);
                }
                _ => return seen == self.objects,
            }
        }
    }
}

impl Workload for ListPaged {
    const NAME: &'static str = "list-paged";

    async fn run(&self, run: &Run) -> anyhow::Result<Report> {
        let mut kv = KvClient::new(run.channels[0].clone());
        crate::fill_objects(&mut kv, self.objects, &vec![b'x'; self.val_size], |i| {
            self.key(i)
        })
        .await?;
        closed_loop::run(Self::NAME, self, run).await
    }
}
