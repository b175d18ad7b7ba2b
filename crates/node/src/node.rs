//! [`Node`]: a member started in-process on listeners the caller bound.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, bail};
use leasehold_raft::{Fatal, Replica, ReplicaConfig};
use leasehold_server::ServerContext;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::{ListenAddr, ListenUrl, NodeConfig, split_urls};
use crate::transport;

/// How long a stopping member lets client requests finish before it cuts them off.
const DRAIN_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a leader that is asked to stop tries to hand leadership over first (etcd's test of
/// a graceful stop allows 1.5 s for all of it).
const HAND_OVER_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a member whose storage failed waits for its Raft core to stop before it returns.
const FATAL_STOP_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// The sockets a member serves on, bound before it starts so that a taken port fails fast,
/// before storage is touched, and so that a caller may bind port 0 and keep the port.
#[derive(Debug)]
pub struct Listeners {
    pub client: Vec<ClientListener>,
    /// TCP, or Unix sockets (`unix://` peer URLs, as etcd takes them).
    pub peer: Vec<ClientListener>,
    /// `--listen-metrics-urls`: HTTP endpoints only.
    pub metrics: Vec<TcpListener>,
    /// `--listen-client-http-urls`: HTTP client traffic only (the client listeners then serve
    /// gRPC only).
    pub client_http: Vec<TcpListener>,
}

impl Listeners {
    /// Binds the config's `--listen-client-urls`, `--listen-peer-urls` and
    /// `--listen-metrics-urls`, each list in order: [`Node::start`] serves the n-th listener of
    /// a list as its n-th URL says (`https://`: with TLS).
    pub async fn bind(config: &NodeConfig) -> anyhow::Result<Listeners> {
        // Bad flags are reported before a taken port can hide them.
        config.validate()?;
        let mut client = Vec::new();
        for url in config.client_urls()? {
            let l = ClientListener::bind(&url.addr)
                .await
                .with_context(|| format!("listen on {}", url.addr))?;
            client.push(l);
        }
        let tcp = |url: &ListenUrl| {
            url.addr
                .tcp()
                .with_context(|| format!("{} is not a TCP address", url.addr))
        };
        let mut peer = Vec::new();
        for url in config.peer_urls()? {
            let l = ClientListener::bind(&url.addr)
                .await
                .with_context(|| format!("listen on {} for peers", url.addr))?;
            peer.push(l);
        }
        let mut metrics = Vec::new();
        for url in config.metrics_urls()? {
            let l = TcpListener::bind(tcp(&url)?)
                .await
                .with_context(|| format!("listen on {} for metrics", url.addr))?;
            metrics.push(l);
        }
        let mut client_http = Vec::new();
        for url in config.client_http_urls()? {
            let l = TcpListener::bind(tcp(&url)?)
                .await
                .with_context(|| format!("listen on {} for HTTP clients", url.addr))?;
            client_http.push(l);
        }
        Ok(Listeners {
            client,
            peer,
            metrics,
            client_http,
        })
    }
}

/// A client listener: TCP, or a Unix socket (`unix://`, `unixs://`).
#[derive(Debug)]
pub enum ClientListener {
    Tcp(TcpListener),
    Unix(tokio::net::UnixListener),
}

impl From<TcpListener> for ClientListener {
    fn from(l: TcpListener) -> ClientListener {
        ClientListener::Tcp(l)
    }
}

impl ClientListener {
    /// Listens at `addr`. A Unix socket's file is replaced if one is left there (from a member
    /// that did not stop cleanly), as etcd does; any other file there is an error.
    async fn bind(addr: &ListenAddr) -> std::io::Result<ClientListener> {
        match addr {
            ListenAddr::Tcp(addr) => TcpListener::bind(addr).await.map(ClientListener::Tcp),
            ListenAddr::Unix(path) => {
                use std::os::unix::fs::FileTypeExt as _;
                if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
                    std::fs::remove_file(path)?;
                }
                tokio::net::UnixListener::bind(path).map(ClientListener::Unix)
            }
        }
    }

    /// Where it listens, as a URL's host part: `127.0.0.1:2379`, or the socket's path.
    fn local_addr(&self) -> std::io::Result<String> {
        match self {
            ClientListener::Tcp(l) => l.local_addr().map(|a| a.to_string()),
            ClientListener::Unix(l) => l.local_addr().map(|a| {
                a.as_pathname()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            }),
        }
    }
}

