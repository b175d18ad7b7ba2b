//! etcd's TLS flags, client side and peer side, as typed settings, and the rustls
//! configurations made from them: a listener whose URL is `https://` serves TLS with the side's
//! certificate (or a self-signed one under `--auto-tls`), requiring a client certificate from
//! the trusted CA under `--client-cert-auth` (or when a trusted CA is given); a member reaches
//! `https://` peer URLs checking the peer's certificate against `--peer-trusted-ca-file`, or,
//! under `--peer-auto-tls` alone, taking any (etcd's rule for self-signed peers). Every file is read at start-up, so a
//! bad one stops the member with a message that names it.
//!
//! Both sides have the same fields (etcd's `transport.TLSInfo`), so that one function can build
//! a TLS configuration for either; in a config file they are etcd's `client-transport-security`
//! and `peer-transport-security` maps (see `sources.rs`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Args;
use rustls::crypto::CryptoProvider;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};

use crate::values::parse_go_bool;

/// The `--help` heading of the TLS flags; `sources.rs` also recognises them by it.
pub(crate) const HEADING: &str = "TLS";

#[derive(Args, Debug, Clone, Default, PartialEq, Eq)]
#[command(next_help_heading = HEADING)]
pub struct TlsFlags {
    #[command(flatten)]
    pub client: ClientTls,
    #[command(flatten)]
    pub peer: PeerTls,
    /// Years of validity of the certificates made by --auto-tls and --peer-auto-tls.
    #[arg(long, default_value_t = 1)]
    pub self_signed_cert_validity: u32,
    /// Comma-separated TLS cipher suites for client and peer connections (empty: the TLS
    /// library's choice).
    #[arg(long, value_delimiter = ',', action = clap::ArgAction::Set)]
    pub cipher_suites: Vec<String>,
    /// Lowest TLS version accepted: TLS1.2 or TLS1.3.
    #[arg(long, default_value = "TLS1.2", value_parser = tls_version)]
    pub tls_min_version: String,
    /// Highest TLS version accepted: TLS1.2, TLS1.3, or empty for the library's highest.
    #[arg(long, default_value = "", value_parser = tls_version)]
    pub tls_max_version: String,
}

/// etcd's TLS version names (empty: no bound).
fn tls_version(s: &str) -> Result<String, String> {
    match s {
        "" | "TLS1.2" | "TLS1.3" => Ok(s.to_owned()),
        _ => Err(format!(
            "unexpected TLS version {s:?} (use TLS1.2 or TLS1.3)"
        )),
    }
}

/// The client listeners' TLS (`--cert-file`, `--key-file`, ...).
#[derive(Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// Certificate the client server presents.
    #[arg(long)]
    pub cert_file: Option<PathBuf>,
    /// Key of --cert-file.
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// Certificate this member presents as a client (when client certificates are required),
    /// instead of --cert-file.
    #[arg(long)]
    pub client_cert_file: Option<PathBuf>,
    /// Key of --client-cert-file.
    #[arg(long)]
    pub client_key_file: Option<PathBuf>,
    /// CA bundle that client certificates are checked against.
    #[arg(long)]
    pub trusted_ca_file: Option<PathBuf>,
    /// Require clients to present a certificate signed by --trusted-ca-file.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "false", value_parser = parse_go_bool)]
    pub client_cert_auth: bool,
    /// Serve clients over TLS with a self-signed certificate made at start-up.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "false", value_parser = parse_go_bool)]
    pub auto_tls: bool,
    /// Certificate revocation list for client certificates.
    #[arg(long = "client-crl-file")]
    pub crl_file: Option<PathBuf>,
    /// Comma-separated common names a client certificate must have one of. etcd sets this only
    /// from a config file (`client-transport-security: allowed-cn`), so the flag is hidden.
    #[arg(long = "client-cert-allowed-cn", value_delimiter = ',', action = clap::ArgAction::Set, hide = true)]
    pub allowed_cn: Vec<String>,
    /// Comma-separated SAN host names a client certificate must have one of.
    #[arg(long = "client-cert-allowed-hostname", value_delimiter = ',', action = clap::ArgAction::Set)]
    pub allowed_hostname: Vec<String>,
}

