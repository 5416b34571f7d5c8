//! TLS for client-facing listeners: loading PEM certificates and keys, an SNI resolver with
//! exact and wildcard names, per-listener rustls server configs (TCP: ALPN h2 + http/1.1,
//! TLS 1.2 and 1.3; QUIC: ALPN h3, TLS 1.3, optional early data; both with session resumption
//! by tickets and a session cache, and one shared resolver), and self-signed certificates for
//! the embedded default config.
//!
//! Certificates are resolved per handshake from the config snapshot that is current when the
//! connection is accepted, so a changed certificate applies to new handshakes at once.
//!
//! A listener with `client_auth` asks clients for a certificate and verifies it against its CA
//! bundle (mutual TLS): `require` fails the handshake without a valid one; in
//! `allow_insecure_fallback` a missing or unverifiable certificate is let through
//! ([`InsecureFallback`]). `host_client_auth` asks only the SNIs of some hosts, with a config
//! of their own ([`crate::client_cert`]).

use rustls::client::danger::HandshakeSignatureValid;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use std::collections::HashMap;
use std::sync::Arc;
use sweety_config::{Certificate, ClientAuth, ClientAuthMode, ListenerTls, PemSource, TlsVersion};

/// Errors loading TLS material.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read.
    #[error("{path}: cannot read {file}: {source}")]
    Read {
        /// Config path.
        path: String,
        /// File path.
        file: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The PEM text holds no usable certificate or key.
    #[error("{path}: {message}")]
    Pem {
        /// Config path.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// rustls refused the material.
    #[error("{path}: {source}")]
    Rustls {
        /// Config path.
        path: String,
        /// The rustls error.
        #[source]
        source: rustls::Error,
    },
}

/// Reads the bytes of a PEM source (inline text or file).
pub fn read_pem(src: &PemSource, path: &str) -> Result<Vec<u8>, TlsError> {
    match src {
        PemSource::Pem(text) => Ok(text.as_bytes().to_vec()),
        PemSource::File(f) => std::fs::read(f).map_err(|source| TlsError::Read {
            path: path.to_string(),
            file: f.display().to_string(),
            source,
        }),
    }
}

/// Parses a certificate chain from PEM.
pub fn parse_certs(pem: &[u8], path: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_string(),
            message: format!("bad certificate PEM: {e}"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_string(),
            message: "no CERTIFICATE block found".into(),
        });
    }
    Ok(certs)
}

/// Parses a private key (PKCS#8, PKCS#1 or SEC1) from PEM.
pub fn parse_key(pem: &[u8], path: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| TlsError::Pem {
        path: path.to_string(),
        message: format!("no usable private key: {e}"),
    })
}

/// Loads one certificate entry into a rustls [`CertifiedKey`].
pub fn load_certified_key(cert: &Certificate, path: &str) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = parse_certs(
        &read_pem(&cert.cert, &format!("{path}.cert"))?,
        &format!("{path}.cert"),
    )?;
    let key = parse_key(
        &read_pem(&cert.key, &format!("{path}.key"))?,
        &format!("{path}.key"),
    )?;
    let provider = rustls::crypto::ring::default_provider();
    let ck = CertifiedKey::from_der(chain, key, &provider).map_err(|source| TlsError::Rustls {
        path: path.to_string(),
        source,
    })?;
    Ok(Arc::new(ck))
}

/// Chooses a certificate by SNI: exact name, then the longest matching `*.` wildcard, then the
/// listener's first certificate (also used when the client sends no SNI).
/// Names under `refused` (an `https` listener's passthrough hosts) get no certificate: their
/// handshake fails here (a QUIC ClientHello for one, or a TCP one the passthrough peek could
/// not read), never terminated with another host's certificate.
#[derive(Debug, Default)]
pub struct SniResolver {
    exact: HashMap<String, Arc<CertifiedKey>>,
    wildcard: HashMap<String, Arc<CertifiedKey>>,
    fallback: Option<Arc<CertifiedKey>>,
    refused: Option<SniScopes>,
}

