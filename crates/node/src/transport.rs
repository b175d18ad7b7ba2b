//! The connections a listener hands the servers: plain TCP or a Unix socket, or TLS over either
//! whose handshakes happen off the accept loop, all as one type ([`Conn`]), so every server is served by one code path
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
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
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

/// Which listener a connection came to, for the log line of a refused handshake (etcd's
/// words: `rejected connection on client endpoint`).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Endpoint {
    Client,
    Peer,
}

impl Endpoint {
    fn rejected(self) -> &'static str {
        match self {
            Endpoint::Client => "rejected connection on client endpoint",
            Endpoint::Peer => "rejected connection on peer endpoint",
        }
    }
}

/// A refused handshake's error as the log says it: a client certificate outside
/// `--*-cert-allowed-cn` / `--*-cert-allowed-hostname` in etcd's words (`client certificate
/// authentication failed`, which operators and etcd's tests look for); others as rustls says.
fn handshake_error(e: &std::io::Error) -> String {
    let refused_name = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .is_some_and(|r| {
            matches!(
                r,
                rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName)
            )
        });
    if refused_name {
        "client certificate authentication failed".into()
    } else {
        e.to_string()
    }
}

/// The connections from `listener`: TLS with `tls`, else plain TCP. With `plain_too` (TLS and
/// plain on one port, as etcd serves `http://` and `https://` URLs of one host and port), a
/// connection whose first byte does not open a TLS handshake is taken as plain.
pub(crate) fn incoming(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    plain_too: bool,
    endpoint: Endpoint,
) -> Pin<Box<dyn Stream<Item = std::io::Result<Conn>> + Send>> {
    match tls {
        Some(config) => Box::pin(self::tls(listener, config, plain_too, endpoint).map(|c| {
            c.map(|accepted| match accepted {
                Accepted::Tls(stream) => Conn::tls(*stream),
                Accepted::Plain(stream) => Conn::Plain(stream),
            })
        })),
        None => Box::pin(plain(listener).map(|c| c.map(Conn::Plain))),
    }
}

/// The connections from a Unix socket: TLS with `tls` (`unixs://`), else plain.
pub(crate) fn incoming_unix(
    listener: UnixListener,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> Pin<Box<dyn Stream<Item = std::io::Result<Conn>> + Send>> {
    match tls {
        Some(config) => Box::pin(
            self::tls(listener, config, false, Endpoint::Client).map(|c| {
                c.map(|accepted| match accepted {
                    Accepted::Tls(stream) => Conn::unix_tls(*stream),
                    Accepted::Plain(stream) => Conn::Unix(stream),
                })
            }),
        ),
        None => Box::pin(
            tokio_stream::wrappers::UnixListenerStream::new(listener).map(|c| c.map(Conn::Unix)),
        ),
    }
}

/// A connection a listener accepted.
pub(crate) enum Conn {
    Plain(TcpStream),
    /// Boxed: a TLS session's state is far larger than a socket. With the common name of the
    /// client certificate the handshake verified, if any.
    Tls(Box<TlsStream<TcpStream>>, Option<String>),
    Unix(UnixStream),
    UnixTls(Box<TlsStream<UnixStream>>, Option<String>),
}

impl Conn {
    fn tls(stream: TlsStream<TcpStream>) -> Conn {
        let common_name = client_common_name(stream.get_ref().1);
        Conn::Tls(Box::new(stream), common_name)
    }

    fn unix_tls(stream: TlsStream<UnixStream>) -> Conn {
        let common_name = client_common_name(stream.get_ref().1);
        Conn::UnixTls(Box::new(stream), common_name)
    }
}

/// The subject common name of the client certificate a TLS session verified, if any.
fn client_common_name(session: &rustls::ServerConnection) -> Option<String> {
    session
        .peer_certificates()
        .and_then(|chain| chain.first())
        .and_then(|leaf| common_name(leaf.as_ref()))
}

/// The subject common name of a DER certificate.
fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_owned)
}

impl Connected for Conn {
    type ConnectInfo = leasehold_server::ConnInfo;

    /// The TCP peer (none over a Unix socket), for TLS connections too, and a client
    /// certificate's common name.
    fn connect_info(&self) -> leasehold_server::ConnInfo {
        let no_tcp = || tonic::transport::server::TcpConnectInfo {
            local_addr: None,
            remote_addr: None,
        };
        let (tcp, common_name) = match self {
            Conn::Plain(tcp) => (tcp.connect_info(), None),
            Conn::Tls(tls, common_name) => (tls.get_ref().0.connect_info(), common_name.clone()),
            Conn::Unix(_) => (no_tcp(), None),
            Conn::UnixTls(_, common_name) => (no_tcp(), common_name.clone()),
        };
        leasehold_server::ConnInfo { tcp, common_name }
    }
}

