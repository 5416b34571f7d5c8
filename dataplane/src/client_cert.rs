//! Client certificates per host (`ListenerTls.host_client_auth`; ingress-nginx's `auth-tls-*`
//! annotations).
//!
//! Two halves that must agree on one host:
//!
//! - **At the handshake** the listener reads the ClientHello first (`listen::tcp`), and when
//!   its SNI falls under an entry's hostnames, finishes the handshake with that entry's rustls
//!   config ([`HostAuth::handshake_config`]): it asks for a certificate, hints the entry's CA
//!   names and checks the client's proof of the key, but lets any certificate (or none)
//!   through ([`crate::tls::InsecureFallback`]). Other SNIs are not asked for one (a browser is
//!   never prompted for a host that does not want a certificate).
//! - **At each request** ([`HostAuth::check`]), for the request's Host: when it falls under an
//!   entry, the connection must have been made for that entry (its SNI under the same entry;
//!   else 421 Misdirected Request: another host's SNI, HTTP/2 connection coalescing, no SNI,
//!   plain HTTP, or HTTP/3, whose QUIC handshake never asks for a certificate), and the
//!   certificate is verified against the entry's CA with the entry's depth. In `require` mode
//!   a missing certificate answers 400 "No required SSL certificate was sent" and one that
//!   does not verify 400 "The SSL certificate error", as nginx does after the handshake (or a
//!   302 to `error_page`); `optional` serves a request without one; `optional_no_ca` serves
//!   any. `match_subject` then answers 403 unless the subject DN matches. The chain is
//!   verified once per connection and entry ([`VerdictCache`] in the connection's
//!   [`ConnInfo`]; HTTP/1.1 keep-alive and HTTP/2 streams alike), each verification counted as
//!   `sweety_edge_events_total{kind="client_cert_verify"}`.
//!
//! The backend gets `ssl-client-verify` (`SUCCESS`, `FAILED:<reason>`, `NONE`),
//! `ssl-client-subject-dn` and `ssl-client-issuer-dn` (RFC 2253, as nginx's `$ssl_client_s_dn`)
//! and, with `pass_certificate`, `ssl-client-cert` (the URL-escaped PEM, as nginx's
//! `$ssl_client_escaped_cert`), as ingress-nginx's template sets them. A client's own copies of
//! these four headers are removed on every host ([`strip_headers`], protected or not: stricter
//! than ingress-nginx, which passes them on where `auth-tls` is off; an edge must not let a
//! client forge what a backend may trust).