/// The peer listeners' and peer clients' TLS (`--peer-cert-file`, ...).
#[derive(Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerTls {
    /// Certificate the peer server presents.
    #[arg(long = "peer-cert-file", id = "peer_cert_file")]
    pub cert_file: Option<PathBuf>,
    /// Key of --peer-cert-file.
    #[arg(long = "peer-key-file", id = "peer_key_file")]
    pub key_file: Option<PathBuf>,
    /// Certificate this member presents to other members, instead of --peer-cert-file.
    #[arg(long = "peer-client-cert-file", id = "peer_client_cert_file")]
    pub client_cert_file: Option<PathBuf>,
    /// Key of --peer-client-cert-file.
    #[arg(long = "peer-client-key-file", id = "peer_client_key_file")]
    pub client_key_file: Option<PathBuf>,
    /// CA bundle that other members' certificates are checked against.
    #[arg(long = "peer-trusted-ca-file", id = "peer_trusted_ca_file")]
    pub trusted_ca_file: Option<PathBuf>,
    /// Require other members to present a certificate signed by --peer-trusted-ca-file.
    #[arg(long = "peer-client-cert-auth", id = "peer_client_cert_auth", num_args = 0..=1,
          require_equals = true, default_missing_value = "true", default_value = "false",
          value_parser = parse_go_bool)]
    pub client_cert_auth: bool,
    /// Talk to other members over TLS with a self-signed certificate made at start-up.
    #[arg(long = "peer-auto-tls", id = "peer_auto_tls", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", default_value = "false", value_parser = parse_go_bool)]
    pub auto_tls: bool,
    /// Certificate revocation list for other members' certificates.
    #[arg(long = "peer-crl-file", id = "peer_crl_file")]
    pub crl_file: Option<PathBuf>,
    /// Comma-separated common names another member's certificate must have one of.
    #[arg(long = "peer-cert-allowed-cn", id = "peer_cert_allowed_cn", value_delimiter = ',', action = clap::ArgAction::Set)]
    pub allowed_cn: Vec<String>,
    /// Comma-separated SAN host names another member's certificate must have one of.
    #[arg(
        long = "peer-cert-allowed-hostname",
        id = "peer_cert_allowed_hostname",
        value_delimiter = ',', action = clap::ArgAction::Set
    )]
    pub allowed_hostname: Vec<String>,
    /// Do not check the SAN of other members' client certificates.
    #[arg(long = "experimental-peer-skip-client-san-verification", num_args = 0..=1,
          require_equals = true, default_missing_value = "true", default_value = "false",
          value_parser = parse_go_bool)]
    pub skip_client_san_verification: bool,
}

/// One side's TLS settings, whichever side: what both [`ClientTls`] and [`PeerTls`] carry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Side<'a> {
    /// The flag prefix in messages: `""` or `"peer-"`.
    pub(crate) prefix: &'static str,
    pub(crate) cert_file: Option<&'a Path>,
    pub(crate) key_file: Option<&'a Path>,
    /// What this member presents when it connects as a client (peers only).
    pub(crate) client_cert_file: Option<&'a Path>,
    pub(crate) client_key_file: Option<&'a Path>,
    pub(crate) trusted_ca_file: Option<&'a Path>,
    pub(crate) client_cert_auth: bool,
    pub(crate) auto_tls: bool,
    pub(crate) crl_file: Option<&'a Path>,
    /// A client certificate must name one of these as its common name, or be valid for one of
    /// `allowed_hostname` (either list satisfies; both empty: no such check).
    pub(crate) allowed_cn: &'a [String],
    pub(crate) allowed_hostname: &'a [String],
}

