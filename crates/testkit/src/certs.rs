//! Certificates for TLS tests, made with rcgen in a temp dir: a CA, a server certificate for
//! `127.0.0.1` and `localhost` signed by it (also good as a client and peer certificate), a
//! client certificate, one from a CA nobody trusts, and an expired one.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use tempfile::TempDir;

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The files of [`Certs::make`]; removed on drop.
#[derive(Debug)]
pub struct Certs {
    _dir: TempDir,
    /// The CA every server trusts.
    pub ca: PathBuf,
    /// For `127.0.0.1` and `localhost`, server and client use, signed by [`Certs::ca`].
    pub server: Pair,
    /// A client certificate (CN `root`) signed by [`Certs::ca`].
    pub client: Pair,
    /// A client certificate signed by a CA the servers do not trust.
    pub stranger: Pair,
    /// The stranger's CA.
    pub other_ca: PathBuf,
    /// A client certificate signed by [`Certs::ca`] that expired yesterday.
    pub expired: Pair,
}

struct Ca {
    params: CertificateParams,
    key: KeyPair,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        Ca {
            params,
            key: KeyPair::generate().expect("CA key"),
        }
    }

    fn pem(&self) -> String {
        self.params.self_signed(&self.key).expect("CA cert").pem()
    }

    /// A leaf for `names`, valid from `from` to `until`.
    fn sign(
        &self,
        common_name: &str,
        names: &[&str],
        from: SystemTime,
        until: SystemTime,
    ) -> (String, String) {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("leaf params");
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.not_before = from.into();
        params.not_after = until.into();
        let key = KeyPair::generate().expect("leaf key");
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).expect("sign leaf");
        (cert.pem(), key.serialize_pem())
    }
}

fn write(dir: &Path, name: &str, pem: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, pem).expect("write PEM");
    path
}

fn write_pair(dir: &Path, name: &str, (cert, key): (String, String)) -> Pair {
    Pair {
        cert: write(dir, &format!("{name}.pem"), &cert),
        key: write(dir, &format!("{name}-key.pem"), &key),
    }
}

impl Certs {
    pub fn make() -> Certs {
        let dir = tempfile::Builder::new()
            .prefix("leasehold-certs-")
            .tempdir()
            .expect("temp dir");
        let now = SystemTime::now();
        let day = Duration::from_secs(86_400);
        let ca = Ca::new("leasehold test CA");
        let other = Ca::new("a CA nobody trusts");
        let hosts = ["127.0.0.1", "localhost"];
        let d = dir.path();
        Certs {
            ca: write(d, "ca.pem", &ca.pem()),
            other_ca: write(d, "other-ca.pem", &other.pem()),
            server: write_pair(d, "server", ca.sign("server", &hosts, now - day, now + day)),
            client: write_pair(d, "client", ca.sign("root", &[], now - day, now + day)),
            stranger: write_pair(d, "stranger", other.sign("root", &[], now - day, now + day)),
            expired: write_pair(d, "expired", ca.sign("root", &[], now - 3 * day, now - day)),
            _dir: dir,
        }
    }
}
