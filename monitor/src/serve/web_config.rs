//! The exporter web-config file (`--web.config.file`), in the format every Prometheus exporter
//! reads (prometheus/exporter-toolkit): TLS through `tls_server_config`, basic auth through
//! `basic_auth_users` with bcrypt hashes, extra response headers through `http_server_config`.
//! Relative paths are relative to the file's directory, as in exporter-toolkit. Keys gpuwatch
//! does not implement are refused by name rather than ignored.
use crate::config::{from_yaml, invalid_field, ConfigError};
use crate::field_error::FieldError;
use base64::Engine;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebConfig {
    #[serde(default)]
    pub tls_server_config: Option<TlsServerConfig>,
    /// User name → bcrypt hash (`htpasswd -nBC 10 "" | tr -d ':\n'`).
    #[serde(default)]
    pub basic_auth_users: BTreeMap<String, String>,
    #[serde(default)]
    pub http_server_config: Option<HttpServerConfig>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsServerConfig {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// `NoClientCert` (default) or `RequireAndVerifyClientCert` (needs `client_ca_file`).
    #[serde(default)]
    pub client_auth_type: Option<String>,
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
    /// `TLS12` (default) or `TLS13`.
    #[serde(default)]
    pub min_version: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpServerConfig {
    /// Headers added to every response (e.g. `Strict-Transport-Security`).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

#[derive(Debug, thiserror::Error)]
pub enum WebConfigError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{path}: {message}")]
    Tls { path: PathBuf, message: String },
}

impl WebConfig {
    /// Reads and validates `path`; TLS files are loaded by [`Self::tls`].
    pub fn load(path: &Path) -> Result<(Self, PathBuf), WebConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let text = crate::config::unix_line_breaks(&text);
        let mut c: WebConfig = from_yaml(&text, path)?;
        c.validate()
            .map_err(|e| invalid_field(&text, path, e.field, e.message))?;
        let dir = path.parent().map(Path::to_owned).unwrap_or_default();
        if let Some(t) = &mut c.tls_server_config {
            for p in [&mut t.cert_file, &mut t.key_file] {
                *p = dir.join(&*p);
            }
            if let Some(ca) = &mut t.client_ca_file {
                *ca = dir.join(&*ca);
            }
        }
        Ok((c, dir))
    }

    fn validate(&self) -> Result<(), FieldError> {
        for (user, hash) in &self.basic_auth_users {
            let field = format!("basic_auth_users.{user}");
            let Some(cost) = bcrypt_cost(hash) else {
                return Err(FieldError::new(
                    field,
                    "is not a bcrypt hash (it starts with $2a$, $2b$ or $2y$ and a cost)",
                ));
            };
            if cost > MAX_BCRYPT_COST {
                return Err(FieldError::new(
                    field,
                    format!(
                        "bcrypt cost {cost} is above {MAX_BCRYPT_COST}: each check of a new \
                         password would take seconds of CPU (use htpasswd -nBC 10)"
                    ),
                ));
            }
        }
        if let Some(t) = &self.tls_server_config {
            match t.client_auth_type.as_deref() {
                None | Some("NoClientCert") => {}
                Some("RequireAndVerifyClientCert") if t.client_ca_file.is_some() => {}
                Some("RequireAndVerifyClientCert") => {
                    return Err(FieldError::new(
                        "tls_server_config.client_auth_type",
                        "RequireAndVerifyClientCert needs client_ca_file",
                    ))
                }
                Some(other) => {
                    return Err(FieldError::new(
                        "tls_server_config.client_auth_type",
                        format!(
                            "{other:?} is not supported (NoClientCert or \
                             RequireAndVerifyClientCert)"
                        ),
                    ))
                }
            }
            if !matches!(
                t.min_version.as_deref(),
                None | Some("TLS12") | Some("TLS13")
            ) {
                return Err(FieldError::new(
                    "tls_server_config.min_version",
                    "must be TLS12 or TLS13",
                ));
            }
        }
        Ok(())
    }

    /// The rustls server configuration, when TLS is on.
    pub fn tls(&self) -> Result<Option<Arc<rustls::ServerConfig>>, WebConfigError> {
        let Some(t) = &self.tls_server_config else {
            return Ok(None);
        };
        let tls_err = |path: &Path, message: String| WebConfigError::Tls {
            path: path.to_owned(),
            message,
        };
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&t.cert_file)
            .and_then(|i| i.collect::<Result<_, _>>())
            .map_err(|e| tls_err(&t.cert_file, format!("reading certificates: {e}")))?;
        if certs.is_empty() {
            return Err(tls_err(&t.cert_file, "holds no certificate".into()));
        }
        let key = PrivateKeyDer::from_pem_file(&t.key_file)
            .map_err(|e| tls_err(&t.key_file, format!("reading the private key: {e}")))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let versions: &[&rustls::SupportedProtocolVersion] = match t.min_version.as_deref() {
            Some("TLS13") => &[&rustls::version::TLS13],
            _ => &[&rustls::version::TLS13, &rustls::version::TLS12],
        };
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(versions)
            .map_err(|e| tls_err(&t.cert_file, e.to_string()))?;
        let builder = match (&t.client_auth_type.as_deref(), &t.client_ca_file) {
            (Some("RequireAndVerifyClientCert"), Some(ca)) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in CertificateDer::pem_file_iter(ca)
                    .map_err(|e| tls_err(ca, format!("reading client CAs: {e}")))?
                {
                    let c = c.map_err(|e| tls_err(ca, format!("reading client CAs: {e}")))?;
                    roots
                        .add(c)
                        .map_err(|e| tls_err(ca, format!("client CA: {e}")))?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()
                .map_err(|e| tls_err(ca, e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
            _ => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(certs, key)
            .map_err(|e| tls_err(&t.key_file, format!("certificate and key: {e}")))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Some(Arc::new(config)))
    }
}

/// The highest bcrypt cost accepted: cost 12 takes ~300 ms a check, and each step doubles it.
pub const MAX_BCRYPT_COST: u32 = 12;

/// The cost of a bcrypt hash (`$2b$10$…` → 10), `None` when it is not one.
fn bcrypt_cost(hash: &str) -> Option<u32> {
    let rest = ["$2a$", "$2b$", "$2y$", "$2x$"]
        .iter()
        .find_map(|p| hash.strip_prefix(p))?;
    let (cost, salt_and_hash) = rest.split_once('$')?;
    (cost.len() == 2 && salt_and_hash.len() == 53)
        .then(|| cost.parse().ok())
        .flatten()
}

/// Checks `Authorization: Basic` headers against the bcrypt hashes. bcrypt is slow on purpose
/// (tens of milliseconds), so verified headers are remembered (at most 64 of them). A user
/// name that is not configured is checked against a dummy hash of the highest configured cost,
/// so the answer takes as long as for a known user with a wrong password: names do not leak
/// by timing.
#[derive(Debug)]
pub struct BasicAuth {
    users: BTreeMap<String, String>,
    dummy: String,
    verified: Mutex<HashSet<String>>,
}

impl BasicAuth {
    pub fn new(users: BTreeMap<String, String>) -> Option<Self> {
        if users.is_empty() {
            return None;
        }
        let cost = users
            .values()
            .filter_map(|h| bcrypt_cost(h))
            .max()
            .unwrap_or(bcrypt::DEFAULT_COST)
            .min(MAX_BCRYPT_COST);
        let dummy = bcrypt::hash("gpuwatch: no such user", cost).unwrap_or_default();
        Some(Self {
            users,
            dummy,
            verified: Mutex::new(HashSet::new()),
        })
    }

    /// Whether this exact header was verified before (no bcrypt needed).
    pub fn remembers(&self, header: &str) -> bool {
        self.verified
            .lock()
            .map(|v| v.contains(header))
            .unwrap_or(false)
    }

    /// Whether the `Authorization` header value lets the request in. Slow (bcrypt) unless
    /// remembered: call it off the async workers ([`super::login_gate`] does).
    pub fn allows(&self, header: Option<&str>) -> bool {
        let Some(h) = header else { return false };
        if self.remembers(h) {
            return true;
        }
        let Some(encoded) = h.strip_prefix("Basic ") else {
            return false;
        };
        let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(encoded.trim()) else {
            return false;
        };
        let Ok(text) = String::from_utf8(raw) else {
            return false;
        };
        let Some((user, password)) = text.split_once(':') else {
            return false;
        };
        let ok = match self.users.get(user) {
            Some(hash) => bcrypt::verify(password, hash).unwrap_or(false),
            None => {
                // The same work as a wrong password, and never a match.
                let _ = bcrypt::verify(password, &self.dummy);
                false
            }
        };
        if ok {
            if let Ok(mut v) = self.verified.lock() {
                if v.len() >= 64 {
                    v.clear();
                }
                v.insert(h.to_owned());
            }
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<WebConfig, WebConfigError> {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("web.yml");
        std::fs::write(&p, text).expect("write");
        WebConfig::load(&p).map(|(c, _)| c)
    }

    #[test]
    fn refuses_what_it_does_not_implement_by_name() {
        let e = load(
            "tls_server_config:\n  cert_file: a.pem\n  key_file: a.key\n  cipher_suites: [x]\n",
        )
        .expect_err("unsupported key");
        assert!(
            e.to_string().contains("line 4") && e.to_string().contains("cipher_suites"),
            "{e}"
        );
        let e = load(
            "basic_auth_users:\n  alice: $2b$31$abcdefghijklmnopqrstuu5Xa1Gw9XD8E0z3YyC2ApOm3V.KQGmVS\n",
        )
        .expect_err("cost 31");
        assert!(
            e.to_string()
                .contains("field `basic_auth_users.alice`: bcrypt cost 31 is above 12"),
            "{e}"
        );
        let e = load("basic_auth_users:\n  alice: hunter2\n").expect_err("plain password");
        assert!(
            e.to_string()
                .contains("field `basic_auth_users.alice`: is not a bcrypt hash"),
            "{e}"
        );
    }

    #[test]
    fn basic_auth_checks_bcrypt_and_remembers() {
        let hash = bcrypt::hash("s3cret", 4).expect("hash");
        let auth = BasicAuth::new(BTreeMap::from([("alice".to_owned(), hash)])).expect("users");
        let header = |u: &str, p: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
            )
        };
        assert!(auth.allows(Some(&header("alice", "s3cret"))));
        assert!(auth.allows(Some(&header("alice", "s3cret"))), "cached");
        assert!(!auth.allows(Some(&header("alice", "wrong"))));
        assert!(!auth.allows(Some(&header("bob", "s3cret"))));
        // An unknown user is checked against a dummy hash of the configured cost, so it takes
        // the time a wrong password takes (its name does not leak by timing).
        assert_eq!(bcrypt_cost(&auth.dummy), Some(4));
        assert!(!auth.allows(Some(&header("mallory", "gpuwatch: no such user"))));
        assert!(!auth.allows(Some("Bearer x")));
        assert!(!auth.allows(None));
    }
}