impl SniResolver {
    /// Builds a resolver from a listener's certificates. `path` is the config path of the
    /// listener's `tls` section, for errors.
    pub fn new(certs: &[Certificate], path: &str) -> Result<SniResolver, TlsError> {
        let mut r = SniResolver::default();
        for (i, c) in certs.iter().enumerate() {
            let ck = load_certified_key(c, &format!("{path}.certificates[{i}]"))?;
            let names = if c.hostnames.is_empty() {
                san_dns_names(&ck.cert[0])
            } else {
                c.hostnames.clone()
            };
            for name in &names {
                let name = name.to_ascii_lowercase();
                match name.strip_prefix("*.") {
                    Some(suffix) => r
                        .wildcard
                        .entry(suffix.to_string())
                        .or_insert_with(|| ck.clone()),
                    None => r.exact.entry(name).or_insert_with(|| ck.clone()),
                };
            }
            if r.fallback.is_none() {
                r.fallback = Some(ck);
            }
        }
        Ok(r)
    }

    /// The same, refusing the names of `passthrough` (routes with hostnames only).
    pub fn refusing(mut self, passthrough: &[sweety_config::L4Route]) -> SniResolver {
        if !passthrough.is_empty() {
            self.refused = Some(SniScopes::from_hostnames(
                passthrough.iter().map(|r| r.hostnames.as_slice()),
            ));
        }
        self
    }

    /// The certificate for a server name.
    pub fn lookup(&self, sni: Option<&str>) -> Option<Arc<CertifiedKey>> {
        if let Some(name) = sni {
            if self
                .refused
                .as_ref()
                .is_some_and(|r| r.scope(name).is_some())
            {
                return None;
            }
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            if let Some(ck) = self.exact.get(&name) {
                return Some(ck.clone());
            }
            // Walk the labels: a.b.example.com tries b.example.com, example.com, com.
            let mut rest = name.as_str();
            while let Some(dot) = rest.find('.') {
                rest = &rest[dot + 1..];
                if let Some(ck) = self.wildcard.get(rest) {
                    return Some(ck.clone());
                }
            }
        }
        self.fallback.clone()
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.lookup(hello.server_name())
    }
}

/// Which certificate entry ("scope") a server name falls into, by the entries' configured
/// `hostnames` only: exact name, then the longest `*.` wildcard, then the first entry without
/// hostnames (a catch-all, like a Gateway listener without a hostname). Used to answer 421
/// Misdirected Request when a request's Host falls into another scope than its TLS SNI.
/// Entries with the same name share the scope of the first of them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SniScopes {
    exact: HashMap<String, usize>,
    wildcard: HashMap<String, usize>,
    any: Option<usize>,
}

impl SniScopes {
    /// Scopes of a listener's certificates.
    pub fn new(certs: &[Certificate]) -> SniScopes {
        SniScopes::from_hostnames(certs.iter().map(|c| c.hostnames.as_slice()))
    }

    /// Scopes of entries given by their hostnames (entry `i` is scope `i`; an entry without
    /// hostnames is a catch-all). Also used to pick a layer-4 route by SNI.
    pub fn from_hostnames<'h>(entries: impl IntoIterator<Item = &'h [String]>) -> SniScopes {
        let mut s = SniScopes::default();
        for (i, hostnames) in entries.into_iter().enumerate() {
            if hostnames.is_empty() {
                s.any.get_or_insert(i);
            }
            for name in hostnames {
                let name = name.trim_end_matches('.').to_ascii_lowercase();
                match name.strip_prefix("*.") {
                    Some(suffix) => s.wildcard.entry(suffix.to_string()).or_insert(i),
                    None => s.exact.entry(name).or_insert(i),
                };
            }
        }
        s
    }

    /// The catch-all scope (the first entry without hostnames), for a name-less lookup.
    pub fn any(&self) -> Option<usize> {
        self.any
    }

    /// The scope of `name`, or `None` when no entry covers it.
    pub fn scope(&self, name: &str) -> Option<usize> {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        if let Some(&i) = self.exact.get(&name) {
            return Some(i);
        }
        let mut rest = name.as_str();
        while let Some(dot) = rest.find('.') {
            rest = &rest[dot + 1..];
            if let Some(&i) = self.wildcard.get(rest) {
                return Some(i);
            }
        }
        self.any
    }

    /// True when a request for `host` on a connection whose TLS SNI was `sni` must be answered
    /// 421: the two names fall into different scopes.
    pub fn misdirected(&self, sni: &str, host: &str) -> bool {
        !sni.eq_ignore_ascii_case(host) && self.scope(sni) != self.scope(host)
    }
}

/// The end of validity (Unix seconds) of the first certificate of a PEM chain; `None` when
/// it does not parse.
pub fn not_after(pem: &[u8]) -> Option<i64> {
    let certs = parse_certs(pem, "").ok()?;
    let (_, x) = x509_parser::parse_x509_certificate(certs.first()?.as_ref()).ok()?;
    Some(x.validity().not_after.timestamp())
}

