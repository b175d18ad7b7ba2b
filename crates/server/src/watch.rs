//! The Watch service. One bidi stream multiplexes any number of watchers; one task per stream
//! reads requests and delivers events.
//!
//! Delivery is *pulled from history*: writers only publish the new store revision; a stream
//! reads the events its watchers have not seen, of the keys they watch, from the MVCC store's
//! revision index (`EventsFilter`: another stream's keys cost it a look, no copy), at most
//! `REVISIONS_PER_PASS_MAX` revisions per pass, and sends them. So a slow client never blocks a
//! writer and never loses an event: its watchers fall behind and catch up from history, and the
//! memory they hold is bounded by the response queue. A watcher whose next revision has been
//! compacted away is cancelled with the compaction revision, as in etcd.
//!
//! Grouping follows etcd: a watcher that is caught up gets one response per revision (header
//! revision = that revision); one catching up from history gets its events in responses of up to
//! 1000 of its own revisions (header revision = the current revision).

use std::collections::BTreeMap;
use std::sync::Arc;

use leasehold_api::etcdserverpb::{self as pb, watch_server::Watch};
use leasehold_api::mvccpb;
use leasehold_mvcc::{Event, EventKind, EventsFilter, key_in_range};
use pb::watch_create_request::FilterType;
use pb::watch_request::RequestUnion;
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt as _};
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status, Streaming};

use crate::context::ServerContext;
use crate::convert;
use crate::error::ApiError;

/// Store revisions read from history per pass: bounds the memory one pass holds.
const REVISIONS_PER_PASS_MAX: usize = 10_000;
/// Revisions of its own events a catching-up watcher gets per response (etcd's
/// `watchBatchMaxRevs`).
const REVISIONS_PER_RESPONSE_MAX: usize = 1000;
/// Responses a stream may have queued for its client.
const RESPONSE_QUEUE_LEN_MAX: usize = 128;
/// Watchers one stream may hold.
const WATCHERS_PER_STREAM_MAX: usize = 100_000;
/// etcd's id for responses that belong to no watcher (progress for the whole stream).
const NO_WATCH_ID: i64 = -1;

struct Watcher {
    key: Vec<u8>,
    range_end: Vec<u8>,
    /// The next revision this watcher has not been sent.
    next_revision: i64,
    /// Caught up: events go out one revision per response.
    synced: bool,
    no_put: bool,
    no_delete: bool,
    prev_kv: bool,
    fragment: bool,
    progress_notify: bool,
    /// Whether anything was sent since the last progress notification.
    sent_since_progress: bool,
}

impl Watcher {
    fn wants(&self, ev: &Event) -> bool {
        ev.kv.mod_revision >= self.next_revision
            && key_in_range(&self.key, &self.range_end, &ev.kv.key)
            && match ev.kind {
                EventKind::Put => !self.no_put,
                EventKind::Delete => !self.no_delete,
            }
    }

    fn to_wire(&self, ev: &Event) -> mvccpb::Event {
        convert::event(ev, self.prev_kv)
    }
}

/// The client went away: stop the stream.
struct Closed;

pub struct WatchService {
    ctx: Arc<ServerContext>,
}

impl WatchService {
    pub fn new(ctx: Arc<ServerContext>) -> WatchService {
        WatchService { ctx }
    }
}

impl WatchService {
    /// Opens one watch stream over `inbound` (the gRPC request stream, or the JSON gateway's
    /// decoded body) and returns its responses. `required`: the stream wants a leader
    /// ([`ServerContext::require_leader`]).
    pub(crate) fn open<S>(
        &self,
        required: bool,
        identity: (Option<String>, Option<String>),
        inbound: S,
    ) -> BoxStream<pb::WatchResponse>
    where
        S: Stream<Item = Result<pb::WatchRequest, Status>> + Unpin + Send + 'static,
    {
        let (tx, rx) = mpsc::channel(RESPONSE_QUEUE_LEN_MAX);
        let guard = (self.ctx.clone(), tx.clone());
        let stream = WatchStream {
            ctx: self.ctx.clone(),
            tx,
            watchers: BTreeMap::new(),
            next_id: 0,
            dirty: false,
            pumped_through: 0,
            progress_requested: 0,
            identity,
            counted: (0, 0),
        };
        self.ctx.metrics.watch.streams.inc();
        let task = stream.run(inbound);
        tokio::spawn(async move {
            let (ctx, tx) = guard;
            ctx.guard_leader(required, tx, task).await;
        });
        Box::pin(ReceiverStream::new(rx))
    }
}

