//! etcd's TLS flags, client side and peer side, as typed settings. TLS is not implemented yet:
//! these are parsed and checked for form, and setting any of them gets a warning at start-up.
//!
//! Both sides have the same fields (etcd's `transport.TLSInfo`), so that one function can build
//! a TLS configuration for either; in a config file they are etcd's `client-transport-security`
//! and `peer-transport-security` maps (see `sources.rs`).

use std::path::PathBuf;

use clap::Args;

use crate::config::parse_go_bool;

/// The `--help` heading of the TLS flags; `sources.rs` also recognises them by it.
pub(crate) const HEADING: &str = "TLS (not implemented yet)";

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
