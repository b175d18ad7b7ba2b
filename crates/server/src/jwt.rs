//! JWT auth tokens (etcd's `--auth-token jwt,pub-key=...,priv-key=...,sign-method=...,ttl=...`):
//! signed by the member that authenticates, verified by any member without shared state. The
//! claims are etcd's: `username`, `revision` (the auth revision at login, so that any change to
//! the auth store since makes the token's requests `revision of auth store is old`, and clients
//! log in again) and `exp`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use leasehold_auth::Caller;
use serde::{Deserialize, Serialize};

/// How tokens are made: etcd's `--auth-token`.
#[derive(Clone)]
pub enum TokenMode {
    /// Random tokens every member holds in memory.
    Simple,
    Jwt(Box<Jwt>),
}

impl std::fmt::Debug for TokenMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenMode::Simple => f.write_str("Simple"),
            TokenMode::Jwt(j) => write!(f, "Jwt({:?}, ttl {:?})", j.algorithm, j.ttl),
        }
    }
}

/// A JWT signer and verifier.
#[derive(Clone)]
pub struct Jwt {
    algorithm: Algorithm,
    /// `None` with a public key only: this member verifies but cannot log anyone in.
    encoding: Option<EncodingKey>,
    decoding: DecodingKey,
    ttl: Duration,
}

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    username: String,
    revision: u64,
    exp: u64,
}

impl TokenMode {
    /// Parses etcd's `--auth-token` value, reading the key files it names; `duration` reads a
    /// Go duration (the `ttl` option).
    pub fn parse(
        value: &str,
        duration: impl Fn(&str) -> Result<Duration, String>,
    ) -> Result<TokenMode, String> {
        let mut parts = value.split(',');
        match parts.next() {
            Some("simple") => return Ok(TokenMode::Simple),
            Some("jwt") => {}
            _ => return Err(format!("unknown token type: {value}")),
        }
        let (mut pub_key, mut priv_key, mut method) = (None, None, None);
        let mut ttl = Duration::from_secs(300);
        for part in parts {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("malformed JWT option {part:?}"))?;
            match k {
                "pub-key" => pub_key = Some(v.to_owned()),
                "priv-key" => priv_key = Some(v.to_owned()),
                "sign-method" => method = Some(v.to_owned()),
                "ttl" => {
                    ttl = duration(v).map_err(|e| format!("JWT ttl: {e}"))?;
                }
                other => return Err(format!("unknown JWT option {other:?}")),
            }
        }
        let method = method.ok_or("JWT: sign-method is required")?;
        let algorithm: Algorithm = method
            .parse()
            .map_err(|_| format!("JWT: unsupported sign-method {method:?}"))?;
        let read = |path: &str| {
            std::fs::read(path).map_err(|e| format!("JWT: reading key file {path}: {e}"))
        };
        let (encoding, decoding) = match algorithm {
            Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => {
                let secret = read(priv_key.as_deref().ok_or("JWT: HMAC needs priv-key")?)?;
                (
                    Some(EncodingKey::from_secret(&secret)),
                    DecodingKey::from_secret(&secret),
                )
            }
            _ => {
                let public = read(pub_key.as_deref().ok_or("JWT: pub-key is required")?)?;
                let private = priv_key.as_deref().map(read).transpose()?;
                let bad = |e: jsonwebtoken::errors::Error| format!("JWT: bad key: {e}");
                let (enc, dec) = match algorithm {
                    Algorithm::ES256 | Algorithm::ES384 => (
                        private
                            .map(|p| EncodingKey::from_ec_pem(&p))
                            .transpose()
                            .map_err(bad)?,
                        DecodingKey::from_ec_pem(&public).map_err(bad)?,
                    ),
                    Algorithm::EdDSA => (
                        private
                            .map(|p| EncodingKey::from_ed_pem(&p))
                            .transpose()
                            .map_err(bad)?,
                        DecodingKey::from_ed_pem(&public).map_err(bad)?,
                    ),
                    _ => (
                        private
                            .map(|p| EncodingKey::from_rsa_pem(&p))
                            .transpose()
                            .map_err(bad)?,
                        DecodingKey::from_rsa_pem(&public).map_err(bad)?,
                    ),
                };
                (enc, dec)
            }
        };
        Ok(TokenMode::Jwt(Box::new(Jwt {
            algorithm,
            encoding,
            decoding,
            ttl,
        })))
    }
}

impl Jwt {
    /// A token for `user` at auth revision `revision`; `None` if this member has no private key.
    pub fn sign(&self, user: &str, revision: u64) -> Option<String> {
        let encoding = self.encoding.as_ref()?;
        let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?;
        let claims = Claims {
            username: user.to_owned(),
            revision,
            exp: (now + self.ttl).as_secs(),
        };
        jsonwebtoken::encode(&Header::new(self.algorithm), &claims, encoding).ok()
    }

    /// The caller a token names, if its signature holds and it has not expired.
    pub fn verify(&self, token: &str) -> Option<Caller> {
        let mut validation = Validation::new(self.algorithm);
        validation.required_spec_claims = ["exp".to_owned()].into_iter().collect();
        validation.leeway = 0;
        let data = jsonwebtoken::decode::<Claims>(token, &self.decoding, &validation).ok()?;
        Some(Caller {
            user: data.claims.username,
            revision: data.claims.revision,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hmac(dir: &std::path::Path) -> Jwt {
        let secret = dir.join("secret");
        std::fs::write(&secret, b"a shared secret").unwrap();
        let value = format!("jwt,priv-key={},sign-method=HS256,ttl=1m", secret.display());
        let parse = |d: &str| match d {
            "1m" => Ok(Duration::from_secs(60)),
            other => Err(other.to_owned()),
        };
        match TokenMode::parse(&value, parse).unwrap() {
            TokenMode::Jwt(jwt) => *jwt,
            TokenMode::Simple => panic!("jwt expected"),
        }
    }

    #[test]
    fn a_token_names_its_user_and_revision_until_it_expires() {
        let dir = tempfile::tempdir().unwrap();
        let jwt = hmac(dir.path());
        let token = jwt.sign("alice", 7).unwrap();
        assert_eq!(
            jwt.verify(&token),
            Some(Caller {
                user: "alice".into(),
                revision: 7
            })
        );
        let mut forged = token.clone();
        forged.push('x');
        assert_eq!(jwt.verify(&forged), None, "a bad signature");
        let expired = Claims {
            username: "alice".into(),
            revision: 7,
            exp: 1,
        };
        let old = jsonwebtoken::encode(
            &Header::new(jwt.algorithm),
            &expired,
            jwt.encoding.as_ref().unwrap(),
        )
        .unwrap();
        assert_eq!(jwt.verify(&old), None, "expired");
    }

    #[test]
    fn etcds_options_are_read_and_bad_ones_refused() {
        let parse = |d: &str| Err::<Duration, _>(d.to_owned());
        assert!(matches!(
            TokenMode::parse("simple", parse),
            Ok(TokenMode::Simple)
        ));
        assert!(TokenMode::parse("opaque", parse).is_err());
        assert!(
            TokenMode::parse("jwt,sign-method=RS256", parse).is_err(),
            "no keys"
        );
        assert!(TokenMode::parse("jwt,pub-key=/nonexistent,sign-method=ES256", parse).is_err());
        assert!(TokenMode::parse("jwt,color=blue", parse).is_err());
    }
}
