//! Backend TLS (BackendTLSPolicy) against real rustls backends on 127.0.0.1 with rcgen
//! certificates signed by a test CA: verification by CA bundle, the SNI/hostname check,
//! subject alternative names (DNS and URI) replacing the hostname check, the well-known public
//! CAs, and mTLS to a backend that requires a client certificate; the chain depth bound and
//! the TLS 1.3-only setting; and the backends the controller makes of ingress-nginx's
//! `proxy-ssl-*` annotations (its golden output, `ing-nginx-proxy-ssl`) against a backend
//! whose fixed certificate is signed by the golden's private CA.

mod common;

use common::*;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use sweety_config::*;

struct Ca {
    pem: String,
    der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

fn ca(name: &str) -> Ca {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(rcgen::DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    let cert = p.self_signed(&key).unwrap();
    Ca {
        pem: cert.pem(),
        der: cert.der().clone(),
        issuer: Issuer::new(p, key),
    }
}

/// A leaf signed by `ca` with these DNS names and URI SANs: (cert PEM, key PEM, DER, key DER).
fn leaf(
    ca: &Ca,
    dns: &[&str],
    uris: &[&str],
) -> (
    String,
    String,
    CertificateDer<'static>,
    PrivateKeyDer<'static>,
) {
    let mut p =
        CertificateParams::new(dns.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    for u in uris {
        p.subject_alt_names
            .push(SanType::URI((*u).try_into().unwrap()));
    }
    let key = KeyPair::generate().unwrap();
    let cert = p.signed_by(&key, &ca.issuer).unwrap();
    let key_der = PrivateKeyDer::Pkcs8(key.serialize_der().into());
    (cert.pem(), key.serialize_pem(), cert.der().clone(), key_der)
}

/// An HTTPS backend answering "secure" (and the client certificate's presence), optionally
/// requiring client certificates signed by `client_ca`.
async fn tls_backend(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    client_ca: Option<&Ca>,
) -> SocketAddr {
    let roots = client_ca.map(|ca| ca.der.clone());
    tls_backend_with(chain, key, roots, rustls::DEFAULT_VERSIONS).await
}

/// [`tls_backend`] with the client CA as DER and the TLS versions it speaks.
async fn tls_backend_with(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    client_ca: Option<CertificateDer<'static>>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> SocketAddr {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .unwrap();
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(ca).unwrap();
            let v = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .unwrap();
            builder.with_client_cert_verifier(v)
        }
    };
    let mut cfg = builder.with_single_cert(chain, key).unwrap();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    spawn_backend(move |s| {
        let acceptor = acceptor.clone();
        async move {
            let Ok(tls) = acceptor.accept(s).await else {
                return;
            };
            let client_cert = tls.get_ref().1.peer_certificates().is_some();
            let svc = hyper::service::service_fn(move |_req| async move {
                let body = format!("secure client_cert={client_cert}");
                Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(
                    bytes::Bytes::from(body),
                )))
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                .await;
        }
    })
    .await
}

/// Serves a proxy route to an `https` backend with `tls` and returns (status, body) of a GET.
async fn through(addr: SocketAddr, tls: BackendTls) -> (u16, String) {
    let mut b = backend("be", addr);
    b.protocol = BackendProtocol::Https;
    b.tls = Some(tls);
    through_backend(addr, b).await
}

/// Serves a proxy route to `b` (its endpoints replaced by `addr`) and returns (status, body)
/// of a GET.
async fn through_backend(addr: SocketAddr, mut b: Backend) -> (u16, String) {
    b.name = "be".into();
    b.endpoints = vec![Endpoint {
        address: addr.to_string(),
        weight: 1,
    }];
    b.outlier.consecutive_failures = 0;
    let mut cfg = http_config(vec![vhost("v", &[], vec![proxy_route("r", "/", "be")])]);
    cfg.backends = vec![b];
    let h = Harness::start(cfg).await;
    let url = format!("http://{}/", h.addr("web").await);
    let out = get(&h1_client(), &url, None).await.unwrap();
    h.runtime.shutdown().await;
    out
}

fn pem(s: &str) -> Option<PemSource> {
    Some(PemSource::Pem(s.to_string()))
}

#[tokio::test]
async fn backend_tls_verification_sans_and_mtls() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let ca_a = ca("ca a");
        let ca_b = ca("ca b");
        let spiffe = "spiffe://cluster.local/ns/shop/sa/api";
        let (_, _, der, key) = leaf(&ca_a, &["backend.internal"], &[spiffe]);
        let addr = tls_backend(vec![der], key, None).await;

