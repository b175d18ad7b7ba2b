//! leasehold's member-to-member transport over gRPC, on the peer URLs: Raft's messages, one
//! stream per peer (`raft_link.rs`), and what a follower asks the leader for (commit this batch
//! of client writes; give me a read index; make this membership change), and any member's KV
//! hash.
//!
//! ```text
//!   Raft thread ──RaftLinks──► Raft/Messages (one stream per peer) ──► RaftService ──► Replica
//!   follower Replica ──Forwarder──► Lines ══gRPC Peer/Forwarding (one stream)══► PeerService ──► leader Replica
//! ```
//!
//! A forwarded request and its answer are leasehold's own types (`Write` batches, results),
//! encoded with postcard inside a `Payload`; a transport failure is the transient "no leader"
//! that clients retry. Every request names the sender's cluster, and a member refuses another
//! cluster's (`cluster_id.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_api::leaseholdpeerpb::Payload;
use leasehold_api::leaseholdpeerpb::peer_client::PeerClient as GrpcClient;
use leasehold_api::leaseholdpeerpb::peer_server::{Peer, PeerServer};
use leasehold_raft::{
    BoxFuture, Forwarded, Forwarder, MemberChange, MemberHash, ReadIndex, Replica, ReplicaError,
    Write,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status, Streaming};

mod cluster_id;
mod line;
mod raft_link;
mod tls_connector;
mod traffic;

pub use raft_link::{LINK_QUEUE_LEN, OnUnreachable, RaftInbox, RaftLinks, RaftService};
pub use traffic::{PeerReading, Traffic};

/// The answers on a `Forwarding` stream, or a snapshot's file's chunks, as the generated server
/// trait names them.
type AnswerStream =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<Payload, Status>> + Send + 'static>>;
use line::{Answer, Ask, LineError, Lines};

/// Largest peer message accepted: a batch of log entries or a snapshot chunk.
pub const PEER_MESSAGE_BYTES_MAX: usize = 256 * 1024 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const PEER_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// Bound on a forwarded request (a commit, a read index, a membership change), in election
/// timeouts: long enough for a loaded leader to commit, short enough that a client whose leader
/// was cut off hears "no leader" (and retries, reaching the new leader) well within a lease's
/// grace after the election.
const FORWARD_TIMEOUT_ELECTIONS: u32 = 2;

#[derive(Debug, thiserror::Error)]
enum TransportError {
    #[error("peer {addr}: {status}")]
    Call { addr: String, status: Status },
    #[error("peer {addr}: bad URL: {reason}")]
    Url { addr: String, reason: String },
    #[error("peer {addr}: no answer within {timeout:?}")]
    Timeout { addr: String, timeout: Duration },
}

fn encode<T: Serialize>(value: &T) -> Payload {
    Payload {
        data: postcard::to_allocvec(value).expect("peer messages always encode"),
    }
}

/// Decodes a whole payload: bytes left over mean the payload was some other type (a member of
/// another build), not this one.
fn decode<T: DeserializeOwned>(payload: &Payload) -> Result<T, postcard::Error> {
    let (value, rest) = postcard::take_from_bytes(&payload.data)?;
    if rest.is_empty() {
        Ok(value)
    } else {
        Err(postcard::Error::DeserializeBadEncoding)
    }
}

/// A connection to a peer that stamps every request with this member's cluster.
type Stamped = tonic::service::interceptor::InterceptedService<Channel, cluster_id::Stamp>;

fn bad_request(e: postcard::Error) -> Status {
    Status::invalid_argument(format!("undecodable peer message: {e}"))
}

/// Connections to the other members, one lazily connected channel per peer URL, shared by the
/// Raft links and the forwarder.
#[derive(Clone, Default)]
pub struct PeerNetwork {
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    /// How `https://` peers are reached.
    tls: Option<PeerTls>,
    /// The cluster every request is stamped with (`None`: unstamped).
    cluster_id: Option<u64>,
    /// What the Raft links send, per peer.
    traffic: Arc<Traffic>,
}

