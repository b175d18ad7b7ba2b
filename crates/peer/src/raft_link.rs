//! The raft-rs engine's messages between members (`Raft/Messages`): one long-lived stream from
//! each member to each peer, fed by a bounded queue, so the Raft thread hands a message over
//! without waiting and the link sends it while that thread writes its log. Bytes only: this
//! module neither encodes nor decodes Raft messages (leasehold-consensus does, with its own
//! types), so it knows no engine.
//!
//! ```text
//!   Raft thread ─► RaftLinks::send(to, bytes) ─► queue(to) ─► link task ═stream═► RaftService
//!                                                                         ─► RaftInbox::deliver
//! ```
//!
//! A link that cannot deliver (no connection, a full queue, a stream that broke) reports the
//! peer unreachable, so Raft stops sending it appends optimistically; what was in flight is
//! lost and Raft sends it again. A queue is full at [`LINK_QUEUE_LEN`] messages, or, for a large
//! message, at [`LINK_QUEUE_BYTES`]: a follower catching up on a long backlog then holds the
//! leader to a few MiB of encoded appends at a time instead of the whole backlog a second time
//! (Raft's own bound is 512 appends of 1 MiB).
//!
//! With a keepalive ([`RaftLinks::with_keepalive`]) a link connects at once and sends an empty
//! payload whenever it has been idle for the interval; its stream names the sender
//! ([`SENDER_HEADER`]), and the receiving side tells its inbox it heard from that member. So
//! every member hears from every other all the time, as etcd's members keep streams to each
//! other, not only the leader's followers from the leader: a member that becomes leader knows
//! for how long it has been connected to each voter (what `--strict-reconfig-check` asks).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_api::leaseholdpeerpb::Payload;
use leasehold_api::leaseholdpeerpb::raft_server::{Raft, RaftServer};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::traffic::{PeerCounts, Traffic};
use crate::{PEER_MESSAGE_BYTES_MAX, PeerNetwork, cluster_id};

/// Messages waiting for one peer at most; past it a message is dropped and the peer reported
/// unreachable (a peer that slow is better caught up by Raft's probing than by a backlog).
pub const LINK_QUEUE_LEN: usize = 4096;
/// Bytes waiting for one peer (queued, or handed to the stream and not yet taken by it) past
/// which a large message is dropped and the peer reported unreachable, as for a full queue.
pub const LINK_QUEUE_BYTES: usize = 2 << 20;
/// A message up to this size is never dropped for the bytes waiting: heartbeats, votes, their
/// answers and the appends of a steady load go through while a catch-up fills the queue.
const LINK_SMALL_BYTES: usize = 64 << 10;
/// Messages handed to the stream but not yet sent.
const LINK_STREAM_LEN: usize = 256;
const RETRY_MIN: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(1);

/// How long a follower receiving a snapshot's file waits for each chunk of it.
pub const SNAPSHOT_CHUNK_WAIT_MAX: Duration = Duration::from_secs(10);

/// The request header that names the member a link's stream comes from (hex id).
pub const SENDER_HEADER: &str = "leasehold-from";

/// Where a member's incoming Raft messages go.
pub trait RaftInbox: Send + Sync + 'static {
    /// One message from a peer, as it was sent; `Err` ends the stream with `INVALID_ARGUMENT`
    /// (bytes that are not a message for this member).
    fn deliver(&self, message: Vec<u8>) -> Result<(), String>;

    /// A keepalive came from `peer` (an empty payload on a stream that named its sender).
    fn heard(&self, _peer: u64) {}
}

/// Called with a peer's ID when a message to it could not be delivered.
pub type OnUnreachable = Arc<dyn Fn(u64) + Send + Sync>;

/// The sending side: a link per peer.
pub struct RaftLinks {
    network: PeerNetwork,
    runtime: tokio::runtime::Handle,
    on_unreachable: OnUnreachable,
    links: Mutex<HashMap<u64, Link>>,
    keepalive: Option<Keepalive>,
}

/// A link's keepalive: who sends, and how long a link may be idle.
#[derive(Clone, Copy, Debug)]
struct Keepalive {
    sender: u64,
    idle: Duration,
}

