//! The connections a listener hands the servers: plain TCP, or TLS whose handshakes happen off
//! the accept loop. Both set TCP_NODELAY: small request/response pairs (and Raft's answers) must
//! not wait for Nagle's algorithm and delayed ACKs (40 ms on Linux).
//!
//! A handshake that fails (no client certificate under `--client-cert-auth`, a certificate from
//! another CA, an expired one) is logged and the connection dropped; rustls has sent the client
//! its alert, so the client sees why at once. A handshake that stalls is dropped after
//! [`HANDSHAKE_TIMEOUT`]: a silent client never holds anything.

use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections handshaken but not yet taken by the server.
const ACCEPTED_QUEUE_LEN: usize = 128;
/// Pause after a failed accept (out of file descriptors, say) before trying again.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);
/// TLS handshakes under way at once on one listener; further connections wait in the kernel's
/// accept queue.
const HANDSHAKES_MAX: usize = 1024;

/// Plain TCP connections from `listener`.
pub(crate) fn plain(listener: TcpListener) -> impl Stream<Item = std::io::Result<TcpStream>> {
    tokio_stream::StreamExt::map(
        tokio_stream::wrappers::TcpListenerStream::new(listener),
        |conn| {
            conn.inspect(|stream| {
                if let Err(e) = stream.set_nodelay(true) {
                    tracing::warn!("TCP_NODELAY: {e}");
                }
            })
        },
    )
}

/// TLS connections from `listener`, each handshaken on a task of its own, at most
/// [`HANDSHAKES_MAX`] at once. The accept loop ends when the stream is dropped (the server
/// stopped).
pub(crate) fn tls(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
) -> impl Stream<Item = std::io::Result<TlsStream<TcpStream>>> {
    let acceptor = TlsAcceptor::from(config);
    let (tx, rx) = mpsc::channel(ACCEPTED_QUEUE_LEN);
    let handshakes = Arc::new(tokio::sync::Semaphore::new(HANDSHAKES_MAX));
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = async {
                    let permit = handshakes.clone().acquire_owned().await;
                    (permit, listener.accept().await)
                } => accepted,
                () = tx.closed() => return,
            };
            let (Ok(permit), accepted) = accepted else {
                return;
            };
            let (tcp, from) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                    continue;
                }
            };
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::warn!("TCP_NODELAY: {e}");
            }
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await;
                drop(permit);
                match handshake {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => tracing::info!("TLS handshake with {from} failed: {e}"),
                    Err(_) => tracing::info!(
                        "TLS handshake with {from} took over {HANDSHAKE_TIMEOUT:?}; dropped"
                    ),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}