/// How a member reaches `https://` peers.
#[derive(Clone, Debug)]
pub enum PeerTls {
    /// Their certificate checked against the trusted CA, ours presented (tonic's rustls).
    Verified(tonic::transport::ClientTlsConfig),
    /// TLS with any certificate, as etcd's `--peer-auto-tls` connects (self-signed certificates
    /// no member can check): encryption without authentication.
    Unverified(Arc<rustls::ClientConfig>),
}

impl PeerNetwork {
    pub fn new() -> PeerNetwork {
        PeerNetwork::default()
    }

    /// A network that reaches `https://` peer URLs with `tls`.
    pub fn with_tls(tls: Option<PeerTls>) -> PeerNetwork {
        PeerNetwork {
            tls,
            ..PeerNetwork::default()
        }
    }

    /// Where this network's Raft links count what they send (the serving side counts what it
    /// receives in the same place, given to [`serve_peers`]).
    pub fn traffic(&self) -> Arc<Traffic> {
        self.traffic.clone()
    }

    /// The same network, stamping every request with `cluster_id` (see `cluster_id.rs`).
    pub fn for_cluster(self, cluster_id: u64) -> PeerNetwork {
        PeerNetwork {
            cluster_id: Some(cluster_id),
            ..self
        }
    }

    fn client(&self, addr: &str) -> Result<GrpcClient<Stamped>, TransportError> {
        Ok(GrpcClient::with_interceptor(
            self.channel(addr)?,
            cluster_id::Stamp::new(self.cluster_id),
        )
        .max_decoding_message_size(PEER_MESSAGE_BYTES_MAX)
        .max_encoding_message_size(PEER_MESSAGE_BYTES_MAX))
    }

