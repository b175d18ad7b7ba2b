//! The connections a listener hands the servers: plain TCP, or TLS whose handshakes happen off
//! the accept loop, both as one type ([`Conn`]), so every server is served by one code path
//! whatever its URL's scheme. Both set TCP_NODELAY: small request/response pairs (and Raft's answers) must
//! not wait for Nagle's algorithm and delayed ACKs (40 ms on Linux).
//!
//! A handshake that fails (no client certificate under `--client-cert-auth`, a certificate from
//! another CA, an expired one) is logged and the connection dropped; rustls has sent the client
//! its alert, so the client sees why at once. A handshake that stalls is dropped after
//! [`HANDSHAKE_TIMEOUT`]: a silent client never holds anything.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;

/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections handshaken but not yet taken by the server.
const ACCEPTED_QUEUE_LEN: usize = 128;
/// Pause after a failed accept (out of file descriptors, say) before trying again.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);
/// TLS handshakes under way at once on one listener; further connections wait in the kernel's
/// accept queue.
const HANDSHAKES_MAX: usize = 1024;

/// The connections from `listener`: TLS with `tls`, else plain TCP.
pub(crate) fn incoming(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> Pin<Box<dyn Stream<Item = std::io::Result<Conn>> + Send>> {
    match tls {
        Some(config) => Box::pin(self::tls(listener, config).map(|c| c.map(Conn::tls))),
        None => Box::pin(plain(listener).map(|c| c.map(Conn::Plain))),
    }
}

/// A connection a listener accepted.
pub(crate) enum Conn {
    Plain(TcpStream),
    /// Boxed: a TLS session's state is far larger than a socket. With the common name of the
    /// client certificate the handshake verified, if any.
    Tls(Box<TlsStream<TcpStream>>, Option<String>),
}

impl Conn {
    fn tls(stream: TlsStream<TcpStream>) -> Conn {
        let common_name = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(|leaf| common_name(leaf.as_ref()));
        Conn::Tls(Box::new(stream), common_name)
    }
}

/// The subject common name of a DER certificate.
fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_owned)
}

impl Connected for Conn {
    type ConnectInfo = leasehold_server::ConnInfo;

    /// The TCP peer, for TLS connections too, and a client certificate's common name.
    fn connect_info(&self) -> leasehold_server::ConnInfo {
        match self {
            Conn::Plain(tcp) => leasehold_server::ConnInfo {
                tcp: tcp.connect_info(),
                common_name: None,
            },
            Conn::Tls(tls, common_name) => leasehold_server::ConnInfo {
                tcp: tls.get_ref().0.connect_info(),
                common_name: common_name.clone(),
            },
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            Conn::Tls(tls, _) => Pin::new(tls.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            Conn::Tls(tls, _) => Pin::new(tls.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(tcp) => Pin::new(tcp).poll_write_vectored(cx, bufs),
            Conn::Tls(tls, _) => Pin::new(tls.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(tcp) => tcp.is_write_vectored(),
            Conn::Tls(tls, _) => tls.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            Conn::Tls(tls, _) => Pin::new(tls.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            Conn::Tls(tls, _) => Pin::new(tls.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Plain TCP connections from `listener`.
fn plain(listener: TcpListener) -> impl Stream<Item = std::io::Result<TcpStream>> {
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
fn tls(
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