        // Right CA and hostname: served.
        let ok = BackendTls {
            ca: pem(&ca_a.pem),
            sni: Some("backend.internal".into()),
            ..Default::default()
        };
        let (s, body) = through(addr, ok.clone()).await;
        assert_eq!((s, body.as_str()), (200, "secure client_cert=false"));
        // Wrong CA: 502.
        let wrong_ca = BackendTls {
            ca: pem(&ca_b.pem),
            ..ok.clone()
        };
        assert_eq!(through(addr, wrong_ca).await.0, 502);
        // Hostname not in the certificate: 502.
        let wrong_name = BackendTls {
            sni: Some("other.internal".into()),
            ..ok.clone()
        };
        assert_eq!(through(addr, wrong_name).await.0, 502);
        // With subject_alt_names, they replace the hostname check (BackendTLSPolicy): a SAN
        // that matches serves even with another SNI…
        let by_dns_san = BackendTls {
            sni: Some("other.internal".into()),
            subject_alt_names: vec!["backend.internal".into()],
            ..ok.clone()
        };
        assert_eq!(through(addr, by_dns_san).await.0, 200);
        let by_uri_san = BackendTls {
            sni: Some("other.internal".into()),
            subject_alt_names: vec![spiffe.into()],
            ..ok.clone()
        };
        assert_eq!(through(addr, by_uri_san).await.0, 200);
        // …and SANs that do not match refuse it even though the hostname matches.
        let san_mismatch = BackendTls {
            subject_alt_names: vec![
                "nothere.internal".into(),
                "spiffe://cluster.local/ns/shop/sa/other".into(),
            ],
            ..ok.clone()
        };
        assert_eq!(through(addr, san_mismatch).await.0, 502);
        // The public CAs alone do not trust a private CA's certificate; with the private CA
        // added as well, it is served.
        let public_only = BackendTls {
            ca: None,
            well_known_ca: true,
            ..ok.clone()
        };
        assert_eq!(through(addr, public_only).await.0, 502);
        let both = BackendTls {
            well_known_ca: true,
            ..ok.clone()
        };
        assert_eq!(through(addr, both).await.0, 200);
        // A URI SAN does not rescue a certificate from an untrusted CA.
        let uri_wrong_ca = BackendTls {
            ca: pem(&ca_b.pem),
            subject_alt_names: vec![spiffe.into()],
            ..ok.clone()
        };
        assert_eq!(through(addr, uri_wrong_ca).await.0, 502);
    })
    .await
    .expect("test took too long");
}

#[tokio::test]
async fn mtls_backend_requires_the_client_certificate() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let server_ca = ca("server ca");
        let client_ca = ca("client ca");
        let (_, _, der, key) = leaf(&server_ca, &["mtls.internal"], &[]);
        let addr = tls_backend(vec![der], key, Some(&client_ca)).await;
        let (client_cert, client_key, _, _) = leaf(&client_ca, &["sweety.client"], &[]);
        let base = BackendTls {
            ca: pem(&server_ca.pem),
            sni: Some("mtls.internal".into()),
            ..Default::default()
        };
        // Without a client certificate the backend refuses the handshake: 502.
        assert_eq!(through(addr, base.clone()).await.0, 502);
        // With one signed by the CA it trusts: served, and it saw the certificate.
        let with_cert = BackendTls {
            client_cert: pem(&client_cert),
            client_key: pem(&client_key),
            ..base.clone()
        };
        let (s, body) = through(addr, with_cert).await;
        assert_eq!((s, body.as_str()), (200, "secure client_cert=true"));
        // A client certificate from another CA: refused.
        let other = ca("other client ca");
        let (oc, ok, _, _) = leaf(&other, &["sweety.client"], &[]);
        let wrong = BackendTls {
            client_cert: pem(&oc),
            client_key: pem(&ok),
            ..base
        };
        assert_eq!(through(addr, wrong).await.0, 502);
    })
    .await
    .expect("test took too long");
}

/// A chain leaf ← intermediate ← root: `verify_depth` 1 (the leaf issued by a certificate of
/// `ca` directly) refuses it, 2 accepts it, and no bound accepts it.
#[tokio::test]
async fn verify_depth_bounds_the_backend_chain() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let root = ca("root");
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "intermediate");
        let ikey = KeyPair::generate().unwrap();
        let icert = p.signed_by(&ikey, &root.issuer).unwrap();
        let inter = Ca {
            pem: icert.pem(),
            der: icert.der().clone(),
            issuer: Issuer::new(p, ikey),
        };
        let (_, _, der, key) = leaf(&inter, &["deep.internal"], &[]);
        let addr = tls_backend(vec![der, inter.der.clone()], key, None).await;
        let base = BackendTls {
            ca: pem(&root.pem),
            sni: Some("deep.internal".into()),
            ..Default::default()
        };
        assert_eq!(through(addr, base.clone()).await.0, 200);
        let depth = |d| BackendTls {
            verify_depth: Some(d),
            ..base.clone()
        };
        assert_eq!(through(addr, depth(1)).await.0, 502);
        assert_eq!(through(addr, depth(2)).await.0, 200);
    })
    .await
    .expect("test took too long");
}