/// A running member. Dropping it does not stop it: complete the shutdown future given to
/// [`Node::start`], then [`Node::wait`].
pub struct Node {
    member_id: u64,
    client_addrs: Vec<SocketAddr>,
    replica: Arc<Replica>,
    supervisor: JoinHandle<anyhow::Result<()>>,
}

impl Node {
    /// Opens the data dir, starts Raft and serves clients and peers on `listeners` until
    /// `shutdown` completes (then drains client requests and stops Raft) or storage fails.
    pub async fn start<S>(
        config: NodeConfig,
        listeners: Listeners,
        shutdown: S,
    ) -> anyhow::Result<Node>
    where
        S: Future<Output = ()> + Send + 'static,
    {
        config.validate()?;
        let data_dir = config.data_dir();
        let fresh = !data_dir.join("leasehold.redb").exists();
        let data_dir = std::path::absolute(&data_dir).unwrap_or(data_dir);
        let network = leasehold_peer::PeerNetwork::with_tls(config.peer_client_tls()?);
        let identity = crate::member_ids::resolve(&config, &data_dir, !fresh, &network).await?;
        tracing::info!(
            name = %config.name,
            member_id = %format!("{:x}", identity.member_id),
            data_dir = %data_dir.display(),
            "starting leasehold {} ({})",
            env!("CARGO_PKG_VERSION"),
            if fresh { "new data dir" } else { "recovering from data dir" },
        );
        config.log_as_etcd();
        let network = network.for_cluster(identity.cluster_id);
        let traffic = network.traffic();
        let forwarder = Arc::new(leasehold_peer::PeerForwarder::new(
            network.clone(),
            std::time::Duration::from_millis(config.election_timeout),
        ));
        let replica_config = ReplicaConfig {
            member_id: identity.member_id,
            peer_url: identity.peer_urls[0].clone(),
            initial_peers: identity.peers.clone(),
            // A fresh member of an existing cluster waits for the leader to add it.
            bootstrap: config.initial_cluster_state == "new",
            data_dir: data_dir.clone(),
            heartbeat_interval_ms: config.heartbeat_interval,
            election_timeout_ms: config.election_timeout,
            snapshot_log_entries_max: config.snapshot_count,
            quota_bytes: config.quota_bytes(),
            auth_token_ttl: config.auth_token_ttl(),
            lease_cover_margin_ms: u64::try_from(config.lease_cover_margin.as_millis())
                .unwrap_or(u64::MAX),
            strict_reconfig_check: config.strict_reconfig_check,
            force_new_cluster: config.force_new_cluster,
            compaction_pace: config.compaction_pace(),
            clock: leasehold_raft::system_clock(),
        };
        // The links report a peer they cannot reach to the replica, which starts after them
        // (its Raft thread sends through them from the start).
        let started: Arc<std::sync::OnceLock<std::sync::Weak<Replica>>> = Arc::default();
        let unreachable = {
            let started = started.clone();
            Arc::new(move |id: u64| {
                if let Some(replica) = started.get().and_then(std::sync::Weak::upgrade) {
                    replica.report_unreachable(id);
                }
            })
        };
        // Keepalives every heartbeat interval: every member hears from every other, as etcd's.
        let links = Arc::new(
            leasehold_peer::RaftLinks::new(network, unreachable).with_keepalive(
                identity.member_id,
                std::time::Duration::from_millis(config.heartbeat_interval.max(1)),
            ),
        );
        let replica = Replica::start_with(replica_config, links, forwarder).await;
        if let Ok(replica) = &replica {
            let _ = started.set(Arc::downgrade(replica));
        }
        let replica = replica.with_context(|| format!("open data dir {}", data_dir.display()))?;
        let client_hosts = listeners
            .client
            .iter()
            .map(ClientListener::local_addr)
            .collect::<Result<Vec<_>, _>>()?;
        let client_addrs = listeners
            .client
            .iter()
            .filter_map(|l| match l {
                ClientListener::Tcp(l) => Some(l.local_addr()),
                ClientListener::Unix(_) => None,
            })
            .collect::<Result<Vec<_>, _>>()?;
        let client_unix =
            |i: usize| matches!(listeners.client.get(i), Some(ClientListener::Unix(_)));
        // The n-th listener serves the n-th URL; listeners beyond the URLs (a caller's own)
        // serve plain HTTP.
        let schemes = |urls: Vec<ListenUrl>| move |i: usize| urls.get(i).is_some_and(|u| u.tls);
        let (client_tls, peer_tls) = (config.client_tls()?, config.peer_tls()?);
        let client_urls = config.client_urls()?;
        let client_plain_too =
            |i: usize| client_urls.get(i).is_some_and(|u: &ListenUrl| u.plain_too);
        let client_is_tls = schemes(client_urls.clone());
        let peer_is_tls = schemes(config.peer_urls()?);
        let metrics_is_tls = schemes(config.metrics_urls()?);
        let client_http_is_tls = schemes(config.client_http_urls()?);
        // etcd: with HTTP listeners of their own, the client listeners serve gRPC only.
        let client_routes = if listeners.client_http.is_empty() {
            leasehold_server::ClientRoutes::All
        } else {
            leasehold_server::ClientRoutes::GrpcOnly
        };
        let client_urls = match &config.advertise_client_urls {
            Some(urls) => split_urls(urls),
            None => client_hosts
                .iter()
                .enumerate()
                .map(|(i, a)| {
                    let scheme = match (client_unix(i), client_is_tls(i)) {
                        (true, false) => "unix",
                        (true, true) => "unixs",
                        (false, tls) => scheme(tls),
                    };
                    format!("{scheme}://{a}")
                })
                .collect(),
        };
        let ctx = Arc::new(ServerContext {
            replica: replica.clone(),
            cluster_id: identity.cluster_id,
            member_id: identity.member_id,
            name: config.name.clone(),
            client_urls,
            peer_urls: identity.peer_urls.clone(),
            lease_ttl_secs_min: leasehold_server::lease_ttl_secs_min(
                config.heartbeat_interval,
                config.election_timeout,
            ),
            lease_ids: leasehold_server::LeaseIdGenerator::new(identity.member_id, unix_ms()),
            watch_progress_interval: config.watch_progress_interval(),
            cluster_token: config.initial_cluster_token.clone(),
            member_names: identity.names.clone(),
            metrics: Arc::new(
                leasehold_server::Metrics::new(replica.clone(), config.metrics == "extensive")
                    .with_peer_traffic(peer_traffic_source(traffic.clone()))
                    .warn_of_requests_over(config.warning_unary_request_duration()),
            ),
            limits: config.limits(),
            keepalive: config.keepalive(),
            json_gateway: config.enable_grpc_gateway,
            bcrypt_cost: config.bcrypt_cost(),
            tokens: config.token_mode()?,
        });
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut servers = Vec::new();
        for (i, listener) in listeners.peer.into_iter().enumerate() {
            let addr = listener.local_addr()?;
            let tls = tls_of(peer_is_tls(i), &peer_tls)?;
            let url_scheme = match (&listener, tls.is_some()) {
                (ClientListener::Unix(_), false) => "unix",
                (ClientListener::Unix(_), true) => "unixs",
                (ClientListener::Tcp(_), tls) => scheme(tls),
            };
            let incoming = match listener {
                ClientListener::Tcp(l) => {
                    transport::incoming(l, tls, false, transport::Endpoint::Peer)
                }
                ClientListener::Unix(l) => transport::incoming_unix(l, tls),
            };
            let served = leasehold_peer::serve_peers(
                replica.clone(),
                identity.cluster_id,
                traffic.clone(),
                incoming,
                stopped(stop_rx.clone()),
            );
            serve_in_background("peers", url_scheme, addr, served);
        }
        // etcd's initial corruption check runs with the peers served and before the clients.
        if config.initial_corrupt_check()
            && let Err(why) = leasehold_server::initial_check(&replica, identity.member_id).await
        {
            let _ = stop_tx.send(true);
            replica.shutdown().await;
            bail!("{why}");
        }
        if let Some(threshold) = config.bootstrap_defrag_threshold() {
            defragment_at_start(&replica, threshold).await;
        }
        for (i, listener) in listeners.client.into_iter().enumerate() {
            let addr = listener.local_addr()?;
            let tls = tls_of(client_is_tls(i), &client_tls)?;
            let plain_too = client_plain_too(i);
            // etcd's words, which tools wait for.
            if tls.is_some() {
                let address = format!("{}://{addr}", scheme(true));
                tracing::info!(address, "serving client traffic securely");
            }
            if tls.is_none() || plain_too {
                let address = format!("{}://{addr}", scheme(false));
                tracing::warn!(
                    address,
                    "serving client traffic insecurely; this is strongly discouraged!"
                );
            }
            let incoming = match listener {
                ClientListener::Tcp(l) => {
                    transport::incoming(l, tls, plain_too, transport::Endpoint::Client)
                }
                ClientListener::Unix(l) => transport::incoming_unix(l, tls),
            };
            let served = leasehold_server::serve_client(
                ctx.clone(),
                incoming,
                stopped(stop_rx.clone()),
                client_routes,
            );
            servers.push(tokio::spawn(served));
        }
        for (i, listener) in listeners.client_http.into_iter().enumerate() {
            let addr = listener.local_addr()?;
            let tls = tls_of(client_http_is_tls(i), &client_tls)?;
            tracing::info!(
                "address" = %format!("{}://{addr}", scheme(tls.is_some())),
                "serving HTTP client traffic"
            );
            let incoming = transport::incoming(listener, tls, false, transport::Endpoint::Client);
            let served = leasehold_server::serve_client(
                ctx.clone(),
                incoming,
                stopped(stop_rx.clone()),
                leasehold_server::ClientRoutes::HttpOnly,
            );
            // Drained on a stop as the client listeners are: gateway watches run here.
            servers.push(tokio::spawn(served));
        }
        for (i, listener) in listeners.metrics.into_iter().enumerate() {
            let addr = listener.local_addr()?;
            let tls = tls_of(metrics_is_tls(i), &client_tls)?;
            let https = scheme(tls.is_some());
            let incoming = transport::incoming(listener, tls, false, transport::Endpoint::Client);
            let served =
                leasehold_server::serve_http(ctx.clone(), incoming, stopped(stop_rx.clone()));
            serve_in_background(
                "/metrics, /health, /livez, /readyz, /version",
                https,
                addr,
                served,
            );
        }
        // Ready once this member's attributes are in the log, as etcd says it (a leader was
        // elected and this member is part of its quorum): tools wait for this line.
        let published = leasehold_server::publish_member(
            replica.clone(),
            leasehold_raft::MemberAttrs {
                id: identity.member_id,
                name: ctx.name.clone(),
                client_urls: ctx.client_urls.clone(),
            },
            stop_rx.clone(),
        );
        tokio::spawn(async move {
            if published.await {
                tracing::info!("ready to serve client requests");
            }
        });
        let compactor = config.auto_compaction()?.map(|mode| {
            tokio::spawn(leasehold_server::drive_auto_compaction(
                replica.clone(),
                mode,
                stop_rx.clone(),
            ))
        });
        if !config.corrupt_check_period().is_zero() {
            tokio::spawn(leasehold_server::drive_corruption_checks(
                replica.clone(),
                config.corrupt_check_period(),
                stop_rx.clone(),
            ));
        }
        if let Some(every) = config.compact_hash_check_period() {
            tokio::spawn(leasehold_server::drive_compaction_hash_checks(
                replica.clone(),
                every,
                stop_rx.clone(),
            ));
        }
        let expiry = tokio::spawn(leasehold_server::drive_lease_expiry(
            replica.clone(),
            ctx.metrics.clone(),
            leasehold_server::ExpiryConfig::default(),
            stop_rx,
        ));
        let supervised = replica.clone();
        let supervisor = tokio::spawn(async move {
            let failure = tokio::select! {
                () = shutdown => None,
                reason = supervised.failed() => Some(reason),
                () = supervised.removed() => {
                    // etcd stops a removed member and its process exits 0; so does this one,
                    // through the same drain as a shutdown.
                    tracing::warn!(
                        "the member has been permanently removed from the cluster; stopping"
                    );
                    None
                }
            };
            if failure.is_none() {
                // Before anything stops: the others then need not wait out an election.
                supervised.hand_over_leadership(HAND_OVER_WAIT_MAX).await;
            }
            let _ = stop_tx.send(true);
            // Lock and election waiters wait for deletes that may never come: end them, so the
            // drain below (or the exit) is not held up.
            supervised.stop_waiters();
            if let Some(reason) = failure {
                // Up but serving nothing would be the worst outcome: no supervisor restarts
                // that. Every acknowledged write is in the fsync'd log; a restart (once the disk
                // has room) recovers.
                let what = match reason {
                    Fatal::Storage(_) => "storage failed",
                    _ => "the raft core stopped",
                };
                tracing::error!("fatal: {what} ({reason}); exiting");
                // Bounded: the process is about to exit; an in-process member must not keep its
                // data dir open.
                let _ = tokio::time::timeout(FATAL_STOP_WAIT_MAX, supervised.shutdown()).await;
                bail!("{what}, the member cannot serve: {reason}");
            }
            tracing::info!("shutting down: draining client requests");
            // Streams end on the stop (`Replica::stopping`); a request still running after the
            // bound is cut off, as etcd's GracefulStop is followed by Stop.
            let drain = async {
                for server in &mut servers {
                    server.await??;
                }
                anyhow::Ok(())
            };
            match tokio::time::timeout(DRAIN_WAIT_MAX, drain).await {
                Ok(drained) => drained?,
                Err(_) => {
                    tracing::warn!(
                        "client requests still running {DRAIN_WAIT_MAX:?} after the stop; cutting them off"
                    );
                    for server in &servers {
                        server.abort();
                    }
                }
            }
            expiry.await?;
            if let Some(compactor) = compactor {
                compactor.await?;
            }
            supervised.shutdown().await;
            tracing::info!("stopped");
            Ok(())
        });
        Ok(Node {
            member_id: identity.member_id,
            client_addrs,
            replica,
            supervisor,
        })
    }