struct Link {
    addr: String,
    queue: mpsc::Sender<Queued>,
    /// The bytes of the messages on their way to the peer: counted up when queued, down when
    /// the stream takes them or they are dropped ([`Queued`]).
    waiting: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
    counts: Arc<PeerCounts>,
}

/// A message on its way to a peer; its bytes count in the link's `waiting` until the stream
/// takes it ([`Queued::into_payload`]) or it is dropped with a stream that broke.
struct Queued {
    data: Vec<u8>,
    waiting: Option<Arc<AtomicUsize>>,
    bytes: usize,
}

impl Queued {
    fn counted(data: Vec<u8>, waiting: &Arc<AtomicUsize>) -> Queued {
        let bytes = data.len();
        waiting.fetch_add(bytes, Ordering::Relaxed);
        Queued {
            data,
            waiting: Some(waiting.clone()),
            bytes,
        }
    }

    /// A keepalive: an empty payload, counted nowhere.
    fn keepalive() -> Queued {
        Queued {
            data: Vec::new(),
            waiting: None,
            bytes: 0,
        }
    }

    fn into_payload(mut self) -> Payload {
        Payload {
            data: std::mem::take(&mut self.data),
        }
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        if let Some(waiting) = &self.waiting {
            waiting.fetch_sub(self.bytes, Ordering::Relaxed);
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How long a link that closes may go on sending what was queued on it.
const LINK_CLOSE_MAX: Duration = Duration::from_secs(1);

impl Link {
    /// Closes the link once what is queued on it is sent (within [`LINK_CLOSE_MAX`]): a member
    /// a leader has just removed still gets the commit that tells it so, queued before the
    /// leader applied the removal.
    fn close(mut self, runtime: &tokio::runtime::Handle) {
        let mut task = std::mem::replace(&mut self.task, runtime.spawn(async {}));
        drop(self); // the queue's sender: the task sends what is left, then ends
        runtime.spawn(async move {
            if tokio::time::timeout(LINK_CLOSE_MAX, &mut task)
                .await
                .is_err()
            {
                task.abort();
            }
        });
    }
}

impl std::fmt::Debug for RaftLinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let links = self.links.lock().expect("raft links lock poisoned");
        f.debug_struct("RaftLinks")
            .field("peers", &links.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl RaftLinks {
    /// Links over `network`; their tasks run on the current Tokio runtime.
    pub fn new(network: PeerNetwork, on_unreachable: OnUnreachable) -> RaftLinks {
        RaftLinks {
            network,
            runtime: tokio::runtime::Handle::current(),
            on_unreachable,
            links: Mutex::new(HashMap::new()),
            keepalive: None,
        }
    }

    /// Links that connect at once and send a keepalive after `idle` without a message, naming
    /// `sender` (this member) to the peer (see the module header).
    pub fn with_keepalive(mut self, sender: u64, idle: Duration) -> RaftLinks {
        self.keepalive = Some(Keepalive { sender, idle });
        self
    }

    /// The peers to link to, by ID and peer URL: links to others close, a peer whose URL
    /// changed is linked anew.
    pub fn set_peers(&self, peers: impl IntoIterator<Item = (u64, String)>) {
        let peers: HashMap<u64, String> = peers.into_iter().collect();
        let mut links = self.links.lock().expect("raft links lock poisoned");
        let gone: Vec<u64> = links
            .iter()
            .filter(|(id, link)| peers.get(id) != Some(&link.addr))
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            if let Some(link) = links.remove(&id) {
                link.close(&self.runtime);
            }
        }
        for (id, addr) in peers {
            if links.contains_key(&id) {
                continue;
            }
            let (queue, queued) = mpsc::channel(LINK_QUEUE_LEN);
            let waiting = Arc::new(AtomicUsize::new(0));
            let counts = self.network.traffic().of(id);
            let task = self.runtime.spawn(run_link(
                self.network.clone(),
                id,
                addr.clone(),
                queued,
                self.on_unreachable.clone(),
                self.keepalive,
            ));
            links.insert(
                id,
                Link {
                    addr,
                    queue,
                    waiting,
                    task,
                    counts,
                },
            );
        }
    }

    /// The bytes on their way to peer `to`: queued, or handed to its stream and not yet taken.
    pub fn waiting_bytes(&self, to: u64) -> usize {
        let links = self.links.lock().expect("raft links lock poisoned");
        links
            .get(&to)
            .map_or(0, |link| link.waiting.load(Ordering::Relaxed))
    }

    /// Streams the snapshot's file `request` names (a Raft snapshot's data) from peer `from`
    /// into `into`. Blocking: call it off the runtime. Each chunk must come within
    /// [`SNAPSHOT_CHUNK_WAIT_MAX`].
    pub fn fetch_snapshot(
        &self,
        from: u64,
        request: Vec<u8>,
        into: &mut dyn std::io::Write,
    ) -> Result<(), String> {
        let addr = {
            let links = self.links.lock().expect("raft links lock poisoned");
            links.get(&from).map(|link| link.addr.clone())
        };
        let addr = addr.ok_or_else(|| format!("no link to member {from:x}"))?;
        let mut client = self.network.client(&addr).map_err(|e| e.to_string())?;
        let late = || {
            format!(
                "no chunk of the snapshot's file from {addr} within {SNAPSHOT_CHUNK_WAIT_MAX:?}"
            )
        };
        self.runtime.block_on(async {
            let asked = client.snapshot_file(Payload { data: request });
            let mut stream = tokio::time::timeout(SNAPSHOT_CHUNK_WAIT_MAX, asked)
                .await
                .map_err(|_| late())?
                .map_err(|status| format!("{addr}: {}", status.message()))?
                .into_inner();
            loop {
                let chunk = tokio::time::timeout(SNAPSHOT_CHUNK_WAIT_MAX, stream.message())
                    .await
                    .map_err(|_| late())?
                    .map_err(|status| format!("{addr}: {}", status.message()))?;
                match chunk {
                    Some(chunk) => into.write_all(&chunk.data).map_err(|e| e.to_string())?,
                    None => return Ok(()),
                }
            }
        })
    }

    /// Queues `message` for peer `to` without waiting (callable from any thread).
    pub fn send(&self, to: u64, message: Vec<u8>) {
        let queued = {
            let links = self.links.lock().expect("raft links lock poisoned");
            match links.get(&to) {
                Some(link) => {
                    let bytes = message.len();
                    let waiting = link.waiting.load(Ordering::Relaxed);
                    let over = bytes > LINK_SMALL_BYTES
                        && waiting > 0
                        && waiting + bytes > LINK_QUEUE_BYTES;
                    // A message the queue refuses drops here, and its bytes with it.
                    let queued = !over
                        && link
                            .queue
                            .try_send(Queued::counted(message, &link.waiting))
                            .is_ok();
                    if !queued {
                        self.network.traffic().not_sent(&link.counts);
                    }
                    queued
                }
                None => false,
            }
        };
        if !queued {
            (self.on_unreachable)(to);
        }
    }
}

/// One peer's link: connects when there is something to send (at once, with a keepalive),
/// pumps the queue into a stream, and after a failure reports the peer and tries again,
/// backing off up to a second.
async fn run_link(
    network: PeerNetwork,
    id: u64,
    addr: String,
    mut queue: mpsc::Receiver<Queued>,
    on_unreachable: OnUnreachable,
    keepalive: Option<Keepalive>,
) {
    let traffic = network.traffic();
    let counts = traffic.of(id);
    let mut retry = RETRY_MIN;
    // The TLS refusal last logged for this link.
    let mut told: Option<String> = None;
    loop {
        // With a keepalive the stream opens with one, without waiting for a message.
        let first = match keepalive {
            Some(_) => Queued::keepalive(),
            None => match queue.recv().await {
                Some(first) => first,
                None => return,
            },
        };
        let mut client = match network.raft_client(&addr) {
            Ok(client) => client,
            Err(e) => {
                tracing::warn!(peer = %format!("{id:x}"), "raft link: {e}");
                on_unreachable(id);
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(RETRY_MAX);
                continue;
            }
        };
        let (stream, outgoing) = mpsc::channel(LINK_STREAM_LEN);
        let _ = stream.try_send(first);
        let mut request = Request::new(ReceiverStream::new(outgoing).map(Queued::into_payload));
        if let Some(k) = keepalive
            && let Ok(sender) = format!("{:x}", k.sender).parse()
        {
            request.metadata_mut().insert(SENDER_HEADER, sender);
        }
        let opened = std::time::Instant::now();
        let call = client.messages(request);
        tokio::pin!(call);
        // A period that never ends when there is no keepalive.
        let idle = keepalive.map_or(Duration::from_secs(86_400 * 365), |k| k.idle);
        let ended = loop {
            tokio::select! {
                ended = &mut call => break ended.err(),
                next = queue.recv() => {
                    let Some(message) = next else {
                        // Closed: end the stream after what it holds, and let the peer answer.
                        drop(stream);
                        let _ = tokio::time::timeout(LINK_CLOSE_MAX, &mut call).await;
                        return;
                    };
                    let bytes = message.bytes;
                    if stream.send(message).await.is_err() {
                        traffic.not_sent(&counts);
                        break None;
                    }
                    traffic.sent(&counts, bytes);
                    // Delivered to the stream: the link works.
                    retry = RETRY_MIN;
                }
                () = tokio::time::sleep(idle) => {
                    // Handed over only if the stream has room: a keepalive never waits.
                    if let Err(mpsc::error::TrySendError::Closed(_)) =
                        stream.try_send(Queued::keepalive())
                    {
                        break None;
                    }
                }
            }
        };
        let tls_words = ended.as_ref().and_then(|e| tls_alert_words(e));
        match tls_words {
            // The peer refused this member's certificate (or this member refused the peer's):
            // said in Go's words, as etcd's members log it, for operators and their tools;
            // once, not at every retry.
            Some(words) if told.as_ref() != Some(&words) => {
                tracing::warn!(
                    "remote-peer-id" = %format!("{id:x}"),
                    error = %words,
                    "lost TCP streaming connection with remote peer"
                );
                told = Some(words);
            }
            tls_words => {
                if tls_words.is_none() && opened.elapsed() >= RETRY_MAX {
                    // A stream that worked a while ended otherwise: a refusal after it is news
                    // again. (Refused connections also end as broken pipes in between.)
                    told = None;
                }
                tracing::debug!(
                    peer = %format!("{id:x}"),
                    status = ?ended,
                    "raft link broke; reconnecting"
                );
            }
        }
        on_unreachable(id);
        tokio::time::sleep(retry).await;
        retry = (retry * 2).min(RETRY_MAX);
    }
}

/// The receiving side.
pub struct RaftService {
    inbox: Arc<dyn RaftInbox>,
    /// What each peer sent (counted for streams that name their sender).
    traffic: Arc<Traffic>,
}

impl RaftService {
    /// The service, refusing streams stamped with another cluster's ID.
    pub fn server(
        inbox: Arc<dyn RaftInbox>,
        cluster_id: u64,
    ) -> tonic::service::interceptor::InterceptedService<
        RaftServer<RaftService>,
        impl tonic::service::Interceptor + Clone,
    > {
        RaftService::counted(inbox, cluster_id, Arc::default())
    }

    /// [`RaftService::server`], counting what each peer sends in `traffic`.
    pub fn counted(
        inbox: Arc<dyn RaftInbox>,
        cluster_id: u64,
        traffic: Arc<Traffic>,
    ) -> tonic::service::interceptor::InterceptedService<
        RaftServer<RaftService>,
        impl tonic::service::Interceptor + Clone,
    > {
        tonic::service::interceptor::InterceptedService::new(
            RaftServer::new(RaftService { inbox, traffic })
                .max_decoding_message_size(PEER_MESSAGE_BYTES_MAX)
                .max_encoding_message_size(PEER_MESSAGE_BYTES_MAX),
            cluster_id::Check::new(cluster_id),
        )
    }
}

#[tonic::async_trait]
impl Raft for RaftService {
    async fn messages(
        &self,
        request: Request<Streaming<Payload>>,
    ) -> Result<Response<Payload>, Status> {
        let sender = request
            .metadata()
            .get(SENDER_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| u64::from_str_radix(v, 16).ok());
        let counts = sender.map(|id| self.traffic.of(id));
        let mut messages = request.into_inner();
        while let Some(payload) = messages.message().await? {
            if let Some(counts) = &counts {
                self.traffic.received(counts, payload.data.len());
            }
            if payload.data.is_empty() {
                // A keepalive: nothing for Raft.
                if let Some(sender) = sender {
                    self.inbox.heard(sender);
                }
                continue;
            }
            self.inbox
                .deliver(payload.data)
                .map_err(|e| Status::invalid_argument(format!("raft message refused: {e}")))?;
        }
        Ok(Response::new(Payload::default()))
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    #[derive(Default)]
    struct Collect {
        got: Mutex<Vec<Vec<u8>>>,
        heard: Mutex<Vec<u64>>,
        arrived: tokio::sync::Notify,
    }

    impl RaftInbox for Collect {
        fn deliver(&self, message: Vec<u8>) -> Result<(), String> {
            if message == b"poison" {
                return Err("not a raft message".into());
            }
            self.got.lock().unwrap().push(message);
            self.arrived.notify_waiters();
            Ok(())
        }

        fn heard(&self, peer: u64) {
            self.heard.lock().unwrap().push(peer);
        }
    }

    #[tokio::test]
    async fn an_idle_link_with_a_keepalive_is_heard_from_and_delivers_no_message() {
        let inbox = Arc::new(Collect::default());
        let (addr, _stop) = serve(inbox.clone(), 0xc1).await;
        let (unreachable, _) = counting();
        let links = RaftLinks::new(PeerNetwork::new().for_cluster(0xc1), unreachable)
            .with_keepalive(0x7e, Duration::from_millis(20));
        // Nothing is ever sent: the link connects on its own and keeps saying who it is.
        links.set_peers([(2, addr)]);
        let waited = tokio::time::timeout(Duration::from_secs(10), async {
            while inbox.heard.lock().unwrap().len() < 3 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(waited.is_ok(), "heard {:?}", inbox.heard.lock().unwrap());
        assert!(inbox.heard.lock().unwrap().iter().all(|&id| id == 0x7e));
        assert!(
            inbox.got.lock().unwrap().is_empty(),
            "a keepalive is no Raft message"
        );
        // A link without one opens nothing until there is something to send.
        let quiet = Arc::new(Collect::default());
        let (addr, _stop) = serve(quiet.clone(), 0xc1).await;
        let (unreachable, _) = counting();
        let links = RaftLinks::new(PeerNetwork::new().for_cluster(0xc1), unreachable);
        links.set_peers([(3, addr)]);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(quiet.heard.lock().unwrap().is_empty());
    }

    async fn serve(
        inbox: Arc<Collect>,
        cluster_id: u64,
    ) -> (String, tokio::sync::oneshot::Sender<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = format!("http://{}", listener.local_addr().expect("addr"));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RaftService::server(inbox, cluster_id))
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    async {
                        let _ = stopped.await;
                    },
                ),
        );
        (addr, stop)
    }

    async fn wait_for(inbox: &Collect, count: usize) {
        let waited = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let arrived = inbox.arrived.notified();
                if inbox.got.lock().unwrap().len() >= count {
                    return;
                }
                arrived.await;
            }
        })
        .await;
        assert!(
            waited.is_ok(),
            "{} of {count} arrived",
            inbox.got.lock().unwrap().len()
        );
    }