impl ClientTls {
    pub(crate) fn side(&self) -> Side<'_> {
        Side {
            prefix: "",
            cert_file: self.cert_file.as_deref(),
            key_file: self.key_file.as_deref(),
            client_cert_file: self.client_cert_file.as_deref(),
            client_key_file: self.client_key_file.as_deref(),
            trusted_ca_file: self.trusted_ca_file.as_deref(),
            client_cert_auth: self.client_cert_auth,
            auto_tls: self.auto_tls,
            crl_file: self.crl_file.as_deref(),
            allowed_cn: &self.allowed_cn,
            allowed_hostname: &self.allowed_hostname,
        }
    }
}

impl PeerTls {
    pub(crate) fn side(&self) -> Side<'_> {
        Side {
            prefix: "peer-",
            cert_file: self.cert_file.as_deref(),
            key_file: self.key_file.as_deref(),
            client_cert_file: self.client_cert_file.as_deref(),
            client_key_file: self.client_key_file.as_deref(),
            trusted_ca_file: self.trusted_ca_file.as_deref(),
            client_cert_auth: self.client_cert_auth,
            auto_tls: self.auto_tls,
            crl_file: self.crl_file.as_deref(),
            allowed_cn: &self.allowed_cn,
            allowed_hostname: &self.allowed_hostname,
        }
    }
}

/// rustls with ring, named explicitly so that no process-wide default provider is needed.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(what: &str, path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("{what} {}", path.display()))
}

fn certificates(flag: &str, path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let pem = read(&format!("--{flag}"), path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("--{flag} {}: not PEM certificates", path.display()))?;
    if certs.is_empty() {
        bail!("--{flag} {}: no certificate in the file", path.display());
    }
    Ok(certs)
}

fn private_key(flag: &str, path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    let pem = read(&format!("--{flag}"), path)?;
    PrivateKeyDer::from_pem_slice(&pem)
        .with_context(|| format!("--{flag} {}: no PEM private key", path.display()))
}