/// The DNS names (exact and wildcard) in a certificate's subject alternative names.
pub fn san_dns_names(der: &CertificateDer<'_>) -> Vec<String> {
    webpki::EndEntityCert::try_from(der)
        .map(|c| c.valid_dns_names().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// The rustls server configs of an HTTPS listener: one for TCP (ALPN h2 and http/1.1, the
/// listener's minimum TLS version) and, when HTTP/3 is on, one for QUIC (ALPN h3, TLS 1.3
/// only, early data only when `early_data`). Both use the same [`SniResolver`].
pub struct ListenerTlsConfigs {
    /// For TCP.
    pub tcp: Arc<rustls::ServerConfig>,
    /// For QUIC, when HTTP/3 is served.
    pub quic: Option<Arc<rustls::ServerConfig>>,
    /// `host_client_auth`: per-host client certificates, with the TCP config of each entry.
    pub host_auth: Option<Arc<crate::client_cert::HostAuth>>,
}

/// Builds the rustls server configs of an HTTPS listener (see [`ListenerTlsConfigs`]).
/// `quic` is `Some(early_data)` when HTTP/3 is served; `passthrough` are the listener's
/// passthrough hosts, refused by both (see [`SniResolver`]).
pub fn listener_configs(
    tls: &ListenerTls,
    path: &str,
    quic: Option<bool>,
    passthrough: &[sweety_config::L4Route],
) -> Result<ListenerTlsConfigs, TlsError> {
    let resolver = Arc::new(SniResolver::new(&tls.certificates, path)?.refusing(passthrough));
    let verifier = client_verifier(tls.client_auth.as_ref(), path)?;
    let versions: &[&rustls::SupportedProtocolVersion] = match tls.min_version {
        TlsVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsVersion::Tls13 => &[&rustls::version::TLS13],
    };
    let tcp = build(
        resolver.clone(),
        verifier.clone(),
        versions,
        &[b"h2", b"http/1.1"],
        path,
        true,
    )?;
    // Each entry's TCP config differs from `tcp` only in asking for a certificate (and has
    // its own ticket keys: a session resumed there was made with a certificate request).
    let host_auth = crate::client_cert::HostAuth::build(tls, path, &|v| {
        build(
            resolver.clone(),
            Some(v),
            versions,
            &[b"h2", b"http/1.1"],
            path,
            true,
        )
    })?
    .map(Arc::new);
    let quic = match quic {
        None => None,
        Some(early_data) => {
            // rustls offers early data only with stateful resumption: a ticket is then a
            // single-use key into the session cache, which also stops replays to this server.
            let tls13 = &[&rustls::version::TLS13];
            let mut cfg = build(resolver, verifier, tls13, &[b"h3"], path, !early_data)?;
            // QUIC allows only 0 or u32::MAX here; the amount is bounded by flow control.
            cfg.max_early_data_size = if early_data { u32::MAX } else { 0 };
            Some(Arc::new(cfg))
        }
    };
    Ok(ListenerTlsConfigs {
        tcp: Arc::new(tcp),
        quic,
        host_auth,
    })
}

/// Builds the rustls server config of an HTTPS listener for TCP. `alpn` lists the protocols
/// offered (for TCP: h2 and http/1.1).
pub fn server_config(
    tls: &ListenerTls,
    path: &str,
    alpn: &[&[u8]],
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let resolver = Arc::new(SniResolver::new(&tls.certificates, path)?);
    let verifier = client_verifier(tls.client_auth.as_ref(), path)?;
    let versions: &[&rustls::SupportedProtocolVersion] = match tls.min_version {
        TlsVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsVersion::Tls13 => &[&rustls::version::TLS13],
    };
    Ok(Arc::new(build(
        resolver, verifier, versions, alpn, path, true,
    )?))
}

fn build(
    resolver: Arc<SniResolver>,
    verifier: Option<Arc<dyn ClientCertVerifier>>,
    versions: &[&'static rustls::SupportedProtocolVersion],
    alpn: &[&[u8]],
    path: &str,
    stateless_tickets: bool,
) -> Result<rustls::ServerConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .map_err(|source| TlsError::Rustls {
            path: path.to_string(),
            source,
        })?;
    let builder = match verifier {
        Some(v) => builder.with_client_cert_verifier(v),
        None => builder.with_no_client_auth(),
    };
    let mut cfg = builder.with_cert_resolver(resolver);
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    cfg.session_storage = rustls::server::ServerSessionMemoryCache::new(4096);
    if stateless_tickets {
        cfg.ticketer =
            rustls::crypto::ring::Ticketer::new().map_err(|source| TlsError::Rustls {
                path: path.to_string(),
                source,
            })?;
    }
    Ok(cfg)
}

/// The client certificate verifier of a listener's `client_auth` (None: clients are not asked
/// for a certificate). `path` is the listener's `tls` config path, for errors.
pub fn client_verifier(
    auth: Option<&ClientAuth>,
    path: &str,
) -> Result<Option<Arc<dyn ClientCertVerifier>>, TlsError> {
    let Some(auth) = auth else {
        return Ok(None);
    };
    let cpath = format!("{path}.client_auth.ca");
    let mut roots = rustls::RootCertStore::empty();
    for der in parse_certs(&read_pem(&auth.ca, &cpath)?, &cpath)? {
        roots.add(der).map_err(|source| TlsError::Rustls {
            path: cpath.clone(),
            source,
        })?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
    let verifier: Arc<dyn ClientCertVerifier> = match auth.mode {
        ClientAuthMode::Require => builder.build().map_err(|e| TlsError::Pem {
            path: cpath.clone(),
            message: format!("unusable CA bundle: {e}"),
        })?,
        ClientAuthMode::AllowInsecureFallback => Arc::new(InsecureFallback(
            builder
                .allow_unauthenticated()
                .build()
                .map_err(|e| TlsError::Pem {
                    path: cpath.clone(),
                    message: format!("unusable CA bundle: {e}"),
                })?,
        )),
    };
    Ok(Some(verifier))
}

/// `allow_insecure_fallback`: asks for a client certificate (hinting the CA names) and checks
/// it, but accepts the handshake when the client sends none or one that does not chain to the
/// CA. The handshake signature is still verified against the certificate the client sent, so a
/// client cannot present a certificate whose key it does not hold.
#[derive(Debug)]
pub struct InsecureFallback(Arc<dyn ClientCertVerifier>);

impl InsecureFallback {
    /// Lets through what `inner` refuses (its handshake signature checks still apply).
    pub fn new(inner: Arc<dyn ClientCertVerifier>) -> InsecureFallback {
        InsecureFallback(inner)
    }
}

impl ClientCertVerifier for InsecureFallback {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.0.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        match self.0.verify_client_cert(end_entity, intermediates, now) {
            Ok(v) => Ok(v),
            Err(e) => {
                tracing::debug!(error = %e, "client certificate not verified; insecure fallback accepts it");
                Ok(ClientCertVerified::assertion())
            }
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// A self-signed certificate and key (PEM) for `names` (DNS names or IP addresses).
pub fn self_signed(names: &[&str]) -> Result<(String, String), rcgen::Error> {
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let ck = rcgen::generate_simple_self_signed(names)?;
    Ok((ck.cert.pem(), ck.signing_key.serialize_pem()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(hostnames: &[&str], cn: &str) -> Certificate {
        let (c, k) = self_signed(&[cn]).unwrap();
        Certificate {
            hostnames: hostnames.iter().map(|s| s.to_string()).collect(),
            cert: PemSource::Pem(c),
            key: PemSource::Pem(k),
        }
    }

    #[test]
    fn resolves_exact_then_longest_wildcard_then_fallback() {
        let certs = vec![
            cert(&["default.test"], "default.test"),
            cert(&["*.example.com"], "wild.example.com"),
            cert(&["*.a.example.com"], "deep.a.example.com"),
            cert(&["www.example.com"], "www.example.com"),
        ];
        let r = SniResolver::new(&certs, "listeners[0].tls").unwrap();
        let id = |ck: Arc<CertifiedKey>| ck.cert[0].clone();
        let der = |i: usize| {
            let pem = match &certs[i].cert {
                PemSource::Pem(p) => p.clone(),
                _ => unreachable!(),
            };
            parse_certs(pem.as_bytes(), "x").unwrap()[0].clone()
        };
        assert_eq!(id(r.lookup(Some("www.example.com")).unwrap()), der(3));
        assert_eq!(id(r.lookup(Some("WWW.Example.com.")).unwrap()), der(3));
        assert_eq!(id(r.lookup(Some("x.a.example.com")).unwrap()), der(2));
        assert_eq!(id(r.lookup(Some("api.example.com")).unwrap()), der(1));
        assert_eq!(id(r.lookup(Some("example.com")).unwrap()), der(0));
        assert_eq!(id(r.lookup(None).unwrap()), der(0));
        // Passthrough hosts get no certificate (exact and wildcard); the others are as before.
        let pt: sweety_config::L4Route = serde_json::from_value(serde_json::json!({
            "name": "pt", "hostnames": ["www.example.com", "*.pt.test"],
            "backends": [{"backend": "b"}],
        }))
        .unwrap();
        let r = SniResolver::new(&certs, "listeners[0].tls")
            .unwrap()
            .refusing(&[pt]);
        assert!(r.lookup(Some("WWW.example.com.")).is_none());
        assert!(r.lookup(Some("a.pt.test")).is_none());
        assert_eq!(id(r.lookup(Some("api.example.com")).unwrap()), der(1));
        assert_eq!(id(r.lookup(Some("pt.test")).unwrap()), der(0));
        assert_eq!(id(r.lookup(None).unwrap()), der(0));
    }

    #[test]
    fn names_come_from_the_certificate_when_none_are_given() {
        let (c1, k1) = self_signed(&["fallback.test"]).unwrap();
        let (c2, k2) = self_signed(&["san.test", "*.wild.test"]).unwrap();
        let entry = |c: &str, k: &str| Certificate {
            hostnames: vec![],
            cert: PemSource::Pem(c.to_string()),
            key: PemSource::Pem(k.to_string()),
        };
        let r = SniResolver::new(&[entry(&c1, &k1), entry(&c2, &k2)], "tls").unwrap();
        let second = parse_certs(c2.as_bytes(), "x").unwrap()[0].clone();
        let first = parse_certs(c1.as_bytes(), "x").unwrap()[0].clone();
        assert_eq!(r.lookup(Some("san.test")).unwrap().cert[0], second);
        assert_eq!(r.lookup(Some("a.wild.test")).unwrap().cert[0], second);
        assert_eq!(r.lookup(Some("other.test")).unwrap().cert[0], first);
        assert_eq!(
            san_dns_names(&second),
            vec!["san.test".to_string(), "*.wild.test".to_string()]
        );
    }

    #[test]
    fn scopes_follow_the_gateway_misdirected_request_table() {
        let c = |h: &[&str]| Certificate {
            hostnames: h.iter().map(|s| s.to_string()).collect(),
            cert: PemSource::Pem(String::new()),
            key: PemSource::Pem(String::new()),
        };
        let s = SniScopes::new(&[
            c(&[]),
            c(&["second-example.org"]),
            c(&["*.wildcard.org"]),
            c(&["fourth-example.wildcard.org"]),
        ]);
        assert_eq!(s.scope("example.org"), Some(0));
        assert_eq!(s.scope("Second-Example.org."), Some(1));
        assert_eq!(s.scope("fith-example.wildcard.org"), Some(2));
        assert_eq!(s.scope("fourth-example.wildcard.org"), Some(3));
        assert!(!s.misdirected("example.org", "unknown-example.org"));
        assert!(!s.misdirected("unknown-example.org", "example.org"));
        assert!(s.misdirected("example.org", "second-example.org"));
        assert!(s.misdirected("second-example.org", "unknown-example.org"));
        assert!(!s.misdirected("third-example.wildcard.org", "fith-example.wildcard.org"));
        assert!(s.misdirected("third-example.wildcard.org", "fourth-example.wildcard.org"));
        assert!(s.misdirected("fourth-example.wildcard.org", "fith-example.wildcard.org"));
        // Without a catch-all entry an unknown name has no scope.
        let s = SniScopes::new(&[c(&["a.test"]), c(&["b.test"])]);
        assert_eq!(s.scope("c.test"), None);
        assert!(s.misdirected("a.test", "c.test"));
    }

    #[test]
    fn reports_bad_pem_with_path() {
        let c = Certificate {
            hostnames: vec![],
            cert: PemSource::Pem("not pem".into()),
            key: PemSource::Pem("nope".into()),
        };
        let err = SniResolver::new(&[c], "listeners[2].tls")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("listeners[2].tls.certificates[0].cert"),
            "{err}"
        );
        let c = Certificate {
            hostnames: vec![],
            cert: PemSource::File("/nonexistent/cert.pem".into()),
            key: PemSource::Pem("nope".into()),
        };
        let err = SniResolver::new(&[c], "listeners[0].tls")
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot read /nonexistent/cert.pem"), "{err}");
    }
}