    /// Waits until the member has stopped: `Ok` after the shutdown future completed and the
    /// member drained, `Err` when storage failed and the member cannot serve.
    pub async fn wait(self) -> anyhow::Result<()> {
        self.supervisor.await?
    }

    pub fn member_id(&self) -> u64 {
        self.member_id
    }

    /// The addresses the client listeners are bound to.
    pub fn client_addrs(&self) -> &[SocketAddr] {
        &self.client_addrs
    }

    pub fn replica(&self) -> &Arc<Replica> {
        &self.replica
    }
}

/// `--bootstrap-defrag-threshold-megabytes`: before clients are served, defragments the
/// database file if that frees at least `threshold` bytes, as etcd does (and logs its words when
/// it does not). A failure is logged, not fatal: the member serves from the file as it is.
async fn defragment_at_start(replica: &Replica, threshold: u64) {
    let size = replica.db_size_bytes();
    let in_use = replica.db_size_in_use_bytes().await;
    let freeable = size.saturating_sub(in_use);
    if freeable < threshold {
        tracing::info!(
            "current-db-size-bytes" = size,
            "current-db-size-in-use-bytes" = in_use,
            "bootstrap-defrag-threshold-bytes" = threshold,
            "Skipping defragmentation"
        );
        return;
    }
    match replica.defragment().await {
        Ok(Some(done)) => tracing::info!(
            "db-size-bytes-before" = done.bytes_before,
            "db-size-bytes-after" = done.bytes_after,
            "bootstrap-defrag-threshold-bytes" = threshold,
            "defragmented the database file at start-up"
        ),
        Ok(None) => tracing::warn!("defragmentation at start-up did not run: the file was busy"),
        Err(e) => tracing::warn!("defragmentation at start-up failed: {e}"),
    }
}