use crate::body::{text_response, Body};
use crate::ctx::{ConnInfo, Protocol};
use crate::tls::{InsecureFallback, SniScopes, TlsError};
use http::{header, HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::{CertificateDer, UnixTime};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use sweety_config::{HostClientAuth, HostVerify, ListenerTls};

/// `ssl-client-cert`: the client certificate, URL-escaped PEM.
pub static SSL_CLIENT_CERT: HeaderName = HeaderName::from_static("ssl-client-cert");
/// `ssl-client-verify`: `SUCCESS`, `FAILED:<reason>` or `NONE`.
pub static SSL_CLIENT_VERIFY: HeaderName = HeaderName::from_static("ssl-client-verify");
/// `ssl-client-subject-dn`: the certificate's subject, RFC 2253.
pub static SSL_CLIENT_SUBJECT_DN: HeaderName = HeaderName::from_static("ssl-client-subject-dn");
/// `ssl-client-issuer-dn`: the certificate's issuer, RFC 2253.
pub static SSL_CLIENT_ISSUER_DN: HeaderName = HeaderName::from_static("ssl-client-issuer-dn");

/// The client certificate chain a TLS connection presented (leaf first).
pub type PeerChain = Arc<[CertificateDer<'static>]>;

/// Removes a client's own `ssl-client-*` headers: only Sweety sets them (on a host with client
/// certificates), so a backend can trust what it finds there.
pub fn strip_headers(headers: &mut HeaderMap) {
    // One pass over the names the request has: a request rarely has any of the four, and
    // removing each by name hashes it (~650 instructions per request).
    if !headers
        .keys()
        .any(|n| n.as_str().starts_with("ssl-client-"))
    {
        return;
    }
    for h in [
        &SSL_CLIENT_CERT,
        &SSL_CLIENT_VERIFY,
        &SSL_CLIENT_SUBJECT_DN,
        &SSL_CLIENT_ISSUER_DN,
    ] {
        headers.remove(h);
    }
}

/// A connection's verdict on its client certificate chain, kept in its [`ConnInfo`] so the
/// chain is verified once per connection (the chain cannot change within one), for the entry
/// (of the running config) it was verified against: a reload with another CA verifies again.
#[derive(Debug, Default)]
pub struct VerdictCache(Mutex<Option<(u64, Checked)>>);

impl Clone for VerdictCache {
    fn clone(&self) -> Self {
        VerdictCache(Mutex::new(self.lock().clone()))
    }
}

impl VerdictCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(u64, Checked)>> {
        // Nothing that panics runs under the lock; a poisoned one holds a complete value.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cached value for entry `id`, else `check()`'s, kept.
    fn get_or(&self, id: u64, check: impl FnOnce() -> Checked) -> Checked {
        let mut slot = self.lock();
        match &*slot {
            Some((i, c)) if *i == id => c.clone(),
            _ => {
                let c = check();
                *slot = Some((id, c.clone()));
                c
            }
        }
    }
}

/// What one verification of a chain found: the verdict and the leaf's subject and issuer.
#[derive(Debug, Clone)]
struct Checked {
    verdict: Verdict,
    names: Option<Arc<(String, String)>>,
}

/// Makes each compiled entry's id (for [`VerdictCache`]), unique in the process.
static NEXT_ENTRY: AtomicU64 = AtomicU64::new(1);

/// The compiled `host_client_auth` of one HTTPS listener.
pub struct HostAuth {
    scopes: SniScopes,
    entries: Vec<Entry>,
}

impl std::fmt::Debug for HostAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostAuth")
            .field("entries", &self.entries.len())
            .finish()
    }
}

struct Entry {
    /// Unique in the process ([`NEXT_ENTRY`]): what a connection's [`VerdictCache`] is for.
    id: u64,
    /// Verifies a chain against the entry's CA (strict: no certificate is an error).
    verifier: Arc<dyn ClientCertVerifier>,
    /// The handshake config for SNIs under the entry (asks for a certificate).
    tls: Arc<rustls::ServerConfig>,
    verify: HostVerify,
    depth: usize,
    pass: bool,
    error_page: Option<HeaderValue>,
    match_subject: Option<regex::Regex>,
}

impl HostAuth {
    /// Compiles a listener's `host_client_auth` (None when it has none). `handshake` makes
    /// the rustls config of an entry from the verifier its handshake uses.
    pub fn build(
        tls: &ListenerTls,
        path: &str,
        handshake: &dyn Fn(Arc<dyn ClientCertVerifier>) -> Result<rustls::ServerConfig, TlsError>,
    ) -> Result<Option<HostAuth>, TlsError> {
        if tls.host_client_auth.is_empty() {
            return Ok(None);
        }
        let mut entries = Vec::new();
        for (i, a) in tls.host_client_auth.iter().enumerate() {
            entries.push(Entry::build(
                a,
                &format!("{path}.host_client_auth[{i}]"),
                handshake,
            )?);
        }
        Ok(Some(HostAuth {
            scopes: SniScopes::from_hostnames(
                tls.host_client_auth.iter().map(|a| a.hostnames.as_slice()),
            ),
            entries,
        }))
    }

    /// The rustls config to finish a handshake with when the ClientHello's SNI is `sni`:
    /// the entry's when the name falls under one (a certificate is asked for), else None.
    pub fn handshake_config(&self, sni: Option<&str>) -> Option<&Arc<rustls::ServerConfig>> {
        let i = self.scopes.scope(sni?)?;
        Some(&self.entries.get(i)?.tls)
    }

