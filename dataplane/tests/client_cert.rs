//! Client certificates per host (`ListenerTls.host_client_auth`, ingress-nginx `auth-tls-*`)
//! through real sockets: a real rustls client presents no certificate, one from the CA, one
//! from another CA, a chain through an intermediate, and connects with another host's SNI (or
//! none) to reach a protected host; a real backend reports the `ssl-client-*` headers it got.

mod common;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::client::ResolvesClientCert;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use sweety_config::*;

/// A CA and what it issues: leaf certificates (optionally through an intermediate).
struct Ca {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pem: String,
}

impl Ca {
    fn new(name: &str) -> Ca {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(DnType::CommonName, name);
        let pem = p.self_signed(&key).unwrap().pem();
        Ca {
            issuer: rcgen::Issuer::new(p, key),
            pem,
        }
    }

    /// An intermediate CA signed by this one (its PEM beside it).
    fn intermediate(&self, name: &str) -> Ca {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(DnType::CommonName, name);
        let pem = p.signed_by(&key, &self.issuer).unwrap().pem();
        Ca {
            issuer: rcgen::Issuer::new(p, key),
            pem,
        }
    }

    /// A client certificate `CN=<cn>,O=Example` (PEM) and its key (PEM).
    fn client(&self, cn: &str) -> (String, String) {
        use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair};
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name
            .push(DnType::OrganizationName, "Example");
        p.distinguished_name.push(DnType::CommonName, cn);
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        (
            p.signed_by(&key, &self.issuer).unwrap().pem(),
            key.serialize_pem(),
        )
    }
}

/// Presents a certificate when asked, and records whether the server asked.
#[derive(Debug)]
struct Presenter {
    key: Option<Arc<CertifiedKey>>,
    asked: AtomicBool,
}