impl TlsFlags {
    /// The TLS versions `--tls-min-version` and `--tls-max-version` allow.
    fn versions(&self) -> anyhow::Result<Vec<&'static rustls::SupportedProtocolVersion>> {
        let rank = |v: &str| match v {
            "TLS1.3" => 1,
            _ => 0,
        };
        // Empty: no bound (the lowest for the minimum, the highest for the maximum).
        let min = rank(&self.tls_min_version);
        let max = if self.tls_max_version.is_empty() {
            1
        } else {
            rank(&self.tls_max_version)
        };
        if min > max {
            bail!(
                "--tls-min-version {} is above --tls-max-version {}",
                self.tls_min_version,
                self.tls_max_version
            );
        }
        let all = [&rustls::version::TLS12, &rustls::version::TLS13];
        Ok(all[min..=max].to_vec())
    }

    /// The server configuration of `side`'s listeners: its certificate (or a self-signed one
    /// for `hosts` under auto TLS) and, with client certificate auth, a verifier of client
    /// certificates against the trusted CA (and the CRL). ALPN offers HTTP/2 and HTTP/1.1, as
    /// Go's server does, so curl and probes reach the HTTP endpoints over TLS too. Every file is
    /// read and checked here, at start-up: a bad file stops the member with its name.
    pub(crate) fn server_config(
        &self,
        side: Side<'_>,
        hosts: &[String],
    ) -> anyhow::Result<Arc<rustls::ServerConfig>> {
        let p = side.prefix;
        let (certs, key) = match (side.cert_file, side.key_file) {
            (Some(cert), Some(key)) => (
                certificates(&format!("{p}cert-file"), cert)?,
                private_key(&format!("{p}key-file"), key)?,
            ),
            (None, None) if side.auto_tls => self_signed(hosts, self.self_signed_cert_validity)?,
            (None, None) => {
                bail!("an https:// URL needs --{p}cert-file and --{p}key-file (or --{p}auto-tls)")
            }
            _ => bail!("--{p}cert-file and --{p}key-file go together"),
        };
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&self.versions()?)
            .context("TLS versions")?;
        // As etcd: a trusted CA alone also makes client certificates required (Go's
        // RequireAndVerifyClientCert), not only --client-cert-auth.
        let builder = if side.client_cert_auth || side.trusted_ca_file.is_some() {
            let Some(ca) = side.trusted_ca_file else {
                bail!("--{p}client-cert-auth needs --{p}trusted-ca-file");
            };
            let mut roots = rustls::RootCertStore::empty();
            let trusted = certificates(&format!("{p}trusted-ca-file"), ca)?;
            for cert in &trusted {
                roots
                    .add(cert.clone())
                    .with_context(|| format!("--{p}trusted-ca-file {}", ca.display()))?;
            }
            let mut verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                roots.into(),
                provider(),
            );
            if let Some(crl) = side.crl_file {
                let bytes = read(&format!("--{p}crl-file"), crl)?;
                let mut crls = CertificateRevocationListDer::pem_slice_iter(&bytes)
                    .collect::<Result<Vec<_>, _>>()
                    .with_context(|| format!("--{p}crl-file {}: not PEM CRLs", crl.display()))?;
                // As Go's x509.ParseCRL, which etcd uses: PEM, or else one DER CRL (etcd's own
                // test fixture is DER). A file that is neither fails when the verifier is built.
                if crls.is_empty() {
                    crls.push(CertificateRevocationListDer::from(bytes));
                }
                // As etcd checks a CRL: against the client's own certificate, and a certificate
                // no CRL speaks of is good.
                verifier = verifier
                    .with_crls(crls)
                    .only_check_end_entity_revocation()
                    .allow_unknown_revocation_status();
            }
            let verifier = verifier
                .build()
                .with_context(|| format!("--{p}trusted-ca-file"))?;
            builder.with_client_cert_verifier(Arc::new(EtcdClientCertCheck {
                inner: verifier,
                trusted,
                allowed_cn: side.allowed_cn.to_vec(),
                allowed_hostname: side.allowed_hostname.to_vec(),
            }))
        } else {
            builder.with_no_client_auth()
        };
        let mut config = builder
            .with_single_cert(certs, key)
            .with_context(|| format!("--{p}cert-file and --{p}key-file do not make a pair"))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// What this member uses to reach other members over `https://` peer URLs: their
    /// certificates are checked against `--peer-trusted-ca-file`, and it presents
    /// `--peer-client-cert-file` (or `--peer-cert-file`). Under `--peer-auto-tls` (without a
    /// trusted CA), as etcd: TLS that takes any certificate, since every member's is
    /// self-signed.
    pub(crate) fn peer_client_config(&self) -> anyhow::Result<leasehold_peer::PeerTls> {
        let side = self.peer.side();
        if side.auto_tls && side.trusted_ca_file.is_none() {
            let config = rustls::ClientConfig::builder_with_provider(provider())
                .with_protocol_versions(&self.versions()?)
                .context("TLS versions")?
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider())))
                .with_no_client_auth();
            let mut config = config;
            config.alpn_protocols = vec![b"h2".to_vec()];
            return Ok(leasehold_peer::PeerTls::Unverified(Arc::new(config)));
        }
        let mut config = tonic::transport::ClientTlsConfig::new();
        config = match side.trusted_ca_file {
            Some(ca) => {
                let ca_pem = read("--peer-trusted-ca-file", ca)?;
                certificates("peer-trusted-ca-file", ca)?;
                config.ca_certificate(tonic::transport::Certificate::from_pem(ca_pem))
            }
            // As etcd's peers (Go's TLS client): the system's roots. A one-member cluster
            // never dials a peer; larger ones need members whose certificates those roots sign.
            None => config.with_native_roots(),
        };
        let (cert, key) = match (side.client_cert_file, side.client_key_file) {
            (Some(cert), Some(key)) => (Some(cert), Some(key)),
            _ => (side.cert_file, side.key_file),
        };
        if let (Some(cert), Some(key)) = (cert, key) {
            let (cert_flag, key_flag) = if side.client_cert_file.is_some() {
                ("peer-client-cert-file", "peer-client-key-file")
            } else {
                ("peer-cert-file", "peer-key-file")
            };
            certificates(cert_flag, cert)?;
            private_key(key_flag, key)?;
            config = config.identity(tonic::transport::Identity::from_pem(
                read(&format!("--{cert_flag}"), cert)?,
                read(&format!("--{key_flag}"), key)?,
            ));
        }
        Ok(leasehold_peer::PeerTls::Verified(config))
    }

    /// Flags that are parsed but have no effect yet, for the start-up warning.
    pub(crate) fn not_applied(&self) -> Vec<&'static str> {
        let mut names = Vec::new();
        if !self.cipher_suites.is_empty() {
            names.push("--cipher-suites");
        }
        if self.peer.skip_client_san_verification {
            names.push("--experimental-peer-skip-client-san-verification");
        }
        names
    }
}

