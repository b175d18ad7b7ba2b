//! One long-lived `Forwarding` stream per leader, for what a follower asks of it most: commit
//! these writes, give me a read index. Requests are numbered and many are in flight at once;
//! the leader answers each as soon as it is ready, naming the request it answers.
//!
//! ```text
//!   follower                                   leader
//!   ask ─► Line ── numbered asks ──► forwarding() ─► a task per ask ─► Replica::leader_*
//!   ask ◄─ Line ◄─ numbered answers ─────────────────────────────────┘
//! ```
//!
//! A line that breaks (the connection drops, the leader stops) fails every request on it with
//! "no leader", which clients retry; the next request opens a new line.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use leasehold_api::leaseholdpeerpb::Payload;
use leasehold_raft::{Forwarded, ReadIndex, Replica, ReplicaError, Write};
use serde::{Deserialize, Serialize};
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};
use tonic::{Status, Streaming};

use crate::{PeerNetwork, bad_request, decode, encode};

/// A request or an answer on a line, with the number that pairs them.
#[derive(Debug, Serialize, Deserialize)]
struct Numbered<T> {
    seq: u64,
    body: T,
}

/// What a follower asks the leader over a line.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Ask {
    Writes(Vec<Write>),
    ReadIndex,
}

/// The leader's answer to an [`Ask`] of the same name.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Answer {
    Writes(Result<Forwarded, ReplicaError>),
    ReadIndex(Result<ReadIndex, ReplicaError>),
}

/// Why a request got no answer over a line.
#[derive(Debug)]
pub(crate) enum LineError {
    /// The line never opened, or broke before the request was handed to it: the leader never
    /// saw it.
    NotSent,
    /// The line broke after the request was handed to it: the leader may have taken it.
    Broken,
}

/// Where a line is: answers flow only once it is `Open`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Opening,
    Open,
    Broken,
}

/// Requests waiting for their answers, by number; `None` once the line broke.
type Waiting = Mutex<Option<HashMap<u64, oneshot::Sender<Answer>>>>;

struct Line {
    asks: mpsc::UnboundedSender<Payload>,
    waiting: Waiting,
    next_seq: AtomicU64,
    state: watch::Receiver<State>,
}

/// A follower's lines, one per leader address, opened on first use.
#[derive(Clone)]
pub(crate) struct Lines {
    network: PeerNetwork,
    open: Arc<Mutex<HashMap<String, Arc<Line>>>>,
}

impl Lines {
    pub(crate) fn new(network: PeerNetwork) -> Lines {
        Lines {
            network,
            open: Arc::default(),
        }
    }

    /// Sends `ask` to the leader at `addr` over its line and waits for the answer. Unbounded in
    /// time: the caller bounds it.
    pub(crate) async fn ask(&self, addr: &str, ask: Ask) -> Result<Answer, LineError> {
        let line = self.line(addr);
        let mut state = line.state.clone();
        let opened = *state
            .wait_for(|s| *s != State::Opening)
            .await
            .map_err(|_| LineError::NotSent)?;
        match opened {
            State::Open => {}
            State::Opening | State::Broken => return Err(LineError::NotSent),
        }
        let seq = line.next_seq.fetch_add(1, Ordering::Relaxed);
        let (answer_tx, answer_rx) = oneshot::channel();
        match line.waiting.lock().expect("line lock poisoned").as_mut() {
            Some(waiting) => waiting.insert(seq, answer_tx),
            None => return Err(LineError::NotSent),
        };
        // A caller that gives up (its bound, a leader change) must not leave its number behind.
        let _forget = Forget { line: &line, seq };
        line.asks
            .send(encode(&Numbered { seq, body: ask }))
            .map_err(|_| LineError::NotSent)?;
        answer_rx.await.map_err(|_| LineError::Broken)
    }

    /// The open line to `addr`, or a new one (opening in the background).
    fn line(&self, addr: &str) -> Arc<Line> {
        let mut open = self.open.lock().expect("lines lock poisoned");
        if let Some(line) = open.get(addr) {
            return line.clone();
        }
        let (asks, asks_rx) = mpsc::unbounded_channel();
        let (state_tx, state) = watch::channel(State::Opening);
        let line = Arc::new(Line {
            asks,
            waiting: Mutex::new(Some(HashMap::new())),
            next_seq: AtomicU64::new(0),
            state,
        });
        open.insert(addr.to_owned(), line.clone());
        tokio::spawn(run_line(
            self.clone(),
            addr.to_owned(),
            line.clone(),
            asks_rx,
            state_tx,
        ));
        line
    }

    /// Forgets `line` (if it is still the one for `addr`), so the next request opens another.
    fn close(&self, addr: &str, line: &Arc<Line>) {
        let mut open = self.open.lock().expect("lines lock poisoned");
        if open.get(addr).is_some_and(|l| Arc::ptr_eq(l, line)) {
            open.remove(addr);
        }
    }
}