/// `$body` with `$io` bound to the connection's stream, whichever kind it is.
macro_rules! each_stream {
    ($conn:expr, $io:ident => $body:expr) => {
        match $conn {
            Conn::Plain($io) => $body,
            Conn::Tls($io, _) => {
                let $io = $io.as_mut();
                $body
            }
            Conn::Unix($io) => $body,
            Conn::UnixTls($io, _) => {
                let $io = $io.as_mut();
                $body
            }
        }
    };
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        each_stream!(self.get_mut(), io => Pin::new(io).poll_read(cx, buf))
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        each_stream!(self.get_mut(), io => Pin::new(io).poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        each_stream!(self.get_mut(), io => Pin::new(io).poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(io) => io.is_write_vectored(),
            Conn::Tls(io, _) => io.is_write_vectored(),
            Conn::Unix(io) => io.is_write_vectored(),
            Conn::UnixTls(io, _) => io.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        each_stream!(self.get_mut(), io => Pin::new(io).poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        each_stream!(self.get_mut(), io => Pin::new(io).poll_shutdown(cx))
    }
}

/// A listener whose connections [`tls`] handshakes: TCP or a Unix socket.
trait Accept: Send + Sync + 'static {
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// The next connection, and who it is from (for logs).
    fn accept_one(
        &self,
    ) -> impl std::future::Future<Output = std::io::Result<(Self::Stream, String)>> + Send;

    /// Whether `stream`'s first byte opens a TLS handshake (a TLS record of type 22), waiting
    /// for it; a socket that cannot tell says yes.
    fn opens_tls(
        stream: &Self::Stream,
    ) -> impl std::future::Future<Output = std::io::Result<bool>> + Send;
}

impl Accept for TcpListener {
    type Stream = TcpStream;

    async fn accept_one(&self) -> std::io::Result<(TcpStream, String)> {
        let (tcp, from) = self.accept().await?;
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::warn!("TCP_NODELAY: {e}");
        }
        Ok((tcp, from.to_string()))
    }

    async fn opens_tls(stream: &TcpStream) -> std::io::Result<bool> {
        let mut first = [0u8; 1];
        let n = stream.peek(&mut first).await?;
        Ok(n == 0 || first[0] == TLS_HANDSHAKE_RECORD)
    }
}

/// The content type of a TLS record that carries a handshake: a TLS client's first byte.
const TLS_HANDSHAKE_RECORD: u8 = 22;

/// What a TLS listener accepted: a TLS session, or (with `plain_too`) a plain connection.
enum Accepted<S> {
    /// Boxed: a TLS session's state is far larger than a socket.
    Tls(Box<TlsStream<S>>),
    Plain(S),
}

impl Accept for UnixListener {
    type Stream = UnixStream;

    async fn accept_one(&self) -> std::io::Result<(UnixStream, String)> {
        let (stream, _) = self.accept().await?;
        Ok((stream, "a unix socket client".to_owned()))
    }

    async fn opens_tls(_: &UnixStream) -> std::io::Result<bool> {
        Ok(true)
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
/// [`HANDSHAKES_MAX`] at once; with `plain_too`, a connection that does not open with a TLS
/// handshake is handed over plain. The accept loop ends when the stream is dropped (the server
/// stopped).
fn tls<L: Accept>(
    listener: L,
    config: Arc<rustls::ServerConfig>,
    plain_too: bool,
    endpoint: Endpoint,
) -> impl Stream<Item = std::io::Result<Accepted<L::Stream>>> {
    let acceptor = TlsAcceptor::from(config);
    let (tx, rx) = mpsc::channel(ACCEPTED_QUEUE_LEN);
    let handshakes = Arc::new(tokio::sync::Semaphore::new(HANDSHAKES_MAX));
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = async {
                    let permit = handshakes.clone().acquire_owned().await;
                    (permit, listener.accept_one().await)
                } => accepted,
                () = tx.closed() => return,
            };
            let (Ok(permit), accepted) = accepted else {
                return;
            };
            let (stream, from) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                    continue;
                }
            };
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
                    if plain_too && !L::opens_tls(&stream).await? {
                        return Ok(Accepted::Plain(stream));
                    }
                    let tls = acceptor.accept(stream).await?;
                    Ok(Accepted::Tls(Box::new(tls)))
                })
                .await;
                drop(permit);
                match handshake {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => tracing::warn!(
                        "remote-addr" = %from,
                        "error" = %format!("TLS handshake failed: {}", handshake_error(&e)),
                        "{}",
                        endpoint.rejected()
                    ),
                    Err(_) => tracing::warn!(
                        "remote-addr" = %from,
                        "error" = %format!("TLS handshake took over {HANDSHAKE_TIMEOUT:?}"),
                        "{}",
                        endpoint.rejected()
                    ),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

#[cfg(test)]
mod tests {
    use super::handshake_error;

    #[test]
    fn a_certificate_outside_the_allowed_names_is_refused_in_etcds_words() {
        let refused = rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, refused);
        assert_eq!(
            handshake_error(&io),
            "client certificate authentication failed"
        );
        let other = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, other);
        assert!(
            handshake_error(&io).contains("UnknownIssuer"),
            "{}",
            handshake_error(&io)
        );
    }
}