/// A self-signed certificate for `hosts` (names or IP addresses), made at start-up, as etcd's
/// `--auto-tls` makes one.
fn self_signed(
    hosts: &[String],
    validity_years: u32,
) -> anyhow::Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let mut names: Vec<String> = hosts.to_vec();
    names.push("localhost".into());
    names.sort();
    names.dedup();
    let mut params =
        rcgen::CertificateParams::new(names).context("--auto-tls: certificate names")?;
    let now = std::time::SystemTime::now();
    let days = u64::from(validity_years.max(1)) * 365;
    params.not_before = now.into();
    params.not_after = (now + std::time::Duration::from_secs(days * 86_400)).into();
    let key = rcgen::KeyPair::generate().context("--auto-tls: key")?;
    let cert = params
        .self_signed(&key)
        .context("--auto-tls: certificate")?;
    let key = PrivateKeyDer::try_from(key.serialize_der())
        .map_err(|e| anyhow::anyhow!("--auto-tls: key: {e}"))?;
    Ok((vec![cert.der().clone()], key))
}

/// A client certificate check as etcd's (Go's crypto/x509 with etcd's own check after it):
/// - the chain as `inner` checks it (the trusted CA, the CRL), the handshake's signature too;
/// - also, as Go takes it, a self-signed CA certificate that is itself in the trusted CA file,
///   presented as the client's own: rustls-webpki refuses a CA certificate as an end entity
///   (`CaUsedAsEndEntity`). (webpki checks validity dates before it finds a certificate a CA,
///   so such a certificate is in date.)
/// - then `--*-cert-allowed-cn` / `--*-cert-allowed-hostname`: the certificate's common name is
///   one of the allowed, or it is valid for one of the allowed host names (either satisfies).
#[derive(Debug)]
struct EtcdClientCertCheck {
    inner: Arc<dyn rustls::server::danger::ClientCertVerifier>,
    trusted: Vec<CertificateDer<'static>>,
    allowed_cn: Vec<String>,
    allowed_hostname: Vec<String>,
}

impl EtcdClientCertCheck {
    /// Whether `leaf` passes the allowed common names and host names (none given: it does).
    fn allowed(&self, leaf: &[u8]) -> bool {
        if self.allowed_cn.is_empty() && self.allowed_hostname.is_empty() {
            return true;
        }
        let Ok((_, cert)) = x509_parser::parse_x509_certificate(leaf) else {
            return false;
        };
        let cn = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok());
        if cn.is_some_and(|cn| self.allowed_cn.iter().any(|a| a == cn)) {
            return true;
        }
        let sans: Vec<x509_parser::extensions::GeneralName<'_>> = cert
            .subject_alternative_name()
            .ok()
            .flatten()
            .map(|ext| ext.value.general_names.clone())
            .unwrap_or_default();
        self.allowed_hostname
            .iter()
            .any(|host| valid_for_host(&sans, host))
    }
}