struct Forget<'a> {
    line: &'a Line,
    seq: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        if let Some(waiting) = self
            .line
            .waiting
            .lock()
            .expect("line lock poisoned")
            .as_mut()
        {
            waiting.remove(&self.seq);
        }
    }
}

/// Opens the stream, hands each answer to its request, and when the stream ends fails every
/// request still waiting.
async fn run_line(
    lines: Lines,
    addr: String,
    line: Arc<Line>,
    asks: mpsc::UnboundedReceiver<Payload>,
    state: watch::Sender<State>,
) {
    let ended = async {
        let mut client = lines.network.client(&addr).map_err(|e| e.to_string())?;
        let mut answers = client
            .forwarding(UnboundedReceiverStream::new(asks))
            .await
            .map_err(|status| status.to_string())?
            .into_inner();
        state.send_replace(State::Open);
        while let Some(payload) = answers.message().await.map_err(|s| s.to_string())? {
            let Numbered { seq, body } =
                decode::<Numbered<Answer>>(&payload).map_err(|e| e.to_string())?;
            let waiter = line
                .waiting
                .lock()
                .expect("line lock poisoned")
                .as_mut()
                .and_then(|waiting| waiting.remove(&seq));
            if let Some(waiter) = waiter {
                let _ = waiter.send(body);
            }
        }
        Err::<std::convert::Infallible, _>("the leader ended the stream".to_owned())
    };
    let Err(why) = ended.await;
    tracing::debug!(%addr, "forwarding line closed: {why}");
    lines.close(&addr, &line);
    state.send_if_modified(|s| {
        let was_opening_or_open = matches!(s, State::Opening | State::Open);
        if was_opening_or_open {
            *s = State::Broken;
        }
        was_opening_or_open
    });
    // Dropping the senders answers every waiting request with "broken".
    line.waiting.lock().expect("line lock poisoned").take();
}

/// Requests of one line the leader works on at once; more wait in the stream (HTTP/2 flow
/// control then holds the follower back).
const ASKS_IN_FLIGHT_MAX: usize = 64;
/// Answers queued for sending on one line.
const ANSWERS_QUEUED_MAX: usize = 64;