impl ResolvesClientCert for Presenter {
    fn resolve(&self, _: &[&[u8]], _: &[rustls::SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        self.asked.store(true, Ordering::SeqCst);
        self.key.clone()
    }
    fn has_certs(&self) -> bool {
        true
    }
}

fn presenter(chain_pem: Option<&str>, key_pem: Option<&str>) -> Arc<Presenter> {
    let key = chain_pem.zip(key_pem).map(|(c, k)| {
        let chain: Vec<_> = CertificateDer::pem_slice_iter(c.as_bytes())
            .map(|c| c.unwrap())
            .collect();
        let key = PrivateKeyDer::from_pem_slice(k.as_bytes()).unwrap();
        let provider = rustls::crypto::ring::default_provider();
        Arc::new(CertifiedKey::from_der(chain, key, &provider).unwrap())
    });
    Arc::new(Presenter {
        key,
        asked: AtomicBool::new(false),
    })
}

/// One answer: status, the `ssl-client-*` lines the backend reported (or the error body),
/// the `Location` header.
#[derive(Debug)]
struct Answer {
    status: u16,
    body: String,
    location: Option<String>,
}

/// Connects to `addr` with `sni` (None: no SNI, the server is named by its IP) over `alpn`,
/// presenting what `who` holds, and sends one GET per `(host, extra headers)` on the one
/// connection.
async fn fetch(
    addr: SocketAddr,
    server_ca: &str,
    sni: Option<&str>,
    alpn: &[u8],
    who: &Arc<Presenter>,
    requests: &[(&str, &[(&str, &str)])],
) -> Result<Vec<Answer>, String> {
    let mut cfg = client_config_trusting(server_ca).with_client_cert_resolver(who.clone());
    cfg.alpn_protocols = vec![alpn.to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = match sni {
        Some(n) => ServerName::try_from(n.to_string()).unwrap(),
        None => ServerName::IpAddress(addr.ip().into()),
    };
    let tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let io = TokioIo::new(tls);
    let mut out = Vec::new();
    let build = |host: &str, extra: &[(&str, &str)], h2: bool| {
        let mut b = if h2 {
            http::Request::get(format!("https://{host}/echo"))
        } else {
            http::Request::get("/echo").header("host", host)
        };
        for (k, v) in extra {
            b = b.header(*k, *v);
        }
        b.body(Full::new(Bytes::new())).unwrap()
    };
    let answer = |resp: http::Response<hyper::body::Incoming>| async move {
        let status = resp.status().as_u16();
        let location = resp
            .headers()
            .get("location")
            .map(|v| v.to_str().unwrap().to_string());
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(Answer {
            status,
            body: String::from_utf8_lossy(&body.to_bytes()).into_owned(),
            location,
        })
    };
    if alpn == b"h2" {
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                .await
                .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        for (host, extra) in requests {
            let resp = send
                .send_request(build(host, extra, true))
                .await
                .map_err(|e| e.to_string())?;
            out.push(answer(resp).await?);
        }
    } else {
        let (mut send, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        for (host, extra) in requests {
            send.ready().await.map_err(|e| e.to_string())?;
            let resp = send
                .send_request(build(host, extra, false))
                .await
                .map_err(|e| e.to_string())?;
            out.push(answer(resp).await?);
        }
    }
    Ok(out)
}

/// A backend that answers with every `ssl-client-*` header it got, one `name=value` line each.
async fn echo_backend() -> SocketAddr {
    spawn_http_backend(|req: http::Request<hyper::body::Incoming>| async move {
        let mut lines = String::from("backend\n");
        for (k, v) in req.headers() {
            if k.as_str().starts_with("ssl-client-") {
                lines.push_str(&format!("{k}={}\n", v.to_str().unwrap_or("?")));
            }
        }
        http::Response::new(Full::new(Bytes::from(lines)))
    })
    .await
}

fn entry(host: &str, ca: &str, verify: HostVerify) -> HostClientAuth {
    HostClientAuth {
        hostnames: vec![host.into()],
        ca: PemSource::Pem(ca.into()),
        verify,
        verify_depth: 1,
        pass_certificate: true,
        error_page: None,
        match_subject: None,
    }
}

const HOSTS: &[&str] = &[
    "mtls.test",
    "open.test",
    "opt.test",
    "noca.test",
    "page.test",
    "deep.test",
    "cn.test",
];

struct Setup {
    _h: Harness,
    addr: SocketAddr,
    server_ca: String,
    good: Arc<Presenter>,
    other: Arc<Presenter>,
    chained: Arc<Presenter>,
    none: Arc<Presenter>,
    good_pem: String,
}

async fn setup() -> Setup {
    let ca = Ca::new("Trusted Client CA");
    let inter = ca.intermediate("Intermediate CA");
    let stranger = Ca::new("Other CA");
    let (good_pem, good_key) = ca.client("client one");
    let (other_pem, other_key) = stranger.client("client one");
    let (deep_pem, deep_key) = inter.client("deep client");
    let chain = format!("{deep_pem}{}", inter.pem);
    let mut names: Vec<&str> = HOSTS.to_vec();
    names.push("127.0.0.1");
    let (server_pem, server_key) = sweety_dataplane::tls::self_signed(&names).unwrap();
    let mut l = listener("https", ListenerProtocol::Https);
    let mut page = entry("page.test", &ca.pem, HostVerify::Require);
    page.error_page = Some("https://login.example/cert-needed".into());
    let mut deep = entry("deep.test", &ca.pem, HostVerify::Require);
    deep.verify_depth = 2;
    let mut cn = entry("cn.test", &ca.pem, HostVerify::Require);
    cn.match_subject = Some("CN=someone else".into());
    let mut opt = entry("opt.test", &ca.pem, HostVerify::Optional);
    opt.pass_certificate = false;
    l.tls = Some(ListenerTls {
        certificates: vec![Certificate {
            hostnames: vec![],
            cert: PemSource::Pem(server_pem.clone()),
            key: PemSource::Pem(server_key),
        }],
        min_version: TlsVersion::Tls12,
        client_auth: None,
        host_client_auth: vec![
            entry("mtls.test", &ca.pem, HostVerify::Require),
            opt,
            entry("noca.test", &ca.pem, HostVerify::OptionalNoCa),
            page,
            deep,
            cn,
        ],
    });
    let be = echo_backend().await;
    let cfg = Config {
        listeners: vec![l],
        virtual_hosts: vec![vhost("v", HOSTS, vec![proxy_route("r", "/", "be")])],
        backends: vec![backend("be", be)],
        ..Config::default()
    };
    let h = Harness::start(cfg).await;
    let addr = h.addr("https").await;
    Setup {
        _h: h,
        addr,
        server_ca: server_pem,
        good: presenter(Some(&good_pem), Some(&good_key)),
        other: presenter(Some(&other_pem), Some(&other_key)),
        chained: presenter(Some(&chain), Some(&deep_key)),
        none: presenter(None, None),
        good_pem,
    }
}

impl Setup {
    async fn one(&self, sni: Option<&str>, host: &str, who: &Arc<Presenter>) -> Answer {
        self.with(sni, host, who, &[]).await
    }

    async fn with(
        &self,
        sni: Option<&str>,
        host: &str,
        who: &Arc<Presenter>,
        extra: &[(&str, &str)],
    ) -> Answer {
        let mut v = fetch(
            self.addr,
            &self.server_ca,
            sni,
            b"http/1.1",
            who,
            &[(host, extra)],
        )
        .await
        .unwrap();
        v.pop().unwrap()
    }
}

const FORGED: &[(&str, &str)] = &[
    ("ssl-client-cert", "FORGED"),
    ("ssl-client-verify", "SUCCESS"),
    ("ssl-client-subject-dn", "CN=admin"),
    ("ssl-client-issuer-dn", "CN=Trusted Client CA"),
];

#[tokio::test]
async fn a_protected_host_needs_a_certificate_from_its_ca() {
    let s = setup().await;
    // A certificate from the CA: served; the backend gets the verdict, the names and the
    // certificate, and never the client's own copies of these headers.
    let a = s
        .with(Some("mtls.test"), "mtls.test", &s.good, FORGED)
        .await;
    assert_eq!(a.status, 200, "{a:?}");
    assert!(s.good.asked.load(Ordering::SeqCst));
    let lines: Vec<&str> = a.body.lines().collect();
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.starts_with("ssl-client-"))
            .count(),
        4,
        "{a:?}"
    );
    assert!(lines.contains(&"ssl-client-verify=SUCCESS"), "{a:?}");
    assert!(
        lines.contains(&"ssl-client-subject-dn=CN=client one,O=Example"),
        "{a:?}"
    );
    assert!(
        lines.contains(&"ssl-client-issuer-dn=CN=Trusted Client CA"),
        "{a:?}"
    );
    let cert = lines
        .iter()
        .find_map(|l| l.strip_prefix("ssl-client-cert="))
        .expect("the certificate is passed");
    let pem = percent_encoding::percent_decode_str(cert)
        .decode_utf8()
        .unwrap();
    let der = |p: &str| {
        CertificateDer::pem_slice_iter(p.as_bytes())
            .next()
            .unwrap()
            .unwrap()
    };
    assert_eq!(der(&pem), der(&s.good_pem));
    assert!(pem.starts_with("-----BEGIN CERTIFICATE-----\n"), "{pem}");

    // No certificate: 400 as nginx says it, and the backend is not asked.
    let a = s.one(Some("mtls.test"), "mtls.test", &s.none).await;
    assert_eq!(a.status, 400, "{a:?}");
    assert!(
        a.body.contains("No required SSL certificate was sent"),
        "{a:?}"
    );
    // One from another CA: 400.
    let a = s.one(Some("mtls.test"), "mtls.test", &s.other).await;
    assert_eq!(a.status, 400, "{a:?}");
    assert!(a.body.contains("The SSL certificate error"), "{a:?}");
    // Through an intermediate: beyond depth 1 here, within depth 2 on deep.test.
    let a = s.one(Some("mtls.test"), "mtls.test", &s.chained).await;
    assert_eq!(a.status, 400, "{a:?}");
    let a = s.one(Some("deep.test"), "deep.test", &s.chained).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert!(
        a.body
            .contains("ssl-client-subject-dn=CN=deep client,O=Example"),
        "{a:?}"
    );
    assert!(
        a.body.contains("ssl-client-issuer-dn=CN=Intermediate CA"),
        "{a:?}"
    );
}

#[tokio::test]
async fn another_hosts_connection_cannot_reach_a_protected_host() {
    let s = setup().await;
    // The SNI of an unprotected host: no certificate is asked for, and a request for the
    // protected host on that connection is misdirected, with a valid certificate on hand.
    let who = presenter(None, None);
    let a = s.one(Some("open.test"), "open.test", &who).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert!(
        !who.asked.load(Ordering::SeqCst),
        "open.test asked for a certificate"
    );
    let a = s.one(Some("open.test"), "mtls.test", &s.good).await;
    assert_eq!(a.status, 421, "{a:?}");
    // No SNI at all.
    let a = s.one(None, "mtls.test", &s.good).await;
    assert_eq!(a.status, 421, "{a:?}");
    // HTTP/2 connection coalescing: one connection made for open.test, then mtls.test.
    let v = fetch(
        s.addr,
        &s.server_ca,
        Some("open.test"),
        b"h2",
        &s.good,
        &[("open.test", &[]), ("mtls.test", &[])],
    )
    .await
    .unwrap();
    assert_eq!((v[0].status, v[1].status), (200, 421), "{v:?}");
    // The other way round is fine: a connection made (and verified) for mtls.test may ask
    // for an unprotected host.
    let v = fetch(
        s.addr,
        &s.server_ca,
        Some("mtls.test"),
        b"h2",
        &s.good,
        &[("mtls.test", &[]), ("open.test", &[])],
    )
    .await
    .unwrap();
    assert_eq!((v[0].status, v[1].status), (200, 200), "{v:?}");
    // A connection for one protected host does not reach another one either.
    let a = s.one(Some("deep.test"), "mtls.test", &s.good).await;
    assert_eq!(a.status, 421, "{a:?}");
}

#[tokio::test]
async fn optional_modes_error_page_and_subject_match() {
    let s = setup().await;
    // optional: served without a certificate, the forged headers removed, NONE said.
    let a = s.with(Some("opt.test"), "opt.test", &s.none, FORGED).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.body, "backend\nssl-client-verify=NONE\n", "{a:?}");
    // ... but a certificate that does not verify is refused.
    let a = s.one(Some("opt.test"), "opt.test", &s.other).await;
    assert_eq!(a.status, 400, "{a:?}");
    // ... and a good one is passed without the certificate itself (pass_certificate off).
    let a = s.one(Some("opt.test"), "opt.test", &s.good).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert!(a.body.contains("ssl-client-verify=SUCCESS"), "{a:?}");
    assert!(!a.body.contains("ssl-client-cert="), "{a:?}");
    // optional_no_ca: another CA's certificate is served and passed on, marked FAILED.
    let a = s.one(Some("noca.test"), "noca.test", &s.other).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert!(a.body.contains("ssl-client-verify=FAILED:"), "{a:?}");
    assert!(
        a.body.contains("ssl-client-cert=-----BEGIN%20CERTIFICATE"),
        "{a:?}"
    );
    // error_page: a redirect instead of the 400.
    let a = s.one(Some("page.test"), "page.test", &s.none).await;
    assert_eq!(a.status, 302, "{a:?}");
    assert_eq!(
        a.location.as_deref(),
        Some("https://login.example/cert-needed")
    );
    // match_subject: a verified certificate whose subject does not match gets 403.
    let a = s.one(Some("cn.test"), "cn.test", &s.good).await;
    assert_eq!(a.status, 403, "{a:?}");
    assert!(a.body.contains("client certificate unauthorized"), "{a:?}");
}