    fn counting() -> (OnUnreachable, Arc<AtomicUsize>) {
        let count = Arc::new(AtomicUsize::new(0));
        let c = count.clone();
        (
            Arc::new(move |_| {
                c.fetch_add(1, Ordering::SeqCst);
            }),
            count,
        )
    }

    #[tokio::test]
    async fn messages_arrive_in_order_over_one_stream() {
        let inbox = Arc::new(Collect::default());
        let (addr, _stop) = serve(inbox.clone(), 0xc1).await;
        let (unreachable, reported) = counting();
        let links = RaftLinks::new(PeerNetwork::new().for_cluster(0xc1), unreachable);
        links.set_peers([(2, addr)]);
        // Sent from a thread that is not the runtime's, as the Raft thread sends.
        let links = Arc::new(links);
        let sender = links.clone();
        std::thread::spawn(move || {
            for i in 0u32..1000 {
                sender.send(2, i.to_be_bytes().to_vec());
            }
        })
        .join()
        .expect("sender thread");
        wait_for(&inbox, 1000).await;
        let got = inbox.got.lock().unwrap().clone();
        let expected: Vec<Vec<u8>> = (0u32..1000).map(|i| i.to_be_bytes().to_vec()).collect();
        assert_eq!(got, expected);
        assert_eq!(reported.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn large_messages_wait_for_a_peer_up_to_a_bound_in_bytes_and_small_ones_past_it() {
        // A peer that accepts the connection and never answers: what is sent to it waits (and
        // on this test's one thread the link's task does not even run before the asserts).
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = format!("http://{}", listener.local_addr().expect("addr"));
        let held = tokio::spawn(async move {
            let mut sockets = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                sockets.push(socket);
            }
        });
        let (unreachable, reported) = counting();
        let links = RaftLinks::new(PeerNetwork::new(), unreachable);
        links.set_peers([(2, addr)]);
        let large = LINK_QUEUE_BYTES / 2;
        links.send(2, vec![1; large]);
        links.send(2, vec![2; large]);
        assert_eq!(
            reported.load(Ordering::SeqCst),
            0,
            "the bound is not passed yet"
        );
        assert_eq!(links.waiting_bytes(2), 2 * large);
        links.send(2, vec![3; large]);
        assert_eq!(
            reported.load(Ordering::SeqCst),
            1,
            "past the bound: dropped"
        );
        assert_eq!(links.waiting_bytes(2), 2 * large, "and not counted");
        links.send(2, vec![4; 100]);
        assert_eq!(
            reported.load(Ordering::SeqCst),
            1,
            "a small message still goes"
        );
        assert_eq!(links.waiting_bytes(2), 2 * large + 100);
        held.abort();

        // A large message goes alone into an empty queue, whatever its size; what a peer took
        // counts no more, so the next ones go too.
        let inbox = Arc::new(Collect::default());
        let (addr, _stop) = serve(inbox.clone(), 0xc1).await;
        let (unreachable, reported) = counting();
        let links = RaftLinks::new(PeerNetwork::new().for_cluster(0xc1), unreachable);
        links.set_peers([(2, addr)]);
        links.send(2, vec![5; 2 * LINK_QUEUE_BYTES]);
        wait_for(&inbox, 1).await;
        for round in 0..3 {
            links.send(2, vec![6; large]);
            links.send(2, vec![7; large]);
            wait_for(&inbox, 3 + 2 * round).await;
        }
        assert_eq!(reported.load(Ordering::SeqCst), 0);
        let drained = tokio::time::timeout(Duration::from_secs(10), async {
            while links.waiting_bytes(2) != 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(
            drained.is_ok(),
            "{} bytes still waiting",
            links.waiting_bytes(2)
        );
    }

    #[tokio::test]
    async fn a_peer_nobody_serves_is_reported_unreachable_and_unknown_peers_too() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = format!("http://{}", listener.local_addr().expect("addr"));
        drop(listener);
        let (unreachable, reported) = counting();
        let links = RaftLinks::new(PeerNetwork::new(), unreachable);
        links.set_peers([(2, addr)]);
        links.send(2, b"hello".to_vec());
        let waited = tokio::time::timeout(Duration::from_secs(10), async {
            while reported.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(waited.is_ok(), "the dead peer was never reported");
        let before = reported.load(Ordering::SeqCst);
        links.send(9, b"to nobody".to_vec());
        assert_eq!(reported.load(Ordering::SeqCst), before + 1);
    }

    #[tokio::test]
    async fn another_clusters_stream_and_bytes_the_inbox_refuses_deliver_nothing_after_them() {
        let inbox = Arc::new(Collect::default());
        let (addr, _stop) = serve(inbox.clone(), 0xc1).await;
        let (unreachable, reported) = counting();
        let stranger = RaftLinks::new(PeerNetwork::new().for_cluster(0xd2), unreachable);
        stranger.set_peers([(2, addr.clone())]);
        stranger.send(2, b"from another cluster".to_vec());
        let waited = tokio::time::timeout(Duration::from_secs(10), async {
            while reported.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(waited.is_ok(), "the refused stream was never reported");
        assert!(inbox.got.lock().unwrap().is_empty());

        let (unreachable, broke) = counting();
        let member = RaftLinks::new(PeerNetwork::new().for_cluster(0xc1), unreachable);
        member.set_peers([(2, addr)]);
        member.send(2, b"one".to_vec());
        member.send(2, b"poison".to_vec());
        wait_for(&inbox, 1).await;
        let waited = tokio::time::timeout(Duration::from_secs(10), async {
            while broke.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(waited.is_ok(), "the refused stream was never reported");
        // The stream broke on the poison (what followed it on that stream is lost, as Raft
        // expects); the link reconnects for what comes next.
        member.send(2, b"two".to_vec());
        wait_for(&inbox, 2).await;
        assert_eq!(
            *inbox.got.lock().unwrap(),
            vec![b"one".to_vec(), b"two".to_vec()]
        );
    }
}

/// A TLS alert the other side sent, found anywhere in `error`'s chain, as Go's TLS stack words
/// it (`remote error: tls: bad certificate`), which etcd's members log.
fn tls_alert_words(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cur = Some(error);
    while let Some(e) = cur {
        let inner = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .map(|inner| inner as &(dyn std::error::Error + 'static));
        for e in [Some(e), inner].into_iter().flatten() {
            let alert = match e.downcast_ref::<rustls::Error>() {
                Some(rustls::Error::AlertReceived(alert)) => Some(format!("{alert:?}")),
                // rustls's reader hands the alert over as text inside an I/O error.
                _ => e
                    .to_string()
                    .strip_prefix("received fatal alert: ")
                    .map(str::to_owned),
            };
            if let Some(alert) = alert {
                return Some(format!("remote error: tls: {}", go_alert_words(&alert)));
            }
        }
        cur = e.source();
    }
    None
}

/// Go's `tls.alert` strings for the alerts a peer sends about certificates (by rustls's name of
/// the alert); others by that name.
fn go_alert_words(alert: &str) -> String {
    match alert {
        "BadCertificate" => "bad certificate",
        "UnsupportedCertificate" => "unsupported certificate",
        "CertificateRevoked" => "revoked certificate",
        "CertificateExpired" => "expired certificate",
        "CertificateUnknown" => "unknown certificate",
        "UnknownCA" => "unknown certificate authority",
        "AccessDenied" => "access denied",
        "HandshakeFailure" => "handshake failure",
        "CertificateRequired" => "certificate required",
        "DecryptError" => "error decrypting message",
        other => other,
    }
    .to_owned()
}

#[cfg(test)]
mod tls_words_tests {
    use super::*;

    #[test]
    fn a_refused_certificate_is_said_in_gos_words_wherever_it_is_in_the_chain() {
        let alert = rustls::Error::AlertReceived(rustls::AlertDescription::BadCertificate);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, alert);
        let status = tonic::Status::from_error(Box::new(io));
        assert_eq!(
            tls_alert_words(&status).as_deref(),
            Some("remote error: tls: bad certificate")
        );
        // As rustls's reader gives it: the alert as text in an I/O error.
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "received fatal alert: BadCertificate",
        );
        let status = tonic::Status::from_error(Box::new(io));
        assert_eq!(
            tls_alert_words(&status).as_deref(),
            Some("remote error: tls: bad certificate")
        );
        let plain = tonic::Status::unavailable("connection refused");
        assert_eq!(tls_alert_words(&plain), None);
    }
}
