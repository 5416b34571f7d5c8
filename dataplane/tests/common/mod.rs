//! Test harness shared by the dataplane integration tests: start a [`Runtime`] on ephemeral
//! 127.0.0.1 ports, and small real clients (HTTP/1.1, h2c, TLS with ALPN and SNI).

#![allow(dead_code)]

pub(crate) mod h2;
pub(crate) mod quic;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::Arc;
use sweety_config::*;
use sweety_dataplane::reload::{Runtime, RuntimeOptions};

/// Starts a test backend on an ephemeral 127.0.0.1 port and returns its address: each
/// accepted connection is given to `handler`, whose future runs on a task of its own. The
/// accept loop ends on an accept error or with the test's runtime.
pub(crate) async fn spawn_backend<F, Fut>(handler: F) -> SocketAddr
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(handler(s));
        }
    });
    addr
}

/// Starts an HTTP/1.1 and h2c test backend (hyper's auto server) on an ephemeral 127.0.0.1
/// port, through [`spawn_backend`]: `handler` answers every request.
pub(crate) async fn spawn_http_backend<F, Fut>(handler: F) -> SocketAddr
where
    F: Fn(http::Request<hyper::body::Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = http::Response<Full<Bytes>>> + Send + 'static,
{
    spawn_backend(move |s| {
        let handler = handler.clone();
        async move {
            let svc = hyper::service::service_fn(move |req| {
                let answer = handler(req);
                async move { Ok::<_, std::convert::Infallible>(answer.await) }
            });
            let _ =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
        }
    })
    .await
}

/// A started runtime and the addresses of its listeners by name.
pub(crate) struct Harness {
    pub runtime: Arc<Runtime>,
}

impl Harness {
    pub(crate) async fn start(cfg: Config) -> Harness {
        let opts = RuntimeOptions {
            access_log: AccessLog {
                enabled: false,
                ..AccessLog::default()
            },
            ..RuntimeOptions::default()
        };
        let runtime = Arc::new(Runtime::new(opts).unwrap());
        runtime.apply(cfg).await.expect("config applies");
        Harness { runtime }
    }

    pub(crate) async fn addr(&self, listener: &str) -> SocketAddr {
        *self
            .runtime
            .bound()
            .await
            .get(listener)
            .unwrap_or_else(|| panic!("listener {listener} bound"))
    }
}

/// How many times the named limit was hit (`sweety_limit_rejections`): tells which timeout
/// or limit closed a connection.
pub(crate) fn limit_hits(h: &Harness, limit: &str) -> u64 {
    h.runtime
        .shared
        .metrics
        .limit_rejections
        .snapshot()
        .into_iter()
        .filter(|(k, _)| *k == limit)
        .map(|(_, n)| n)
        .sum()
}

pub(crate) fn listener(name: &str, protocol: ListenerProtocol) -> Listener {
    Listener {
        name: name.into(),
        address: "127.0.0.1".into(),
        port: 0,
        protocol,
        tls: None,
        http3: false,
        max_requests_in_flight: None,
        advertised_port: None,
        l4_routes: vec![],
    }
}

pub(crate) fn fixed_route(name: &str, prefix: &str, body: &str) -> Route {
    Route {
        name: name.into(),
        matches: vec![RouteMatch {
            path: Some(PathMatch::Prefix(prefix.into())),
            ..Default::default()
        }],
        filters: vec![],
        action: Action::Fixed(FixedResponse {
            status: 200,
            body: body.into(),
            content_type: None,
        }),
        timeouts: Timeouts::default(),
        retry: None,
        max_request_body_bytes: None,
    }
}

/// A static site serving the files under `root` as they are (no index, no precompressed
/// variants, dotfiles hidden).
pub(crate) fn static_site(root: &std::path::Path) -> StaticSite {
    StaticSite {
        root: root.to_path_buf(),
        index: vec![],
        try_files: vec![],
        precompressed: false,
        cache_control: None,
        strip_prefix: None,
        hide_dotfiles: true,
    }
}

/// A config of one plain HTTP listener serving [`static_site`]`(root)` at `/`.
pub(crate) fn static_config(root: &std::path::Path) -> Config {
    let route = Route {
        action: Action::Static(static_site(root)),
        ..fixed_route("files", "/", "")
    };
    http_config(vec![vhost("v", &[], vec![route])])
}

pub(crate) fn proxy_route(name: &str, prefix: &str, backend: &str) -> Route {
    Route {
        name: name.into(),
        matches: vec![RouteMatch {
            path: Some(PathMatch::Prefix(prefix.into())),
            ..Default::default()
        }],
        filters: vec![],
        action: Action::Proxy(ProxyAction {
            backends: vec![WeightedBackend {
                backend: backend.into(),
                weight: 1,
                filters: vec![],
            }],
        }),
        timeouts: Timeouts::default(),
        retry: None,
        max_request_body_bytes: None,
    }
}

pub(crate) fn vhost(name: &str, hostnames: &[&str], routes: Vec<Route>) -> VirtualHost {
    VirtualHost {
        name: name.into(),
        hostnames: hostnames.iter().map(|s| s.to_string()).collect(),
        listeners: vec![],
        routes,
    }
}

/// An address that refuses connections for as long as the returned socket lives: bound on
/// 127.0.0.1, never listening. Binding a listener and dropping it is not enough: the freed port
/// can be handed to another socket (under parallel tests, the connect to it may even pick it
/// as its own source port and connect to itself), and the "dead" backend then answers.
pub(crate) fn refused_addr() -> (socket2::Socket, SocketAddr) {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .unwrap();
    let addr = s.local_addr().unwrap().as_socket().unwrap();
    (s, addr)
}

pub(crate) fn backend(name: &str, addr: SocketAddr) -> Backend {
    Backend {
        name: name.into(),
        protocol: BackendProtocol::Http1,
        tls: None,
        lb: LbPolicy::RoundRobin,
        endpoints: vec![Endpoint {
            address: addr.to_string(),
            weight: 1,
        }],
        connect_timeout: Duration::from_secs(2),
        outlier: OutlierDetection::default(),
        max_idle_per_endpoint: 16,
        ..Backend::new(name, Vec::new())
    }
}

/// A config with one plain HTTP listener and the given vhosts.
pub(crate) fn http_config(vhosts: Vec<VirtualHost>) -> Config {
    Config {
        generation: 1,
        listeners: vec![listener("web", ListenerProtocol::Http)],
        virtual_hosts: vhosts,
        ..Config::default()
    }
}

pub(crate) type Client = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

/// An HTTP/1.1 keep-alive client.
pub(crate) fn h1_client() -> Client {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build(hyper_util::client::legacy::connect::HttpConnector::new())
}

/// An h2c (prior knowledge) client.
pub(crate) fn h2c_client() -> Client {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build(hyper_util::client::legacy::connect::HttpConnector::new())
}

/// GET `url` with an optional Host header; returns status and body.
pub(crate) async fn get(
    client: &Client,
    url: &str,
    host: Option<&str>,
) -> Result<(u16, String), String> {
    let mut b = http::Request::get(url);
    if let Some(h) = host {
        b = b.header("host", h);
    }
    let resp = client
        .request(b.body(Full::new(Bytes::new())).unwrap())
        .await
        .map_err(|e| format!("{e:?}"))?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// GET `url` with extra request headers; returns the status, the response header `want`
/// and the body.
pub(crate) async fn get_headers(
    client: &Client,
    url: &str,
    headers: &[(&str, &str)],
    want: &str,
) -> (u16, Option<String>, String) {
    let mut b = http::Request::get(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = client
        .request(b.body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let got = resp
        .headers()
        .get(want)
        .map(|v| v.to_str().unwrap().to_string());
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, got, String::from_utf8_lossy(&body).into_owned())
}

/// A whole answer: status, headers and the body as text.
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: http::HeaderMap,
    pub(crate) body: String,
}

/// Sends `method url` with `headers` and `body`; the whole answer.
pub(crate) async fn send(
    client: &Client,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &'static str,
) -> Answer {
    let mut b = http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = client
        .request(
            b.body(Full::new(Bytes::from_static(body.as_bytes())))
                .unwrap(),
        )
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// A self-signed certificate for `name` as a config certificate, plus its PEM.
pub(crate) fn cert_for(name: &str) -> (Certificate, String) {
    let (c, k) = sweety_dataplane::tls::self_signed(&[name]).unwrap();
    (
        Certificate {
            hostnames: vec![name.into()],
            cert: PemSource::Pem(c.clone()),
            key: PemSource::Pem(k),
        },
        c,
    )
}

/// A TLS backend for `name` with its own self-signed certificate (from [`cert_for`]):
/// answers `<tag>:<what it read>` and closes. Returns its address and certificate PEM.
pub(crate) async fn tls_backend(name: &str, tag: &'static str) -> (SocketAddr, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (cert, pem) = cert_for(name);
    let (PemSource::Pem(c), PemSource::Pem(k)) = (cert.cert, cert.key) else {
        unreachable!()
    };
    use rustls_pki_types::pem::PemObject;
    let chain = vec![rustls_pki_types::CertificateDer::from_pem_slice(c.as_bytes()).unwrap()];
    let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(k.as_bytes()).unwrap();
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let addr = spawn_backend(move |s| {
        let acceptor = acceptor.clone();
        async move {
            if let Ok(mut tls) = acceptor.accept(s).await {
                let mut buf = [0u8; 64];
                if let Ok(n) = tls.read(&mut buf).await {
                    let mut out = format!("{tag}:").into_bytes();
                    out.extend_from_slice(&buf[..n]);
                    let _ = tls.write_all(&out).await;
                    let _ = tls.shutdown().await;
                }
            }
        }
    })
    .await;
    (addr, pem)
}

/// A rustls client config builder (ring, TLS 1.2 and 1.3) trusting only `ca_pem`; the
/// caller says which client certificate, if any, is presented.
pub(crate) fn client_config_trusting(
    ca_pem: &str,
) -> rustls::ConfigBuilder<rustls::ClientConfig, rustls::client::WantsClientCert> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
}

/// A TLS connector trusting only `ca_pem` and offering `alpn`.
pub(crate) fn tls_connector(ca_pem: &str, alpn: &[&[u8]]) -> tokio_rustls::TlsConnector {
    let mut cfg = client_config_trusting(ca_pem).with_no_client_auth();
    cfg.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
}

/// Opens TLS to `addr` with `sni`, trusting only `ca_pem`, offering `alpn`; sends GET `path`
/// and returns (negotiated ALPN, status, body).
pub(crate) async fn tls_get(
    addr: SocketAddr,
    sni: &str,
    ca_pem: &str,
    alpn: &[&[u8]],
    path: &str,
) -> Result<(Vec<u8>, u16, String), String> {
    let connector = tls_connector(ca_pem, alpn);
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = rustls_pki_types::ServerName::try_from(sni.to_string()).unwrap();
    let tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let negotiated = tls.get_ref().1.alpn_protocol().unwrap_or_default().to_vec();
    let io = TokioIo::new(tls);
    let (status, body) = if negotiated == b"h2" {
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                .await
                .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let req = http::Request::get(format!("https://{sni}{path}"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
        (
            resp.status().as_u16(),
            resp.into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes(),
        )
    } else {
        let (mut send, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let req = http::Request::get(path)
            .header("host", sni)
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
        (
            resp.status().as_u16(),
            resp.into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes(),
        )
    };
    Ok((
        negotiated,
        status,
        String::from_utf8_lossy(&body).into_owned(),
    ))
}

/// A CA (certificate PEM) and a client certificate it signed (certificate PEM, key PEM).
pub(crate) fn client_ca_and_cert(ca_name: &str) -> (String, String, String) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, ca_name);
    let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut leaf = CertificateParams::new(vec!["client.test".to_string()]).unwrap();
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let cert = leaf.signed_by(&key, &issuer).unwrap().pem();
    (ca_pem, cert, key.serialize_pem())
}

/// Runs each named `async fn case(client: Http2Client)` of the calling file as two tests in a
/// module of its name, `sweety` and `hyper`: one per HTTP/2 client of `h2c` and `h2` backends
/// (`limits.http2_client`).
#[allow(unused_macros)]
macro_rules! on_both_h2_clients {
    ($($case:ident),* $(,)?) => {
        $(
            mod $case {
                #[tokio::test]
                async fn sweety() {
                    super::$case(sweety_config::Http2Client::Sweety).await
                }

                #[tokio::test]
                async fn hyper() {
                    super::$case(sweety_config::Http2Client::Hyper).await
                }
            }
        )*
    };
}
#[allow(unused_imports)]
pub(crate) use on_both_h2_clients;