    /// Whether requests for `host` are checked (it falls under an entry).
    pub fn protects(&self, host: &str) -> bool {
        self.scopes.scope(host).is_some()
    }

    /// Checks a request for `host` (see the module docs): None with the request's headers
    /// set for the backend, or the answer to send instead. The caller has removed the
    /// client's own `ssl-client-*` headers ([`strip_headers`]); a verification of the chain
    /// (once per connection) is counted in `metrics`.
    pub fn check(
        &self,
        conn: &ConnInfo,
        protocol: Protocol,
        host: &str,
        headers: &mut HeaderMap,
        metrics: &crate::metrics::Metrics,
    ) -> Option<Response<Body>> {
        // An unprotected host: nothing to check, nothing to answer.
        let i = self.scopes.scope(host)?;
        let e = &self.entries[i];
        if protocol == Protocol::Http3 {
            return Some(text_response(
                StatusCode::MISDIRECTED_REQUEST,
                "421 Misdirected Request: this host asks for a client certificate; HTTP/3 \
                 connections carry none here, use HTTP/1.1 or HTTP/2\n",
            ));
        }
        let sni_entry = conn.sni.as_deref().and_then(|s| self.scopes.scope(s));
        if !conn.tls || sni_entry != Some(i) {
            return Some(text_response(
                StatusCode::MISDIRECTED_REQUEST,
                "421 Misdirected Request: this host asks for a client certificate; connect \
                 with its name as the TLS server name (SNI)\n",
            ));
        }
        let chain = conn.client_cert.as_deref().filter(|c| !c.is_empty());
        let Checked { verdict, names } = match chain {
            None => Checked {
                verdict: Verdict::None,
                names: None,
            },
            Some(chain) => conn.client_cert_verdict.get_or(e.id, || {
                metrics.edge_events.inc(&"client_cert_verify");
                // At most `depth - 1` intermediates are offered, so no path is longer than
                // `depth` certificates below the trust anchor.
                let inter = &chain[1..chain.len().min(e.depth)];
                let verdict = match e
                    .verifier
                    .verify_client_cert(&chain[0], inter, UnixTime::now())
                {
                    Ok(_) => Verdict::Success,
                    Err(err) => Verdict::Failed(err.to_string().into()),
                };
                let names = subject_and_issuer(&chain[0]).map(Arc::new);
                Checked { verdict, names }
            }),
        };
        let refused = match (&verdict, e.verify) {
            (Verdict::None, HostVerify::Require) => {
                Some("400 Bad Request: No required SSL certificate was sent\n")
            }
            (Verdict::Failed(_), HostVerify::Require | HostVerify::Optional) => {
                Some("400 Bad Request: The SSL certificate error\n")
            }
            _ => None,
        };
        if let Some(text) = refused {
            return Some(match &e.error_page {
                Some(page) => {
                    let mut r = text_response(StatusCode::FOUND, "302 Found\n");
                    r.headers_mut().insert(header::LOCATION, page.clone());
                    r
                }
                None => text_response(StatusCode::BAD_REQUEST, text),
            });
        }
        if let Some(re) = &e.match_subject {
            let subject = names.as_ref().map_or("", |n| n.0.as_str());
            if !re.is_match(subject) {
                return Some(text_response(
                    StatusCode::FORBIDDEN,
                    "403 Forbidden: client certificate unauthorized\n",
                ));
            }
        }
        let verify = match &verdict {
            Verdict::Success => "SUCCESS".to_string(),
            Verdict::None => "NONE".to_string(),
            Verdict::Failed(why) => format!("FAILED:{why}"),
        };
        if let Ok(v) = HeaderValue::from_str(&verify) {
            headers.insert(SSL_CLIENT_VERIFY.clone(), v);
        }
        if let Some(n) = names {
            for (name, value) in [
                (&SSL_CLIENT_SUBJECT_DN, &n.0),
                (&SSL_CLIENT_ISSUER_DN, &n.1),
            ] {
                if let Ok(v) = HeaderValue::from_str(value) {
                    headers.insert(name.clone(), v);
                }
            }
        }
        if let (true, Some(chain)) = (e.pass, chain) {
            if let Ok(v) = HeaderValue::from_str(&escaped_pem(&chain[0])) {
                headers.insert(SSL_CLIENT_CERT.clone(), v);
            }
        }
        None
    }
}