/// The controller's golden output for ingress-nginx `proxy-ssl-*` (the test reads it, so a
/// change of the mapping is tried here too).
const PROXY_SSL_GOLDEN: &str =
    include_str!("../../controller/testdata/translate/ing-nginx-proxy-ssl.out.yaml");
const PROXY_SSL_DIR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../controller/testdata/proxy-ssl"
);

/// The backend the golden's Ingress `name` (host `<name>.example.com`) proxies to.
fn golden_backend(name: &str) -> Backend {
    let out: serde_yaml::Value = serde_yaml::from_str(PROXY_SSL_GOLDEN).unwrap();
    let cfg: Config = serde_yaml::from_value(out["config"].clone()).unwrap();
    let vhost = format!("ingress/{name}.example.com");
    let v = cfg.virtual_hosts.iter().find(|v| v.name == vhost).unwrap();
    let Action::Proxy(p) = &v.routes[0].action else {
        panic!("{vhost}: not a proxy route: {:?}", v.routes[0].action);
    };
    let b = &p.backends[0].backend;
    cfg.backends.iter().find(|x| &x.name == b).unwrap().clone()
}

fn fixture(file: &str) -> Vec<u8> {
    std::fs::read(format!("{PROXY_SSL_DIR}/{file}")).unwrap()
}

/// The golden's private CA (`ca.crt`) and the backend's certificate and key it signed (for
/// `backend.internal`).
fn proxy_ssl_fixtures() -> (
    CertificateDer<'static>,
    CertificateDer<'static>,
    PrivateKeyDer<'static>,
) {
    use rustls::pki_types::pem::PemObject;
    let ca = CertificateDer::from_pem_slice(&fixture("ca.crt")).unwrap();
    let cert = CertificateDer::from_pem_slice(&fixture("server.crt")).unwrap();
    let key = PrivateKeyDer::from_pem_slice(&fixture("server.key")).unwrap();
    (ca, cert, key)
}

/// ingress-nginx `proxy-ssl-*` as the controller maps them, served against real TLS
/// backends whose certificate (`backend.internal`) the golden's private CA signed: verified
/// with the CA and the name, and the Secret's client certificate shown to a backend that
/// requires one; refused (502) with another CA, another name, or no client certificate;
/// `proxy-ssl-verify: off` accepts a certificate no CA signed; `TLSv1.3` alone refuses a TLS
/// 1.2-only backend.
#[tokio::test]
async fn ingress_nginx_proxy_ssl_against_a_private_ca_backend() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let (ca_der, cert, key) = proxy_ssl_fixtures();
        let mtls = tls_backend_with(
            vec![cert.clone()],
            key.clone_key(),
            Some(ca_der),
            rustls::DEFAULT_VERSIONS,
        )
        .await;
        let plain = tls_backend_with(
            vec![cert.clone()],
            key.clone_key(),
            None,
            rustls::DEFAULT_VERSIONS,
        )
        .await;
        let tls12 = tls_backend_with(vec![cert], key, None, &[&rustls::version::TLS12]).await;
        // Not signed by the golden's CA (self-signed, the right name).
        let (_, _, self_der, self_key) = leaf(&ca("self"), &["backend.internal"], &[]);
        let stranger = tls_backend(vec![self_der], self_key, None).await;

        let valid = golden_backend("valid");
        let (s, body) = through_backend(mtls, valid.clone()).await;
        assert_eq!((s, body.as_str()), (200, "secure client_cert=true"));
        assert_eq!(through_backend(plain, valid.clone()).await.0, 200);
        assert_eq!(through_backend(stranger, valid.clone()).await.0, 502);
        assert_eq!(through_backend(tls12, valid).await.0, 200);
        // Another name than the certificate's.
        assert_eq!(
            through_backend(plain, golden_backend("wrong-name")).await.0,
            502
        );
        // A Secret with ca.crt only: verified, but no client certificate to show.
        let ca_only = golden_backend("ca-only");
        assert_eq!(through_backend(plain, ca_only.clone()).await.0, 200);
        assert_eq!(through_backend(mtls, ca_only).await.0, 502);
        // Another CA in ca.crt.
        assert_eq!(
            through_backend(plain, golden_backend("other-ca")).await.0,
            502
        );
        // verify off: any certificate, and still the client certificate.
        let off = golden_backend("verify-off");
        assert_eq!(through_backend(stranger, off.clone()).await.0, 200);
        let (s, body) = through_backend(mtls, off).await;
        assert_eq!((s, body.as_str()), (200, "secure client_cert=true"));
        // TLSv1.3 alone: a TLS 1.2-only backend is refused.
        let tls13 = golden_backend("tls13");
        assert_eq!(through_backend(tls12, tls13.clone()).await.0, 502);
        assert_eq!(through_backend(mtls, tls13).await.0, 200);
    })
    .await
    .expect("test took too long");
}