async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Serves `what` on `addr` on a task of its own, not waited for at a stop (the client servers
/// are: they drain requests); a failure is logged.
fn serve_in_background<E: std::fmt::Display>(
    what: &'static str,
    scheme: &str,
    addr: impl std::fmt::Display + Send + 'static,
    served: impl std::future::Future<Output = Result<(), E>> + Send + 'static,
) {
    tracing::info!("serving {what} on {scheme}://{addr}");
    tokio::spawn(async move {
        if let Err(e) = served.await {
            tracing::error!("serving {what} on {addr}: {e}");
        }
    });
}

fn scheme(tls: bool) -> &'static str {
    if tls { "https" } else { "http" }
}

/// The TLS configuration a listener serves with: `config` if its URL is `https://`.
fn tls_of(
    https: bool,
    config: &Option<Arc<rustls::ServerConfig>>,
) -> anyhow::Result<Option<Arc<rustls::ServerConfig>>> {
    match (https, config) {
        (false, _) => Ok(None),
        (true, Some(config)) => Ok(Some(config.clone())),
        // `NodeConfig::client_tls`/`peer_tls` make one whenever a URL is https://.
        (true, None) => bail!("an https:// listener without a TLS configuration"),
    }
}

/// The peer links' traffic, as the metrics read it.
fn peer_traffic_source(
    traffic: Arc<leasehold_peer::Traffic>,
) -> leasehold_server::PeerTrafficSource {
    Arc::new(move || {
        traffic
            .readings()
            .into_iter()
            .map(|p| leasehold_server::PeerTraffic {
                id: p.id,
                sent_bytes: p.sent_bytes,
                received_bytes: p.received_bytes,
                sent_failures: p.sent_failures,
                active: p.active,
            })
            .collect()
    })
}