#[derive(Debug, Clone)]
enum Verdict {
    Success,
    None,
    Failed(Arc<str>),
}

impl Entry {
    fn build(
        a: &HostClientAuth,
        path: &str,
        handshake: &dyn Fn(Arc<dyn ClientCertVerifier>) -> Result<rustls::ServerConfig, TlsError>,
    ) -> Result<Entry, TlsError> {
        let cpath = format!("{path}.ca");
        let pem = crate::tls::read_pem(&a.ca, &cpath)?;
        let mut roots = rustls::RootCertStore::empty();
        for der in crate::tls::parse_certs(&pem, &cpath)? {
            roots.add(der).map_err(|source| TlsError::Rustls {
                path: cpath.clone(),
                source,
            })?;
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let unusable = |e: rustls::server::VerifierBuilderError| TlsError::Pem {
            path: cpath.clone(),
            message: format!("unusable CA bundle: {e}"),
        };
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(unusable)?;
        let lenient = WebPkiClientVerifier::builder_with_provider(roots, provider)
            .allow_unauthenticated()
            .build()
            .map_err(unusable)?;
        let tls = handshake(Arc::new(InsecureFallback::new(lenient)))?;
        let error_page = match &a.error_page {
            Some(url) => Some(HeaderValue::from_str(url).map_err(|_| TlsError::Pem {
                path: format!("{path}.error_page"),
                message: "not a header value".into(),
            })?),
            None => None,
        };
        let match_subject = match &a.match_subject {
            Some(re) => Some(regex::Regex::new(re).map_err(|e| TlsError::Pem {
                path: format!("{path}.match_subject"),
                message: format!("invalid regex: {e}"),
            })?),
            None => None,
        };
        Ok(Entry {
            id: NEXT_ENTRY.fetch_add(1, Ordering::Relaxed),
            verifier,
            tls: Arc::new(tls),
            verify: a.verify,
            depth: usize::from(a.verify_depth.max(1)),
            pass: a.pass_certificate,
            error_page,
            match_subject,
        })
    }
}

/// The subject and issuer of a certificate as RFC 2253 strings (nginx's `$ssl_client_s_dn`
/// and `$ssl_client_i_dn`: last RDN first, `,` between RDNs, `+` inside one).
pub fn subject_and_issuer(der: &CertificateDer<'_>) -> Option<(String, String)> {
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).ok()?;
    Some((rfc2253(cert.subject()), rfc2253(cert.issuer())))
}

fn rfc2253(name: &x509_parser::x509::X509Name<'_>) -> String {
    let registry = x509_parser::objects::oid_registry();
    let rdns: Vec<String> = name
        .iter_rdn()
        .map(|rdn| {
            rdn.iter()
                .map(|atv| {
                    let oid = atv.attr_type();
                    let key = match x509_parser::objects::oid2abbrev(oid, registry) {
                        Ok(abbrev) => abbrev.to_string(),
                        Err(_) => oid.to_id_string(),
                    };
                    let value = match atv.as_str() {
                        Ok(s) => escape_dn_value(s),
                        // Not a string type: `#` and the DER of the value in hex (RFC 2253 §2.4).
                        Err(_) => {
                            let mut s = String::from("#");
                            for b in atv.attr_value().as_bytes() {
                                s.push_str(&format!("{b:02x}"));
                            }
                            s
                        }
                    };
                    format!("{key}={value}")
                })
                .collect::<Vec<_>>()
                .join("+")
        })
        .collect();
    rdns.into_iter().rev().collect::<Vec<_>>().join(",")
}

