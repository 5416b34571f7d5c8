//! TLS towards backends (`https` and `h2`), with rustls and the ring provider.
//!
//! * With `BackendTls.ca` the backend certificate chain is verified against that CA bundle.
//!   Without `subject_alt_names` it must be valid for the name `tls.sni` (or the endpoint
//!   host); with them (Gateway API BackendTLSPolicy semantics) it must carry at least one of
//!   them instead: DNS names and IP addresses are matched by webpki, URI SANs
//!   (`spiffe://…`) exactly against the certificate's URI SAN entries. The SNI is sent either
//!   way.
//! * `well_known_ca` adds the public CAs of Mozilla's root program (compiled in, from
//!   `webpki-root-certs`) to the trusted roots.
//! * **Without a CA the backend is not verified at all** (any certificate is accepted, the
//!   handshake signatures are still checked). This suits in-cluster backends with self-signed
//!   certificates but gives no protection against an active attacker; configure `ca` to get it.
//! * `verify_depth` bounds the chain: at most `verify_depth - 1` intermediates are used
//!   (nginx's `proxy_ssl_verify_depth`, read as the client certificate check reads its depth).
//! * `min_version: 1.3` offers TLS 1.3 only; otherwise TLS 1.2 and 1.3 are offered.
//! * An optional client certificate and key are presented for mTLS.
//! * ALPN offers `h2` for the `h2` protocol and `http/1.1` for `https`.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use std::sync::Arc;
use sweety_config::{BackendTls, PemSource, TlsVersion};

fn read_pem(src: &PemSource) -> Result<Vec<u8>, String> {
    match src {
        PemSource::Pem(s) => Ok(s.as_bytes().to_vec()),
        PemSource::File(p) => std::fs::read(p).map_err(|e| format!("reading {}: {e}", p.display())),
    }
}

fn certs(src: &PemSource, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = read_pem(src)?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{what}: invalid PEM: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{what}: no certificate found in PEM"));
    }
    Ok(certs)
}

/// Builds the rustls client config for a backend. `h2` selects the ALPN protocol.
pub fn client_config(tls: &BackendTls, h2: bool) -> Result<Arc<ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions: &[&rustls::SupportedProtocolVersion] = match tls.min_version {
        Some(TlsVersion::Tls13) => &[&rustls::version::TLS13],
        None | Some(TlsVersion::Tls12) => rustls::DEFAULT_VERSIONS,
    };
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| e.to_string())?;
    let verifier: Arc<dyn ServerCertVerifier> = match (&tls.ca, tls.well_known_ca) {
        (None, false) => Arc::new(NoVerifier(provider)),
        (ca, well_known) => {
            let mut roots = RootCertStore::empty();
            if well_known {
                let (added, _) = roots.add_parsable_certificates(
                    webpki_root_certs::TLS_SERVER_ROOT_CERTS.iter().cloned(),
                );
                if added == 0 {
                    return Err("well_known_ca: no usable root certificate".into());
                }
            }
            for c in ca
                .iter()
                .map(|ca| certs(ca, "ca"))
                .collect::<Result<Vec<_>, _>>()?
                .into_iter()
                .flatten()
            {
                roots
                    .add(c)
                    .map_err(|e| format!("ca: unusable certificate: {e}"))?;
            }
            let inner =
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .map_err(|e| format!("ca: {e}"))?;
            let mut names = Vec::new();
            let mut uris = Vec::new();
            for n in &tls.subject_alt_names {
                if n.contains("://") {
                    uris.push(n.clone());
                } else {
                    names.push(
                        ServerName::try_from(n.clone())
                            .map_err(|_| format!("subject_alt_names: invalid name {n:?}"))?,
                    );
                }
            }
            let max_intermediates = tls
                .verify_depth
                .map_or(usize::MAX, |d| usize::from(d.max(1)) - 1);
            Arc::new(SanVerifier {
                inner,
                names,
                uris,
                max_intermediates,
            })
        }
    };
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut cfg = match (&tls.client_cert, &tls.client_key) {
        (Some(c), Some(k)) => {
            let chain = certs(c, "client_cert")?;
            let key = PrivateKeyDer::from_pem_slice(&read_pem(k)?)
                .map_err(|e| format!("client_key: {e}"))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("client_cert: {e}"))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => return Err("client_cert and client_key must be given together".into()),
    };
    cfg.alpn_protocols = vec![if h2 {
        b"h2".to_vec()
    } else {
        b"http/1.1".to_vec()
    }];
    Ok(Arc::new(cfg))
}

/// The name to send as SNI and verify: `tls.sni`, else the host part of the endpoint address.
pub fn server_name(sni: Option<&str>, endpoint: &str) -> Result<ServerName<'static>, String> {
    let host = match sni {
        Some(s) => s.to_string(),
        None => host_of(endpoint).to_string(),
    };
    ServerName::try_from(host.clone()).map_err(|_| format!("invalid TLS server name {host:?}"))
}