/// How many times a client certificate chain was verified
/// (`sweety_edge_events_total{kind="client_cert_verify"}`).
fn verifications(h: &Harness) -> u64 {
    h.runtime
        .shared
        .metrics
        .edge_events
        .snapshot()
        .into_iter()
        .filter(|(k, _)| *k == "client_cert_verify")
        .map(|(_, n)| n)
        .sum()
}

#[tokio::test]
async fn a_chain_is_verified_once_per_connection_h1_and_h2() {
    let s = setup().await;
    let three: &[(&str, &[(&str, &str)])] = &[
        ("mtls.test", FORGED),
        ("mtls.test", &[]),
        ("mtls.test", FORGED),
    ];
    for (alpn, connections) in [(&b"http/1.1"[..], 1), (&b"h2"[..], 2)] {
        let v = fetch(
            s.addr,
            &s.server_ca,
            Some("mtls.test"),
            alpn,
            &s.good,
            three,
        )
        .await
        .unwrap();
        assert_eq!(v.len(), 3);
        for a in &v {
            // Every request carries the verdict and the names, none of the client's own.
            assert_eq!(a.status, 200, "{a:?}");
            assert!(a.body.contains("ssl-client-verify=SUCCESS\n"), "{a:?}");
            assert!(
                a.body
                    .contains("ssl-client-subject-dn=CN=client one,O=Example\n"),
                "{a:?}"
            );
            assert!(
                !a.body.contains("FORGED") && !a.body.contains("CN=admin"),
                "{a:?}"
            );
        }
        assert_eq!(
            verifications(&s._h),
            connections,
            "{}",
            String::from_utf8_lossy(alpn)
        );
    }
    // A refused chain is refused on every request of its connection, verified once too.
    let v = fetch(
        s.addr,
        &s.server_ca,
        Some("mtls.test"),
        b"h2",
        &s.other,
        &[("mtls.test", &[]), ("mtls.test", &[])],
    )
    .await
    .unwrap();
    assert_eq!((v[0].status, v[1].status), (400, 400), "{v:?}");
    assert_eq!(verifications(&s._h), 3);
}

#[tokio::test]
async fn forged_client_cert_headers_are_removed_on_every_host() {
    // A host of a listener with client certificates for other hosts only.
    let s = setup().await;
    let a = s
        .with(Some("open.test"), "open.test", &s.good, FORGED)
        .await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.body, "backend\n", "{a:?}");
    // A plain HTTP listener without any client certificates.
    let be = echo_backend().await;
    let mut cfg = http_config(vec![vhost("v", &[], vec![proxy_route("r", "/", "be")])]);
    cfg.backends = vec![backend("be", be)];
    let h = Harness::start(cfg).await;
    let addr = h.addr("web").await;
    for client in [h1_client(), h2c_client()] {
        let (status, _, body) =
            get_headers(&client, &format!("http://{addr}/echo"), FORGED, "x").await;
        assert_eq!((status, body.as_str()), (200, "backend\n"));
    }
}