/// RFC 2253 §2.4 escaping of an attribute value; control characters become `\XX`.
fn escape_dn_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    let last = v.chars().count().saturating_sub(1);
    for (i, c) in v.chars().enumerate() {
        let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';')
            || (i == 0 && (c == '#' || c == ' '))
            || (i == last && c == ' ');
        if special {
            out.push('\\');
            out.push(c);
        } else if c.is_control() {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("\\{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The certificate as PEM, URL-escaped as nginx's `$ssl_client_escaped_cert`: every byte
/// but `A-Z a-z 0-9 - . _ ~` as `%XX`.
pub fn escaped_pem(der: &CertificateDer<'_>) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(line).unwrap_or_default());
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    let mut out = String::with_capacity(pem.len() * 5 / 4);
    for b in pem.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dn_values_are_escaped_as_rfc_2253_says() {
        assert_eq!(escape_dn_value("a,b+c"), "a\\,b\\+c");
        assert_eq!(escape_dn_value(" #x "), "\\ #x\\ ");
        assert_eq!(escape_dn_value("#a"), "\\#a");
        assert_eq!(escape_dn_value("a\nb"), "a\\0Ab");
        assert_eq!(escape_dn_value("plain"), "plain");
    }

    /// RFC 2253 §2.4 read back: `\` and a special character, or `\XX` (hex) for a byte; None
    /// when a special character stands unescaped (it would split the value).
    fn unescape_dn_value(v: &str) -> Option<String> {
        let (mut out, mut bytes, mut it) = (String::new(), Vec::new(), v.chars());
        while let Some(c) = it.next() {
            if ",+\"<>;".contains(c) {
                return None;
            }
            if c != '\\' {
                out.push_str(&String::from_utf8(std::mem::take(&mut bytes)).unwrap());
                out.push(c);
                continue;
            }
            let n = it.next().expect("an escape ends the value");
            if n.is_ascii_hexdigit() {
                let lo = it.next().expect("two hex digits");
                bytes.push(u8::from_str_radix(&format!("{n}{lo}"), 16).unwrap());
            } else {
                out.push_str(&String::from_utf8(std::mem::take(&mut bytes)).unwrap());
                out.push(n);
            }
        }
        Some(out + &String::from_utf8(bytes).unwrap())
    }

    proptest::proptest! {
        /// Any value (a client's certificate says what it likes) escapes to text with no control
        /// character, a valid header value, and reads back to itself: nothing a client puts in
        /// its subject can end the header, add one, or pass as another DN's separator.
        #[test]
        fn any_dn_value_escapes_to_one_header_safe_value(v in "\\PC*|[ -~\\x00-\\x1f\\x7f,+\"\\\\<>;#]{0,24}") {
            let e = escape_dn_value(&v);
            proptest::prop_assert!(!e.chars().any(char::is_control), "{:?}", e);
            proptest::prop_assert!(HeaderValue::from_str(&e).is_ok(), "{:?}", e);
            proptest::prop_assert_eq!(unescape_dn_value(&e), Some(v));
        }
    }

    #[test]
    fn the_escaped_pem_keeps_only_unreserved_bytes() {
        let der = CertificateDer::from(vec![0xfbu8, 0xff, 0x3e]);
        // base64 "+/8+" has '+' and '/', the PEM has newlines and spaces.
        let s = escaped_pem(&der);
        assert!(s.starts_with("-----BEGIN%20CERTIFICATE-----%0A"), "{s}");
        assert!(s.contains("%2B%2F8%2B%0A"), "{s}");
        assert!(s.ends_with("-----END%20CERTIFICATE-----%0A"), "{s}");
        assert!(s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~%".contains(&b)));
    }
}