    /// A client of the raft-rs engine's `Raft` service at `addr`, on the shared connection.
    fn raft_client(
        &self,
        addr: &str,
    ) -> Result<leasehold_api::leaseholdpeerpb::raft_client::RaftClient<Stamped>, TransportError>
    {
        Ok(
            leasehold_api::leaseholdpeerpb::raft_client::RaftClient::with_interceptor(
                self.channel(addr)?,
                cluster_id::Stamp::new(self.cluster_id),
            )
            .max_decoding_message_size(PEER_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(PEER_MESSAGE_BYTES_MAX),
        )
    }

    /// The connection to `addr`, made (lazily) on first use and shared after.
    fn channel(&self, addr: &str) -> Result<Channel, TransportError> {
        let mut channels = self.channels.lock().expect("peer channels lock poisoned");
        let channel = match channels.get(addr) {
            Some(channel) => channel.clone(),
            None => {
                let bad_url = |reason: String| TransportError::Url {
                    addr: addr.to_owned(),
                    reason,
                };
                if let Some(path) = addr.strip_prefix("unix://") {
                    // A Unix socket (plain only; `unixs://` peers are not supported).
                    let path = path.trim_end_matches('/');
                    let channel = Endpoint::from_static("http://localhost")
                        .connect_timeout(CONNECT_TIMEOUT)
                        .http2_keep_alive_interval(PEER_KEEPALIVE_INTERVAL)
                        .keep_alive_timeout(PEER_KEEPALIVE_INTERVAL)
                        .keep_alive_while_idle(true)
                        .connect_with_connector_lazy(tls_connector::UnixConnector(path.into()));
                    channels.insert(addr.to_owned(), channel.clone());
                    return Ok(channel);
                }
                let https = addr.strip_prefix("https://");
                // Unverified TLS is our own connector's; tonic sees a plain URL.
                let unverified = match (&https, &self.tls) {
                    (Some(rest), Some(PeerTls::Unverified(config))) => {
                        Some((format!("http://{rest}"), config.clone()))
                    }
                    _ => None,
                };
                let url = unverified.as_ref().map_or(addr, |(url, _)| url.as_str());
                let mut endpoint =
                    Endpoint::from_shared(url.to_owned()).map_err(|e| bad_url(e.to_string()))?;
                if https.is_some() && unverified.is_none() {
                    let Some(PeerTls::Verified(tls)) = &self.tls else {
                        return Err(bad_url(
                            "an https:// peer needs --peer-trusted-ca-file".to_owned(),
                        ));
                    };
                    endpoint = endpoint
                        .tls_config(tls.clone())
                        .map_err(|e| bad_url(e.to_string()))?;
                }
                let endpoint = endpoint
                    .connect_timeout(CONNECT_TIMEOUT)
                    .tcp_nodelay(true)
                    // Notice a peer that went silent (cut off, frozen) on an open connection.
                    .http2_keep_alive_interval(PEER_KEEPALIVE_INTERVAL)
                    .keep_alive_timeout(PEER_KEEPALIVE_INTERVAL)
                    .keep_alive_while_idle(true);
                let channel = match unverified {
                    Some((_, config)) => {
                        endpoint.connect_with_connector_lazy(tls_connector::TlsConnector(config))
                    }
                    None => endpoint.connect_lazy(),
                };
                channels.insert(addr.to_owned(), channel.clone());
                channel
            }
        };
        Ok(channel)
    }

    /// One unary call to `addr`, bounded by `timeout`; returns the answer's payload.
    async fn call(
        &self,
        addr: &str,
        timeout: Duration,
        payload: Payload,
        rpc: Rpc,
    ) -> Result<Payload, TransportError> {
        let mut client = self.client(addr)?;
        let call = async move {
            match rpc {
                Rpc::ChangeMembers => client.change_members(payload).await,
                Rpc::HashKv => client.hash_kv(payload).await,
                Rpc::Members => client.members(payload).await,
            }
        };
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(TransportError::Call {
                addr: addr.to_owned(),
                status,
            }),
            Err(_) => Err(TransportError::Timeout {
                addr: addr.to_owned(),
                timeout,
            }),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Rpc {
    ChangeMembers,
    HashKv,
    Members,
}

/// The cluster as a member that joins it learns it from a member already in it (etcd's peer
/// `GET /members`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ClusterMembers {
    pub cluster_id: u64,
    /// Every member, voters and learners: (ID, peer URL).
    pub members: Vec<(u64, String)>,
}

impl PeerNetwork {
    /// Asks the member at `addr` for its cluster's ID and members, within `timeout`.
    pub async fn cluster_members(
        &self,
        addr: &str,
        timeout: Duration,
    ) -> Result<ClusterMembers, String> {
        let answer = self
            .call(addr, timeout, encode(&()), Rpc::Members)
            .await
            .map_err(|e| e.to_string())?;
        decode(&answer).map_err(|e| format!("peer {addr}: undecodable members: {e}"))
    }
}

/// Takes a follower's writes and read-index requests to the leader over the leader's line (one
/// long-lived stream, many requests in flight).
pub struct PeerForwarder {
    network: PeerNetwork,
    lines: Lines,
    timeout: Duration,
}

impl PeerForwarder {
    pub fn new(network: PeerNetwork, election_timeout: Duration) -> PeerForwarder {
        PeerForwarder {
            lines: Lines::new(network.clone()),
            network,
            timeout: election_timeout * FORWARD_TIMEOUT_ELECTIONS,
        }
    }

    /// Asks over the leader's line. What comes back is the leader's answer or, for a transport
    /// failure, "leader unreachable" when the ask was never sent (the line did not open) and
    /// "no leader" when it may have been.
    fn ask_on_line<Resp: Send + 'static>(
        &self,
        addr: String,
        ask: Ask,
        answered: fn(Answer) -> Option<Result<Resp, ReplicaError>>,
    ) -> BoxFuture<Result<Resp, ReplicaError>> {
        let unwrap = move |answer: Answer| {
            // An answer of another kind is as unreadable as bytes left over.
            answered(answer).unwrap_or(Err(ReplicaError::BadAnswer(
                postcard::Error::DeserializeBadEnum,
            )))
        };
        let lines = self.lines.clone();
        let timeout = self.timeout;
        Box::pin(async move {
            let started = std::time::Instant::now();
            let answer = tokio::time::timeout(timeout, lines.ask(&addr, ask)).await;
            tracing::debug!(%addr, elapsed = ?started.elapsed(), ok = matches!(answer, Ok(Ok(_))), "asked the leader over its line");
            match answer {
                Ok(Ok(answer)) => unwrap(answer),
                Ok(Err(LineError::NotSent)) => Err(ReplicaError::LeaderUnreachable),
                Ok(Err(LineError::Broken)) | Err(_) => Err(ReplicaError::NoLeader),
            }
        })
    }

    fn ask<Req: Serialize, Resp: DeserializeOwned + Send + 'static>(
        &self,
        addr: String,
        rpc: Rpc,
        request: &Req,
    ) -> BoxFuture<Result<Resp, ReplicaError>> {
        let network = self.network.clone();
        let payload = encode(request);
        let timeout = self.timeout;
        Box::pin(async move {
            let started = std::time::Instant::now();
            let answer = network.call(&addr, timeout, payload, rpc).await;
            tracing::debug!(?rpc, %addr, elapsed = ?started.elapsed(), ok = answer.is_ok(), "asked a peer");
            match answer {
                Ok(answer) => decode::<Result<Resp, ReplicaError>>(&answer)
                    .unwrap_or_else(|e| Err(ReplicaError::BadAnswer(e))),
                Err(e) => {
                    tracing::debug!("asking a peer failed: {e}");
                    Err(ReplicaError::NoLeader)
                }
            }
        })
    }
}