/// Go's `Certificate.VerifyHostname` over a certificate's SANs: an IP address against its IP
/// SANs; a name against its DNS SANs, case-insensitively, `*.` matching one leftmost label.
fn valid_for_host(sans: &[x509_parser::extensions::GeneralName<'_>], host: &str) -> bool {
    use x509_parser::extensions::GeneralName;
    let host = host.trim_end_matches('.');
    if let Ok(ip) = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<std::net::IpAddr>()
    {
        return sans.iter().any(|san| match san {
            GeneralName::IPAddress(bytes) => match (ip, bytes.len()) {
                (std::net::IpAddr::V4(v4), 4) => v4.octets() == **bytes,
                (std::net::IpAddr::V6(v6), 16) => v6.octets() == **bytes,
                _ => false,
            },
            _ => false,
        });
    }
    let host = host.to_ascii_lowercase();
    sans.iter().any(|san| {
        let GeneralName::DNSName(pattern) = san else {
            return false;
        };
        let pattern = pattern.trim_end_matches('.').to_ascii_lowercase();
        match pattern.strip_prefix("*.") {
            Some(rest) => host
                .split_once('.')
                .is_some_and(|(first, tail)| !first.is_empty() && tail == rest),
            None => pattern == host,
        }
    })
}

impl rustls::server::danger::ClientCertVerifier for EtcdClientCertCheck {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        let verified = match self
            .inner
            .verify_client_cert(end_entity, intermediates, now)
        {
            Err(rustls::Error::InvalidCertificate(rustls::CertificateError::Other(other)))
                if other.0.downcast_ref::<webpki::Error>()
                    == Some(&webpki::Error::CaUsedAsEndEntity)
                    && self
                        .trusted
                        .iter()
                        .any(|t| t.as_ref() == end_entity.as_ref()) =>
            {
                rustls::server::danger::ClientCertVerified::assertion()
            }
            verified => verified?,
        };
        if !self.allowed(end_entity.as_ref()) {
            // etcd's refusal ("client certificate authentication failed"); the client gets
            // a bad-certificate alert.
            return Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName,
            ));
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// `--peer-auto-tls`'s check of a peer's certificate, as etcd's (Go's `InsecureSkipVerify`): any
/// certificate is taken, since each member made its own; the handshake's signatures are still
/// checked, so the channel is encrypted to whoever holds the key, not authenticated.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &rustls_pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A certificate with common name `cn` and these SANs (names or IP addresses).
    fn cert(cn: &str, sans: &[&str]) -> Vec<u8> {
        let mut params =
            rcgen::CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
                .expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let key = rcgen::KeyPair::generate().expect("key");
        params.self_signed(&key).expect("cert").der().to_vec()
    }

    fn check(allowed_cn: &[&str], allowed_hostname: &[&str]) -> EtcdClientCertCheck {
        EtcdClientCertCheck {
            inner: rustls::server::WebPkiClientVerifier::no_client_auth(),
            trusted: Vec::new(),
            allowed_cn: allowed_cn.iter().map(|s| (*s).to_owned()).collect(),
            allowed_hostname: allowed_hostname.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    #[test]
    fn allowed_names_are_a_common_name_or_a_host_the_certificate_is_valid_for() {
        let leaf = cert(
            "etcd-peer",
            &["m1.example.com", "*.peers.example.com", "10.0.0.7"],
        );
        // Nothing allowed named: anything goes.
        assert!(check(&[], &[]).allowed(&leaf));
        assert!(check(&["etcd-peer"], &[]).allowed(&leaf));
        assert!(!check(&["other"], &[]).allowed(&leaf));
        // Either list satisfies.
        assert!(check(&["other"], &["m1.example.com"]).allowed(&leaf));
        assert!(check(&[], &["M1.Example.com."]).allowed(&leaf));
        assert!(check(&[], &["m3.peers.example.com"]).allowed(&leaf));
        // A wildcard covers one label only, and not the bare domain.
        assert!(!check(&[], &["a.b.peers.example.com"]).allowed(&leaf));
        assert!(!check(&[], &["peers.example.com"]).allowed(&leaf));
        // IP addresses against IP SANs only.
        assert!(check(&[], &["10.0.0.7"]).allowed(&leaf));
        assert!(!check(&[], &["10.0.0.8"]).allowed(&leaf));
        assert!(!check(&[], &["m2.example.com"]).allowed(&leaf));
    }
}