#[tonic::async_trait]
impl Watch for WatchService {
    async fn watch(
        &self,
        req: Request<Streaming<pb::WatchRequest>>,
    ) -> Result<Response<BoxStream<pb::WatchResponse>>, Status> {
        let required = self.ctx.require_leader(&req)?;
        let identity = (crate::auth::token(&req), crate::auth::common_name(&req));
        Ok(Response::new(self.open(
            required,
            identity,
            req.into_inner(),
        )))
    }
}

struct WatchStream {
    ctx: Arc<ServerContext>,
    tx: mpsc::Sender<Result<pb::WatchResponse, Status>>,
    watchers: BTreeMap<i64, Watcher>,
    next_id: i64,
    /// Some watcher may have events to send: the revision moved, a watcher asked for history,
    /// or the last pass did not finish. Without it a burst of creates would rescan every watcher
    /// per request.
    dirty: bool,
    /// The store revision the last delivery pass read: no watcher was sent an event above it.
    pumped_through: i64,
    /// Progress requests not answered yet: each is answered once every watcher of the stream
    /// has been sent every event up to the revision it names (etcd#15220), so a client is
    /// never told "you have everything up to R" before it has.
    progress_requested: usize,
    /// The auth token and client certificate name the stream was opened with: each watcher it
    /// creates is checked for the caller they name then.
    identity: (Option<String>, Option<String>),
    /// This stream's share of the member's watcher gauges: (watchers, watchers catching up).
    counted: (i64, i64),
}

impl WatchStream {
    /// Brings this stream's share of the member's watcher gauges up to date.
    fn recount(&mut self) {
        let watchers = self.watchers.len() as i64;
        let slow = self.watchers.values().filter(|w| !w.synced).count() as i64;
        let counts = &self.ctx.metrics.watch;
        counts.watchers.inc_by(watchers - self.counted.0);
        counts.slow_watchers.inc_by(slow - self.counted.1);
        self.counted = (watchers, slow);
    }
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        let counts = &self.ctx.metrics.watch;
        counts.watchers.dec_by(self.counted.0);
        counts.slow_watchers.dec_by(self.counted.1);
        counts.streams.dec();
    }
}