impl Forwarder for PeerForwarder {
    fn forward(
        &self,
        _leader: u64,
        addr: String,
        writes: Vec<Write>,
    ) -> BoxFuture<Result<Forwarded, ReplicaError>> {
        self.ask_on_line(addr, Ask::Writes(writes), |answer| match answer {
            Answer::Writes(result) => Some(result),
            Answer::ReadIndex(_) => None,
        })
    }

    fn read_index(&self, _leader: u64, addr: String) -> BoxFuture<Result<ReadIndex, ReplicaError>> {
        self.ask_on_line(addr, Ask::ReadIndex, |answer| match answer {
            Answer::ReadIndex(result) => Some(result),
            Answer::Writes(_) => None,
        })
    }

    fn change_members(
        &self,
        _leader: u64,
        addr: String,
        change: MemberChange,
    ) -> BoxFuture<Result<(), ReplicaError>> {
        self.ask(addr, Rpc::ChangeMembers, &change)
    }

    fn hash_kv(
        &self,
        _member: u64,
        addr: String,
        revision: i64,
    ) -> BoxFuture<Result<Option<MemberHash>, ReplicaError>> {
        self.ask(addr, Rpc::HashKv, &revision)
    }
}

/// The server side: hands a follower's requests to the replica as leader, and answers hash
/// requests.
pub struct PeerService {
    replica: Arc<Replica>,
    cluster_id: u64,
}

impl PeerService {
    pub fn new(replica: Arc<Replica>, cluster_id: u64) -> PeerService {
        PeerService {
            replica,
            cluster_id,
        }
    }