/// The leader's side of a line: each request runs on its own task, and its answer is sent as
/// soon as it is ready. The stream ends when the follower ends it or this member stops.
pub(crate) fn serve_line(
    replica: Arc<Replica>,
    mut asks: Streaming<Payload>,
) -> ReceiverStream<Result<Payload, Status>> {
    let (answers, answers_rx) = mpsc::channel(ANSWERS_QUEUED_MAX);
    tokio::spawn(async move {
        let in_flight = Arc::new(Semaphore::new(ASKS_IN_FLIGHT_MAX));
        let stopping = replica.clone();
        let stopping = stopping.stopping();
        tokio::pin!(stopping);
        loop {
            let payload = tokio::select! {
                next = asks.message() => match next {
                    Ok(Some(payload)) => payload,
                    Ok(None) | Err(_) => break,
                },
                () = &mut stopping => break,
            };
            let Numbered { seq, body } = match decode::<Numbered<Ask>>(&payload) {
                Ok(numbered) => numbered,
                Err(e) => {
                    let _ = answers.send(Err(bad_request(e))).await;
                    break;
                }
            };
            let permit = tokio::select! {
                permit = in_flight.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => break,
                },
                () = &mut stopping => break,
            };
            let replica = replica.clone();
            let answers = answers.clone();
            tokio::spawn(async move {
                let body = match body {
                    Ask::Writes(writes) => Answer::Writes(replica.leader_commit(writes).await),
                    Ask::ReadIndex => Answer::ReadIndex(replica.leader_read_index().await),
                };
                let _ = answers.send(Ok(encode(&Numbered { seq, body }))).await;
                drop(permit);
            });
        }
    });
    ReceiverStream::new(answers_rx)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use leasehold_api::leaseholdpeerpb::peer_server::{Peer, PeerServer};
    use leasehold_raft::{Forwarder, LeaseId, LeaseRevoke};
    use tonic::{Request, Response};

    use super::*;
    use crate::{AnswerStream, PeerForwarder};

    /// How the fake leader treats `Forwarding`.
    #[derive(Clone, Copy)]
    enum Leader {
        /// Collects three asks, then answers them last first.
        AnswersBackwards,
        /// Ends its first stream on the first ask; answers on later streams.
        BreaksFirstLine,
    }

    struct FakeLeader {
        kind: Leader,
        lines_opened: Arc<AtomicUsize>,
    }

    /// What the fake commits a batch at: its size, so each answer says which batch it is for.
    fn committed(writes: &[Write]) -> Forwarded {
        Forwarded {
            log_index: writes.len() as u64,
            applied: Vec::new(),
        }
    }

    #[tonic::async_trait]
    impl Peer for FakeLeader {
        async fn forwarding(
            &self,
            req: Request<Streaming<Payload>>,
        ) -> Result<Response<AnswerStream>, Status> {
            let opened = self.lines_opened.fetch_add(1, Ordering::SeqCst);
            let kind = self.kind;
            let mut asks = req.into_inner();
            let (answers, answers_rx) = mpsc::channel(8);
            tokio::spawn(async move {
                let mut held = Vec::new();
                while let Ok(Some(payload)) = asks.message().await {
                    let ask: Numbered<Ask> = decode(&payload).expect("a numbered ask");
                    if matches!(kind, Leader::BreaksFirstLine) && opened == 0 {
                        return;
                    }
                    held.push(ask);
                    if matches!(kind, Leader::AnswersBackwards) && held.len() < 3 {
                        continue;
                    }
                    for Numbered { seq, body } in held.drain(..).rev() {
                        let body = match body {
                            Ask::Writes(writes) => Answer::Writes(Ok(committed(&writes))),
                            Ask::ReadIndex => Answer::ReadIndex(Err(ReplicaError::NoLeader)),
                        };
                        let _ = answers.send(Ok(encode(&Numbered { seq, body }))).await;
                    }
                }
            });
            Ok(Response::new(Box::pin(ReceiverStream::new(answers_rx))))
        }
    }

    struct Started {
        forwarder: PeerForwarder,
        addr: String,
        lines_opened: Arc<AtomicUsize>,
        stop: oneshot::Sender<()>,
    }

    /// Serves a fake leader on a port-0 listener it keeps, and a forwarder that reaches it.
    async fn start(kind: Leader) -> Started {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = format!("http://{}", listener.local_addr().expect("local addr"));
        let lines_opened = Arc::new(AtomicUsize::new(0));
        let leader = FakeLeader {
            kind,
            lines_opened: lines_opened.clone(),
        };
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(PeerServer::new(leader))
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    async {
                        let _ = stopped.await;
                    },
                ),
        );
        let forwarder = PeerForwarder::new(PeerNetwork::new(), Duration::from_secs(5));
        Started {
            forwarder,
            addr,
            lines_opened,
            stop,
        }
    }

    fn batch(len: usize) -> Vec<Write> {
        let id = LeaseId::from_wire(7).expect("non-zero");
        vec![Write::LeaseRevoke(LeaseRevoke { id }); len]
    }

    #[tokio::test]
    async fn answers_that_come_back_out_of_order_reach_their_own_requests() {
        let leader = start(Leader::AnswersBackwards).await;
        let f = &leader.forwarder;
        let (a, b, c) = tokio::join!(
            f.forward(1, leader.addr.clone(), batch(1)),
            f.forward(1, leader.addr.clone(), batch(2)),
            f.forward(1, leader.addr.clone(), batch(3)),
        );
        let indexes = [a, b, c].map(|r| r.expect("answered").log_index);
        assert_eq!(indexes, [1, 2, 3]);
        assert_eq!(leader.lines_opened.load(Ordering::SeqCst), 1, "one line");
        let _ = leader.stop.send(());
    }

    #[tokio::test]
    async fn a_broken_line_answers_no_leader_and_the_next_request_opens_another() {
        let leader = start(Leader::BreaksFirstLine).await;
        let f = &leader.forwarder;
        let first = f.forward(1, leader.addr.clone(), batch(1)).await;
        assert!(
            matches!(first, Err(ReplicaError::NoLeader)),
            "a request on a broken line: {first:?}"
        );
        // The line is forgotten before its requests hear that it broke.
        let second = f.forward(1, leader.addr.clone(), batch(4)).await;
        assert_eq!(second.expect("answered on a new line").log_index, 4);
        assert_eq!(leader.lines_opened.load(Ordering::SeqCst), 2);
        let _ = leader.stop.send(());
    }

    #[tokio::test]
    async fn a_leader_nobody_answers_for_is_unreachable_not_lost() {
        // A port that was bound and released: nothing listens there, so the line never opens
        // and the writes were never sent (the follower may send them to the next leader).
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = format!("http://{}", listener.local_addr().expect("local addr"));
        drop(listener);
        let forwarder = PeerForwarder::new(PeerNetwork::new(), Duration::from_secs(5));
        let answer = forwarder.forward(1, addr, batch(1)).await;
        assert!(
            matches!(answer, Err(ReplicaError::LeaderUnreachable)),
            "a write to a leader whose line never opened: {answer:?}"
        );
    }
}