impl WatchStream {
    /// Serves the stream until the client goes away. When the client only closes its side
    /// (no more requests), the watchers it made keep delivering, as in etcd, where the JSON
    /// gateway's watch is a request body followed by events.
    async fn run<S>(mut self, mut inbound: S)
    where
        S: Stream<Item = Result<pb::WatchRequest, Status>> + Unpin,
    {
        let mut inbound_open = true;
        // A clone, so the select below may wait on it while a branch borrows `self`.
        let tx = self.tx.clone();
        let mut revisions = self.ctx.replica.subscribe_revisions();
        let received = self.ctx.metrics.received_on("etcdserverpb.Watch", "Watch");
        let mut progress = tokio::time::interval(self.ctx.watch_progress_interval);
        progress.tick().await;
        loop {
            self.recount();
            if self.dirty {
                match self.pump().await {
                    Ok(behind) => self.dirty = behind,
                    Err(Closed) => return,
                }
            }
            if self.progress_requested > 0
                && !self.dirty
                && self.answer_progress_requests().await.is_err()
            {
                return;
            }
            let behind = self.dirty;
            tokio::select! {
                msg = inbound.next(), if inbound_open => match msg {
                    Some(Ok(req)) => {
                        received.one(req.encoded_len());
                        if self.handle(req).await.is_err() {
                            return;
                        }
                    }
                    // The client closed its side: no more requests, events still flow.
                    None => inbound_open = false,
                    // The stream broke.
                    Some(Err(_)) => return,
                },
                () = tx.closed() => return,
                changed = revisions.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    self.dirty = true;
                }
                _ = progress.tick() => {
                    if self.notify_progress().await.is_err() {
                        return;
                    }
                }
                () = std::future::ready(()), if behind => {}
            }
        }
    }

    async fn send(&self, resp: pb::WatchResponse) -> Result<(), Closed> {
        self.tx.send(Ok(resp)).await.map_err(|_| Closed)
    }

    async fn current_revision(&self) -> Result<i64, Closed> {
        match self.ctx.replica.read(false, |s| s.current_revision()).await {
            Ok(rev) => Ok(rev),
            Err(e) => {
                let _ = self.tx.send(Err(ApiError::from(e).into())).await;
                Err(Closed)
            }
        }
    }

    async fn handle(&mut self, req: pb::WatchRequest) -> Result<(), Closed> {
        match req.request_union {
            Some(RequestUnion::CreateRequest(create)) => self.create(create).await,
            Some(RequestUnion::CancelRequest(cancel)) => {
                if self.watchers.remove(&cancel.watch_id).is_some() {
                    let rev = self.current_revision().await?;
                    self.send(pb::WatchResponse {
                        header: self.ctx.header().at(rev),
                        watch_id: cancel.watch_id,
                        canceled: true,
                        ..Default::default()
                    })
                    .await?;
                }
                Ok(())
            }
            Some(RequestUnion::ProgressRequest(_)) => {
                // Answered by the run loop after a delivery pass leaves no watcher behind.
                self.progress_requested += 1;
                self.dirty = true;
                Ok(())
            }
            None => Ok(()),
        }
    }

    async fn create(&mut self, create: pb::WatchCreateRequest) -> Result<(), Closed> {
        let rev = self.current_revision().await?;
        let refuse = |reason: &str| pb::WatchResponse {
            header: self.ctx.header().at(rev),
            watch_id: NO_WATCH_ID,
            created: true,
            canceled: true,
            cancel_reason: reason.to_owned(),
            ..Default::default()
        };
        if self.watchers.len() >= WATCHERS_PER_STREAM_MAX {
            return self
                .send(refuse("leasehold: too many watchers on one stream"))
                .await;
        }
        // An empty key means the smallest key, as in etcd.
        let key = if create.key.is_empty() {
            vec![0]
        } else {
            create.key
        };
        // The caller must be allowed to read the whole range (etcd refuses the watcher, not the
        // stream, with the status as text).
        let allowed = self
            .ctx
            .caller_of(self.identity.0.as_deref(), self.identity.1.as_deref())
            .and_then(|caller| {
                self.ctx
                    .check_read(caller.as_ref(), &key, &create.range_end)
            });
        if let Err(e) = allowed {
            let status = Status::from(e);
            let reason = format!(
                "rpc error: code = {:?} desc = {}",
                status.code(),
                status.message()
            );
            return self.send(refuse(&reason)).await;
        }
        // `[0]` means every key from `key` on; any other end must lie above the key.
        if !create.range_end.is_empty() && create.range_end != [0] && key >= create.range_end {
            return self.send(refuse("mvcc: watcher range is empty")).await;
        }
        let id = if create.watch_id == 0 {
            while self.watchers.contains_key(&self.next_id) {
                self.next_id += 1;
            }
            self.next_id += 1;
            self.next_id - 1
        } else if self.watchers.contains_key(&create.watch_id) {
            return self
                .send(refuse(
                    "mvcc: duplicate watch ID provided on the WatchStream",
                ))
                .await;
        } else {
            create.watch_id
        };
        let next_revision = if create.start_revision <= 0 {
            rev + 1
        } else {
            create.start_revision
        };
        let filters = |f: FilterType| create.filters.contains(&(f as i32));
        self.watchers.insert(
            id,
            Watcher {
                key,
                range_end: create.range_end,
                next_revision,
                synced: next_revision > rev,
                no_put: filters(FilterType::Noput),
                no_delete: filters(FilterType::Nodelete),
                prev_kv: create.prev_kv,
                fragment: create.fragment,
                progress_notify: create.progress_notify,
                sent_since_progress: false,
            },
        );
        // History to replay: the next pass has work.
        self.dirty |= next_revision <= rev;
        self.send(pb::WatchResponse {
            header: self.ctx.header().at(rev),
            watch_id: id,
            created: true,
            ..Default::default()
        })
        .await
    }

    /// One delivery pass. Returns whether some watcher is still behind.
    async fn pump(&mut self) -> Result<bool, Closed> {
        let Some(from) = self.watchers.values().map(|w| w.next_revision).min() else {
            return Ok(false);
        };
        let read = self
            .ctx
            .replica
            .read(false, |s| (s.current_revision(), s.compact_revision()))
            .await;
        let (current, compacted) = match read {
            Ok(read) => read,
            Err(e) => {
                let _ = self.tx.send(Err(ApiError::from(e).into())).await;
                return Err(Closed);
            }
        };
        let from = from.max(compacted);
        // Only the events some watcher of this stream wants, and previous versions only if one
        // asks for them: the other streams' keys are not copied here (nor read back from the
        // file), however many streams there are.
        let filter = EventsFilter::keys(
            self.watchers
                .values()
                .map(|w| (w.key.as_slice(), w.range_end.as_slice())),
            self.watchers.values().any(|w| w.prev_kv),
        );
        // Read a part at a time, so that a long history (or one revision that deleted many keys)
        // does not hold writes back.
        let events = if from <= current {
            match self
                .ctx
                .replica
                .events(from, current, REVISIONS_PER_PASS_MAX, compacted, filter)
                .await
            {
                Ok(events) => events,
                // Compacted while it read: the next pass starts from the new compaction point
                // (and cancels the watchers it left behind).
                Err(_) => return Ok(true),
            }
        } else {
            Vec::new()
        };
        self.pumped_through = current;
        // The pass covers every revision up to `upto` (all of them unless the batch was cut).
        let distinct = {
            let mut revs: Vec<i64> = events.iter().map(|e| e.kv.mod_revision).collect();
            revs.dedup();
            revs
        };
        let upto = if distinct.len() == REVISIONS_PER_PASS_MAX {
            *distinct.last().expect("non-empty")
        } else {
            current
        };
        let mut behind = false;
        let ids: Vec<i64> = self.watchers.keys().copied().collect();
        for id in ids {
            let w = &self.watchers[&id];
            if w.next_revision > upto {
                continue;
            }
            if w.next_revision < compacted {
                self.watchers.remove(&id);
                self.send(pb::WatchResponse {
                    header: self.ctx.header().at(0),
                    watch_id: id,
                    canceled: true,
                    compact_revision: compacted,
                    ..Default::default()
                })
                .await?;
                continue;
            }
            let mine: Vec<&Event> = events.iter().filter(|e| w.wants(e)).collect();
            let mut responses = Vec::new();
            // Where this watcher continues: after the pass, unless its own batch was cut.
            let mut next_revision = upto + 1;
            if w.synced {
                for group in mine.chunk_by(|a, b| a.kv.mod_revision == b.kv.mod_revision) {
                    let revision = group[0].kv.mod_revision;
                    responses.push((revision, group.iter().map(|e| w.to_wire(e)).collect()));
                }
            } else if !mine.is_empty() {
                let groups: Vec<&[&Event]> = mine
                    .chunk_by(|a, b| a.kv.mod_revision == b.kv.mod_revision)
                    .collect();
                let take = groups.len().min(REVISIONS_PER_RESPONSE_MAX);
                if take < groups.len() {
                    next_revision = groups[take][0].kv.mod_revision;
                }
                let batch: Vec<mvccpb::Event> = groups[..take]
                    .iter()
                    .flat_map(|g| g.iter())
                    .map(|e| w.to_wire(e))
                    .collect();
                responses.push((current, batch));
            }
            let fragment = w.fragment;
            let any = !responses.is_empty();
            for (revision, events) in responses {
                self.ctx.metrics.watch.events.inc_by(events.len() as u64);
                let resp = pb::WatchResponse {
                    header: self.ctx.header().at(revision),
                    watch_id: id,
                    events,
                    ..Default::default()
                };
                let bytes_max = self.ctx.limits.request_bytes_max;
                for part in fragments(resp, fragment, bytes_max) {
                    self.send(part).await?;
                }
            }
            let w = self.watchers.get_mut(&id).expect("still here");
            w.next_revision = next_revision;
            w.synced = next_revision > current;
            w.sent_since_progress |= any;
            behind |= next_revision <= current;
        }
        Ok(behind)
    }

    /// The revision through which every watcher of the stream has been sent its events.
    fn delivered_through(&self) -> i64 {
        self.watchers
            .values()
            .map(|w| w.next_revision - 1)
            .fold(self.pumped_through, i64::min)
    }

    /// Answers the pending progress requests (once no watcher is behind): with the revision
    /// every watcher has been sent everything up to, as etcd 3.5 does; etcd 3.4 answered with
    /// the current revision at once, events still unsent.
    async fn answer_progress_requests(&mut self) -> Result<(), Closed> {
        let rev = if self.watchers.is_empty() {
            self.current_revision().await?
        } else {
            self.delivered_through()
        };
        while self.progress_requested > 0 {
            self.progress_requested -= 1;
            self.send_progress(NO_WATCH_ID, rev).await?;
        }
        Ok(())
    }

    /// A progress response: no events, the header at `rev`.
    async fn send_progress(&self, watch_id: i64, rev: i64) -> Result<(), Closed> {
        self.send(pb::WatchResponse {
            header: self.ctx.header().at(rev),
            watch_id,
            ..Default::default()
        })
        .await
    }

    /// Tells idle, caught-up watchers that asked for it how far the store has come: after a
    /// delivery pass, and only as far as each was sent its events.
    async fn notify_progress(&mut self) -> Result<(), Closed> {
        self.dirty = self.pump().await?;
        let pumped_through = self.pumped_through;
        let due: Vec<(i64, i64)> = self
            .watchers
            .iter()
            .filter(|(_, w)| w.progress_notify && w.synced && !w.sent_since_progress)
            .map(|(id, w)| (*id, (w.next_revision - 1).min(pumped_through)))
            .collect();
        for w in self.watchers.values_mut() {
            w.sent_since_progress = false;
        }
        for (id, rev) in due {
            self.send_progress(id, rev).await?;
        }
        Ok(())
    }
}