    pub fn into_server(self) -> PeerServer<PeerService> {
        PeerServer::new(self)
            .max_decoding_message_size(PEER_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(PEER_MESSAGE_BYTES_MAX)
    }
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn forwarding(
        &self,
        req: Request<Streaming<Payload>>,
    ) -> Result<Response<AnswerStream>, Status> {
        Ok(Response::new(Box::pin(line::serve_line(
            self.replica.clone(),
            req.into_inner(),
        ))))
    }

    async fn change_members(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        let change: MemberChange = decode(req.get_ref()).map_err(bad_request)?;
        let result = self.replica.leader_change_members(change).await;
        Ok(Response::new(encode(&result)))
    }

    /// This member's KV hash at a revision, from its applied state (any member answers).
    async fn hash_kv(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        let revision: i64 = decode(req.get_ref()).map_err(bad_request)?;
        let result: Result<Option<MemberHash>, ReplicaError> =
            Ok(self.replica.member_hash(revision));
        Ok(Response::new(encode(&result)))
    }

    async fn members(&self, _req: Request<Payload>) -> Result<Response<Payload>, Status> {
        let members = ClusterMembers {
            cluster_id: self.cluster_id,
            members: self
                .replica
                .members()
                .into_iter()
                .map(|m| (m.id, m.peer_url))
                .collect(),
        };
        Ok(Response::new(encode(&members)))
    }

    /// The file of a snapshot this member offered, read on a blocking thread a chunk at a time
    /// (a few chunks ahead of the stream at most).
    async fn snapshot_file(&self, req: Request<Payload>) -> Result<Response<AnswerStream>, Status> {
        let path = self
            .replica
            .outgoing_snapshot(&req.get_ref().data)
            .map_err(Status::not_found)?;
        let mut file = std::fs::File::open(&path)
            .map_err(|e| Status::not_found(format!("{}: {e}", path.display())))?;
        let (chunks, stream) = tokio::sync::mpsc::channel(SNAPSHOT_CHUNKS_AHEAD);
        tokio::task::spawn_blocking(move || {
            use std::io::Read;
            loop {
                let mut chunk = Vec::with_capacity(SNAPSHOT_CHUNK_BYTES);
                let read = (&mut file)
                    .take(SNAPSHOT_CHUNK_BYTES as u64)
                    .read_to_end(&mut chunk);
                let next = match read {
                    Ok(0) => return,
                    Ok(_) => Ok(Payload { data: chunk }),
                    Err(e) => Err(Status::internal(format!("{}: {e}", path.display()))),
                };
                let failed = next.is_err();
                if chunks.blocking_send(next).is_err() || failed {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(stream),
        )))
    }
}

/// How much of a snapshot's file each message carries, and how many are read ahead.
const SNAPSHOT_CHUNK_BYTES: usize = 1 << 20;
const SNAPSHOT_CHUNKS_AHEAD: usize = 4;

/// Serves the peer transport on the connections `incoming` yields (plain TCP or TLS, with
/// TCP_NODELAY: Raft's acknowledgements are small, and every commit that needs this member's
/// would otherwise wait for Nagle's algorithm and the leader's delayed ACK) until `shutdown`
/// completes.
pub async fn serve_peers<I, IO, E>(
    replica: Arc<Replica>,
    cluster_id: u64,
    traffic: Arc<Traffic>,
    incoming: I,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error>
where
    I: tokio_stream::Stream<Item = Result<IO, E>> + Send + 'static,
    IO: tokio::io::AsyncRead
        + tokio::io::AsyncWrite
        + tonic::transport::server::Connected
        + Unpin
        + Send
        + 'static,
    IO::ConnectInfo: Clone + Send + Sync + 'static,
    E: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    let inbox = Arc::new(ReplicaInbox(replica.clone()));
    tonic::transport::Server::builder()
        .add_service(tonic::service::interceptor::InterceptedService::new(
            PeerService::new(replica, cluster_id).into_server(),
            cluster_id::Check::new(cluster_id),
        ))
        .add_service(RaftService::counted(inbox, cluster_id, traffic))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// A replica as the raft-rs engine's inbox.
struct ReplicaInbox(Arc<Replica>);

impl RaftInbox for ReplicaInbox {
    fn deliver(&self, message: Vec<u8>) -> Result<(), String> {
        self.0.deliver_raft_message(&message)
    }

    fn heard(&self, peer: u64) {
        self.0.peer_heard(peer);
    }
}

impl leasehold_raft::RaftTransport for RaftLinks {
    fn set_peers(&self, peers: Vec<(u64, String)>) {
        RaftLinks::set_peers(self, peers);
    }

    fn send(&self, to: u64, message: Vec<u8>) {
        RaftLinks::send(self, to, message);
    }

    fn waiting_bytes(&self, to: u64) -> u64 {
        RaftLinks::waiting_bytes(self, to) as u64
    }

    fn fetch_snapshot(
        &self,
        from: u64,
        request: Vec<u8>,
        into: &mut dyn std::io::Write,
    ) -> Result<(), String> {
        RaftLinks::fetch_snapshot(self, from, request, into)
    }
}