/// `host` of `host:port` (`[v6]:port` gives `v6`).
pub fn host_of(addr: &str) -> &str {
    if let Some(rest) = addr.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    addr.rsplit_once(':').map(|(h, _)| h).unwrap_or(addr)
}

/// WebPKI verification; with subject alt names configured the certificate must be valid for
/// one of them (DNS/IP `names` or exact `uris`) rather than for the server name.
#[derive(Debug)]
struct SanVerifier {
    inner: Arc<WebPkiServerVerifier>,
    names: Vec<ServerName<'static>>,
    uris: Vec<String>,
    /// `verify_depth - 1`: at most this many of the intermediates the backend sends are
    /// offered to webpki, so no path is longer than `verify_depth` certificates below the
    /// trust anchor (as the client certificate check does).
    max_intermediates: usize,
}

/// The URI subject alternative names of a DER certificate (empty when it has none or does
/// not parse; the chain itself is verified by webpki).
pub fn uri_sans(der: &[u8]) -> Vec<String> {
    use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
    let Ok((_, cert)) = X509Certificate::from_der(der) else {
        return Vec::new();
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|g| match g {
            GeneralName::URI(u) => Some((*u).to_string()),
            _ => None,
        })
        .collect()
}

fn is_name_error(e: &rustls::Error) -> bool {
    matches!(
        e,
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. }
        )
    )
}

impl ServerCertVerifier for SanVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let intermediates = &intermediates[..intermediates.len().min(self.max_intermediates)];
        if self.names.is_empty() && self.uris.is_empty() {
            return self.inner.verify_server_cert(
                end_entity,
                intermediates,
                server_name,
                ocsp,
                now,
            );
        }
        let mut chain_error = None;
        for name in &self.names {
            match self
                .inner
                .verify_server_cert(end_entity, intermediates, name, ocsp, now)
            {
                Ok(ok) => return Ok(ok),
                Err(e) if is_name_error(&e) => {}
                Err(e) => chain_error = Some(e),
            }
        }
        if let Some(e) = chain_error {
            return Err(e);
        }
        if !self.uris.is_empty() {
            // webpki checks the chain before the name: a name error means the chain is good.
            match self
                .inner
                .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
            {
                Ok(_) => {}
                Err(e) if is_name_error(&e) => {}
                Err(e) => return Err(e),
            }
            let have = uri_sans(end_entity.as_ref());
            if self.uris.iter().any(|u| have.iter().any(|h| h == u)) {
                return Ok(ServerCertVerified::assertion());
            }
        }
        Err(rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName,
        ))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Accepts any backend certificate (no CA configured); handshake signatures are still checked
/// with the provider's algorithms. Public for the benchmark clients (`examples/h3_bench.rs`,
/// oha's `--insecure`).
#[derive(Debug)]
pub struct NoVerifier(Arc<CryptoProvider>);

impl NoVerifier {
    /// A verifier that accepts any certificate and checks signatures with `provider`.
    pub fn new(provider: Arc<CryptoProvider>) -> NoVerifier {
        NoVerifier(provider)
    }
}

impl ServerCertVerifier for NoVerifier {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
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
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_parsing() {
        assert_eq!(host_of("example.com:443"), "example.com");
        assert_eq!(host_of("10.0.0.1:8443"), "10.0.0.1");
        assert_eq!(host_of("[::1]:8443"), "::1");
        assert!(matches!(
            server_name(None, "[::1]:1").unwrap(),
            ServerName::IpAddress(_)
        ));
        assert_eq!(
            server_name(Some("api.internal"), "10.0.0.1:1").unwrap(),
            ServerName::try_from("api.internal").unwrap()
        );
    }

    #[test]
    fn configs_build_and_reject_bad_input() {
        let cfg = client_config(&BackendTls::default(), true).unwrap();
        assert_eq!(cfg.alpn_protocols, vec![b"h2".to_vec()]);
        let ck = rcgen::generate_simple_self_signed(vec!["backend.test".into()]).unwrap();
        let tls = BackendTls {
            ca: Some(PemSource::Pem(ck.cert.pem())),
            subject_alt_names: vec!["alt.test".into()],
            client_cert: Some(PemSource::Pem(ck.cert.pem())),
            client_key: Some(PemSource::Pem(ck.signing_key.serialize_pem())),
            ..Default::default()
        };
        let cfg = client_config(&tls, false).unwrap();
        assert_eq!(cfg.alpn_protocols, vec![b"http/1.1".to_vec()]);
        let bad = BackendTls {
            ca: Some(PemSource::Pem("not pem".into())),
            ..Default::default()
        };
        assert!(client_config(&bad, false).is_err());
        let half = BackendTls {
            client_cert: Some(PemSource::Pem(ck.cert.pem())),
            ..Default::default()
        };
        assert!(client_config(&half, false).is_err());
    }
}