/// Splits a response too big for one message into fragments, if the watcher allows it (etcd's
/// rule: only above the request size limit, `bytes_max`, and never inside one event).
fn fragments(resp: pb::WatchResponse, allowed: bool, bytes_max: usize) -> Vec<pb::WatchResponse> {
    if !allowed || resp.encoded_len() < bytes_max || resp.events.len() < 2 {
        return vec![resp];
    }
    let mut parts = Vec::new();
    let mut current = pb::WatchResponse {
        events: Vec::new(),
        ..resp.clone()
    };
    for ev in resp.events {
        if !current.events.is_empty() && current.encoded_len() + ev.encoded_len() > bytes_max {
            let next = pb::WatchResponse {
                events: Vec::new(),
                ..current.clone()
            };
            parts.push(std::mem::replace(&mut current, next));
        }
        current.events.push(ev);
    }
    parts.push(current);
    let last = parts.len() - 1;
    for (i, part) in parts.iter_mut().enumerate() {
        part.fragment = i != last;
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn big_responses_split_between_events_and_small_ones_do_not() {
        let ev = |n: usize| mvccpb::Event {
            kv: Some(mvccpb::KeyValue {
                key: vec![b'k'; 8],
                value: vec![b'v'; n].into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let small = pb::WatchResponse {
            events: vec![ev(10), ev(10)],
            ..Default::default()
        };
        let max = crate::validate::REQUEST_BYTES_MAX_DEFAULT;
        assert_eq!(fragments(small.clone(), true, max).len(), 1);
        let big = pb::WatchResponse {
            events: (0..4).map(|_| ev(600 * 1024)).collect(),
            ..Default::default()
        };
        assert_eq!(
            fragments(big.clone(), false, max).len(),
            1,
            "not asked to fragment"
        );
        let parts = fragments(big, true, max);
        assert_eq!(parts.len(), 2);
        assert_eq!(parts.iter().map(|p| p.events.len()).sum::<usize>(), 4);
        assert!(parts[0].fragment && !parts[1].fragment);
        assert!(parts.iter().all(|p| p.encoded_len() <= max));
    }
}
