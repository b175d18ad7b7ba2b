//! The connector for [`crate::PeerTls::Unverified`]: TCP (with TCP_NODELAY, as every peer
//! connection), then a TLS handshake with the caller's rustls configuration, handed to tonic as
//! its transport. tonic's own TLS always checks the peer's certificate; `--peer-auto-tls` needs a
//! handshake whose configuration decides that.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tonic::transport::Uri;

#[derive(Clone)]
pub(crate) struct TlsConnector(pub(crate) Arc<rustls::ClientConfig>);

type Connecting =
    Pin<Box<dyn Future<Output = Result<TokioIo<TlsStream<TcpStream>>, std::io::Error>> + Send>>;

impl tower_service::Service<Uri> for TlsConnector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Connecting;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let config = self.0.clone();
        Box::pin(async move {
            let invalid = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, what);
            let host = uri
                .host()
                .ok_or_else(|| invalid("a peer URL without a host"))?;
            let host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned();
            let port = uri
                .port_u16()
                .ok_or_else(|| invalid("a peer URL without a port"))?;
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            let name = ServerName::try_from(host).map_err(|_| invalid("a bad peer host name"))?;
            let tls = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await?;
            Ok(TokioIo::new(tls))
        })
    }
}

/// Connects to a Unix socket whatever the URI says: a `unix://` peer URL, as etcd takes them
/// (`unix://localhost:2380` is the socket file `localhost:2380` in the working directory).
#[derive(Clone, Debug)]
pub(crate) struct UnixConnector(pub(crate) std::path::PathBuf);

impl tower_service::Service<Uri> for UnixConnector {
    type Response = TokioIo<tokio::net::UnixStream>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let path = self.0.clone();
        Box::pin(async move {
            tokio::net::UnixStream::connect(path)
                .await
                .map(TokioIo::new)
        })
    }
}
