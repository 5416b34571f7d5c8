//! OpenTelemetry tracing end to end (issue 21): a real Sweety runtime, a real OTLP/HTTP
//! receiver started here (hyper on 127.0.0.1, decoding every `POST /v1/traces` body as
//! `ExportTraceServiceRequest` with opentelemetry-proto's generated types, independent of the
//! dataplane's own encoder), and a real origin that records the `traceparent` and
//! `tracestate` it received. Asserts the spans (names, kinds, attributes, status), the parent
//! chain client span → server span → upstream span → the origin's `traceparent`, sampling
//! (parent-based, ratio 0 and 1, the ratio rule by trace id), that an invalid context restarts
//! the trace and is never passed on, that tracing off leaves the fields alone, and that a dead
//! or silent receiver costs the requests nothing (they all succeed) while the spans are
//! counted as failed or dropped.

mod common;

use bytes::Bytes;
use common::*;
use http_body_util::Full;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, status::StatusCode, Span};
use prost::Message;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use sweety_config::*;

/// Spans received, with the resource's `service.name` of their request.
type Received = Arc<Mutex<Vec<(String, Span)>>>;

/// How a receiver was called, one entry per export: `grpc` or `http/protobuf`, then ` over tls`
/// or ` over tcp`.
type Calls = Arc<Mutex<Vec<String>>>;

/// The gRPC method of an OTLP trace export.
const GRPC_EXPORT: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// How a receiver answers each export (after decoding and recording it).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Answer {
    /// Success, nothing rejected.
    Accept,
    /// Success with `partial_success.rejected_spans` of this many.
    Reject(i64),
    /// gRPC: a trailers-only `grpc-status: 14` (UNAVAILABLE); HTTP: 503.
    Unavailable,
}

/// A response body: data frames, then trailers for gRPC.
type Frames = http_body_util::StreamBody<
    futures_util::stream::Iter<
        std::vec::IntoIter<Result<hyper::body::Frame<Bytes>, std::convert::Infallible>>,
    >,
>;

fn frames(v: Vec<hyper::body::Frame<Bytes>>) -> Frames {
    http_body_util::StreamBody::new(futures_util::stream::iter(
        v.into_iter().map(Ok).collect::<Vec<_>>(),
    ))
}

/// Records the spans of an export.
fn record(export: ExportTraceServiceRequest, got: &Received) {
    for rs in export.resource_spans {
        let service = rs
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                Value::StringValue(s) => Some(s.clone()),
                _ => None,
            })
            .unwrap_or_default();
        for ss in rs.scope_spans {
            assert_eq!(ss.scope.unwrap().name, "sweety-dataplane");
            for s in ss.spans {
                got.lock().unwrap().push((service.clone(), s));
            }
        }
    }
}

/// The encoded `ExportTraceServiceResponse` for `answer`.
fn response_message(answer: Answer) -> Vec<u8> {
    ExportTraceServiceResponse {
        partial_success: match answer {
            Answer::Reject(n) => Some(ExportTracePartialSuccess {
                rejected_spans: n,
                error_message: "spans too old".into(),
            }),
            _ => None,
        },
    }
    .encode_to_vec()
}

/// One OTLP export, decoded and answered. OTLP/HTTP: `POST /v1/traces` over HTTP/1.1 with a
/// protobuf body. OTLP/gRPC: the `Export` method over HTTP/2, one length-prefixed message,
/// answered with a length-prefixed `ExportTraceServiceResponse` and `grpc-status` trailers (or
/// a trailers-only UNAVAILABLE).
async fn export(
    req: http::Request<hyper::body::Incoming>,
    port: u16,
    (got, calls, tls): (Received, Calls, bool),
    answer: Answer,
) -> http::Response<Frames> {
    use http_body_util::BodyExt;
    assert_eq!(req.method(), http::Method::POST);
    let authority = format!("127.0.0.1:{port}");
    let grpc = req.headers()["content-type"] == "application/grpc";
    calls.lock().unwrap().push(format!(
        "{} over {}",
        if grpc { "grpc" } else { "http/protobuf" },
        if tls { "tls" } else { "tcp" }
    ));
    if grpc {
        assert_eq!(req.version(), http::Version::HTTP_2);
        assert_eq!(req.uri().path(), GRPC_EXPORT);
        assert_eq!(req.uri().authority().unwrap().as_str(), authority);
        assert_eq!(req.headers()["te"], "trailers");
        let timeout = req.headers()["grpc-timeout"].to_str().unwrap();
        assert!(timeout.ends_with('m'), "{timeout}");
    } else {
        assert_eq!(req.version(), http::Version::HTTP_11);
        assert_eq!(req.uri().path(), "/v1/traces");
        assert_eq!(req.headers()["host"], authority.as_str());
        assert_eq!(
            req.headers()["content-type"].as_bytes(),
            b"application/x-protobuf"
        );
    }
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let message = if grpc {
        // One uncompressed length-prefixed message, nothing after it.
        assert_eq!(body[0], 0, "not compressed");
        let len = u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize;
        assert_eq!(body.len(), 5 + len);
        body.slice(5..)
    } else {
        body
    };
    record(
        ExportTraceServiceRequest::decode(message).expect("a valid OTLP export"),
        &got,
    );
    let reply = response_message(answer);
    match (grpc, answer) {
        (true, Answer::Unavailable) => http::Response::builder()
            .header("content-type", "application/grpc")
            .header("grpc-status", "14")
            .header("grpc-message", "collector%20shutting%20down")
            .body(frames(vec![]))
            .unwrap(),
        (true, _) => {
            let mut framed = vec![0];
            framed.extend_from_slice(&(reply.len() as u32).to_be_bytes());
            framed.extend_from_slice(&reply);
            let mut t = http::HeaderMap::new();
            t.insert("grpc-status", "0".parse().unwrap());
            http::Response::builder()
                .header("content-type", "application/grpc")
                .body(frames(vec![
                    hyper::body::Frame::data(Bytes::from(framed)),
                    hyper::body::Frame::trailers(t),
                ]))
                .unwrap()
        }
        (false, Answer::Unavailable) => http::Response::builder()
            .status(503)
            .body(frames(vec![]))
            .unwrap(),
        (false, _) => http::Response::builder()
            .header("content-type", "application/x-protobuf")
            .body(frames(vec![hyper::body::Frame::data(Bytes::from(reply))]))
            .unwrap(),
    }
}

/// An OTLP receiver on 127.0.0.1 speaking OTLP/HTTP (HTTP/1.1) and OTLP/gRPC (HTTP/2) on one
/// port, in plain text or, with `tls`, over TLS (ALPN `h2` and `http/1.1`): decodes each
/// export with opentelemetry-proto's types, records its spans and answers as `answer` says.
async fn receiver_with(
    tls: Option<Arc<rustls::ServerConfig>>,
    answer: Answer,
) -> (SocketAddr, Received, Calls) {
    let got: Received = Arc::default();
    let calls: Calls = Arc::default();
    let (g, c) = (got.clone(), calls.clone());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let (g, c, tls) = (g.clone(), c.clone(), tls.clone());
            tokio::spawn(async move {
                let on_tls = tls.is_some();
                let svc = hyper::service::service_fn(move |req| {
                    let seen = (g.clone(), c.clone(), on_tls);
                    async move {
                        Ok::<_, std::convert::Infallible>(
                            export(req, addr.port(), seen, answer).await,
                        )
                    }
                });
                let server = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                );
                match tls {
                    None => {
                        let _ = server
                            .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                            .await;
                    }
                    Some(cfg) => {
                        // A handshake the client gives up (an untrusted CA) just ends here.
                        if let Ok(s) = tokio_rustls::TlsAcceptor::from(cfg).accept(s).await {
                            let _ = server
                                .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                                .await;
                        }
                    }
                }
            });
        }
    });
    (addr, got, calls)
}

/// A plain OTLP receiver that accepts every export.
async fn receiver() -> (SocketAddr, Received) {
    let (addr, got, _) = receiver_with(None, Answer::Accept).await;
    (addr, got)
}

/// What the origin received: (path, traceparent values, tracestate values).
type Seen = Arc<Mutex<Vec<(String, Vec<String>, Vec<String>)>>>;

/// An origin recording the trace fields of each request; `/flaky` answers 503 on its first
/// call and 200 after.
async fn origin() -> (SocketAddr, Seen) {
    let seen: Seen = Arc::default();
    let flaky = Arc::new(AtomicU32::new(0));
    let s2 = seen.clone();
    let addr = spawn_http_backend(move |req| {
        let (seen, flaky) = (s2.clone(), flaky.clone());
        async move {
            let all = |name: &str| -> Vec<String> {
                req.headers()
                    .get_all(name)
                    .iter()
                    .map(|v| v.to_str().unwrap().to_string())
                    .collect()
            };
            let path = req.uri().path().to_string();
            seen.lock()
                .unwrap()
                .push((path.clone(), all("traceparent"), all("tracestate")));
            let status = if path == "/flaky" && flaky.fetch_add(1, Ordering::SeqCst) == 0 {
                503
            } else {
                200
            };
            http::Response::builder()
                .status(status)
                .body(Full::new(Bytes::from_static(b"hello")))
                .unwrap()
        }
    })
    .await;
    (addr, seen)
}

struct Setup {
    h: Harness,
    cfg: Config,
    addr: SocketAddr,
    origin: SocketAddr,
    seen: Seen,
}

fn tracing_to(endpoint: SocketAddr, ratio: f64, parent_based: bool) -> Tracing {
    Tracing {
        sampling_ratio: ratio,
        parent_based,
        service_name: "edge-test".into(),
        batch_delay: sweety_config::Duration::from_millis(20),
        export_timeout: sweety_config::Duration::from_millis(500),
        ..Tracing::to(format!("http://{endpoint}/v1/traces"))
    }
}

/// Tracing by `protocol` to `scheme://endpoint` (with `/v1/traces` for OTLP/HTTP): ratio 0,
/// parent-based, so exactly the requests with a sampled `traceparent` are traced.
fn tracing_by(protocol: OtlpProtocol, scheme: &str, endpoint: SocketAddr) -> Tracing {
    let url = match protocol {
        OtlpProtocol::Grpc => format!("{scheme}://{endpoint}"),
        OtlpProtocol::HttpProtobuf => format!("{scheme}://{endpoint}/v1/traces"),
    };
    Tracing {
        otlp_protocol: protocol,
        otlp_endpoint: url,
        ..tracing_to(endpoint, 0.0, true)
    }
}

/// A private CA (PEM) and a receiver TLS config with a certificate it signed for the IP
/// address 127.0.0.1, offering ALPN `h2` and `http/1.1`; with `client_ca` (PEM) the receiver
/// requires a client certificate signed by it.
fn private_ca_receiver(client_ca: Option<&str>) -> (String, Arc<rustls::ServerConfig>) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "otlp test ca");
    let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut leaf = CertificateParams::new(Vec::<String>::new()).unwrap();
    leaf.subject_alt_names = vec![SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into())];
    let cert = leaf.signed_by(&key, &issuer).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(pem) => {
            use rustls::pki_types::pem::PemObject;
            let mut roots = rustls::RootCertStore::empty();
            for c in rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes()) {
                roots.add(c.unwrap()).unwrap();
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut cfg = builder
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    (ca_pem, Arc::new(cfg))
}

/// Waits (bounded) until the `outcome` count of exported spans is `n`; returns it.
async fn counted(s: &Setup, outcome: &'static str, n: u64) -> u64 {
    let m = &s.h.runtime.shared.metrics;
    for _ in 0..400 {
        if m.trace_spans.get(&outcome) == n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    m.trace_spans.get(&outcome)
}

/// Sends one request to `path` with a sampled client `traceparent` and checks what arrives at
/// the receiver holding `got` (empty before), every export by `transport` (an entry of
/// [`Calls`]): the server span's parent is the client's span, the upstream span's parent is the
/// server span, the origin's parent is the upstream span, all under the client's trace; both
/// spans counted as exported.
async fn assert_chain(s: &Setup, (got, calls): (&Received, &Calls), path: &str, transport: &str) {
    let tp = format!("00-{TRACE}-{CLIENT_SPAN}-01");
    assert_eq!(send(s.addr, path, &[("traceparent", &tp)]).await, 200);
    let v = spans(got, 2).await;
    assert_eq!(v.len(), 2, "{v:?}");
    let kind = |k: SpanKind| {
        v.iter()
            .find(|(_, s)| s.kind == k as i32)
            .unwrap()
            .1
            .clone()
    };
    let (server, client) = (kind(SpanKind::Server), kind(SpanKind::Client));
    assert_eq!(v[0].0, "edge-test");
    assert_eq!(attrs(&server)["url.path"], path);
    assert_eq!(hex(&server.trace_id), TRACE);
    assert_eq!(hex(&server.parent_span_id), CLIENT_SPAN);
    assert_eq!(hex(&client.trace_id), TRACE);
    assert_eq!(client.parent_span_id, server.span_id);
    assert_eq!(
        upstream_traceparent(&s.seen, path).0,
        vec![format!("00-{TRACE}-{}-01", hex(&client.span_id))]
    );
    assert_eq!(counted(s, "exported", 2).await, 2);
    let calls = calls.lock().unwrap().clone();
    assert!(
        !calls.is_empty() && calls.iter().all(|c| c == transport),
        "{calls:?}"
    );
    let m = &s.h.runtime.shared.metrics;
    assert_eq!(m.trace_spans.get(&"failed"), 0);
    assert_eq!(m.trace_spans.get(&"rejected"), 0);
}

async fn start(tracing: Option<Tracing>) -> Setup {
    let (origin, seen) = origin().await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut flaky = proxy_route("flaky", "/flaky", "up");
    flaky.retry = Some(RetryPolicy {
        attempts: 2,
        codes: vec![503],
        backoff: None,
        budget: None,
    });
    let cfg = Config {
        backends: vec![backend("up", origin), backend("down", dead)],
        tracing,
        ..http_config(vec![vhost(
            "app",
            &[],
            vec![
                flaky,
                proxy_route("down", "/down", "down"),
                fixed_route("fixed", "/fixed", "fixed"),
                proxy_route("ok", "/", "up"),
            ],
        )])
    };
    let h = Harness::start(cfg.clone()).await;
    let addr = h.addr("web").await;
    Setup {
        h,
        cfg,
        addr,
        origin,
        seen,
    }
}

/// GETs `path` with the given extra fields; returns the status.
async fn send(addr: SocketAddr, path: &str, fields: &[(&str, &str)]) -> u16 {
    let mut b = http::Request::get(format!("http://{addr}{path}")).header("user-agent", "t/1");
    for (n, v) in fields {
        b = b.header(*n, *v);
    }
    let resp = tokio::time::timeout(
        Duration::from_secs(10),
        h1_client().request(b.body(Full::new(Bytes::new())).unwrap()),
    )
    .await
    .expect("answered in time")
    .unwrap();
    let status = resp.status().as_u16();
    use http_body_util::BodyExt;
    resp.into_body().collect().await.unwrap();
    status
}

/// Waits (bounded) until the receiver holds at least `n` spans; returns them.
async fn spans(got: &Received, n: usize) -> Vec<(String, Span)> {
    for _ in 0..400 {
        let v = got.lock().unwrap().clone();
        if v.len() >= n {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!(
        "fewer than {n} spans: {:#?}",
        got.lock()
            .unwrap()
            .iter()
            .map(|s| &s.1.name)
            .collect::<Vec<_>>()
    );
}

fn attrs(s: &Span) -> HashMap<String, String> {
    s.attributes
        .iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => s.clone(),
                Some(Value::IntValue(i)) => i.to_string(),
                other => panic!("unexpected value {other:?}"),
            };
            (kv.key.clone(), v)
        })
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The last traceparent the origin got for `path`.
fn upstream_traceparent(seen: &Seen, path: &str) -> (Vec<String>, Vec<String>) {
    let v = seen.lock().unwrap();
    let (_, tp, ts) = v
        .iter()
        .rev()
        .find(|(p, _, _)| p == path)
        .expect("origin saw it");
    (tp.clone(), ts.clone())
}

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

#[tokio::test]
async fn spans_chain_from_the_client_through_sweety_to_the_backend() {
    let (rx, got) = receiver().await;
    let s = start(Some(tracing_to(rx, 0.0, true))).await;
    let tp = format!("00-{TRACE}-{CLIENT_SPAN}-01");
    let status = send(
        s.addr,
        "/hello",
        &[("traceparent", &tp), ("tracestate", "vendor=abc,other=1")],
    )
    .await;
    assert_eq!(status, 200);
    let got_spans = spans(&got, 2).await;
    assert_eq!(got_spans.len(), 2);
    let by_kind = |k: SpanKind| {
        got_spans
            .iter()
            .find(|(_, s)| s.kind == k as i32)
            .unwrap_or_else(|| panic!("a {k:?} span"))
            .clone()
    };
    let (service, server) = by_kind(SpanKind::Server);
    let (_, client) = by_kind(SpanKind::Client);
    assert_eq!(service, "edge-test");

    // The server span: the client's trace, the client's span as parent.
    assert_eq!(hex(&server.trace_id), TRACE);
    assert_eq!(hex(&server.parent_span_id), CLIENT_SPAN);
    assert_eq!(server.name, "GET ok");
    assert_eq!(server.trace_state, "vendor=abc,other=1");
    let a = attrs(&server);
    assert_eq!(a["http.request.method"], "GET");
    assert_eq!(a["url.path"], "/hello");
    assert_eq!(a["url.scheme"], "http");
    assert_eq!(a["http.response.status_code"], "200");
    assert_eq!(a["http.response.body.size"], "5");
    assert_eq!(a["network.protocol.version"], "1.1");
    assert_eq!(a["client.address"], "127.0.0.1");
    assert_eq!(a["sweety.route"], "ok");
    assert_eq!(a["sweety.listener"], "web");
    assert_eq!(a["user_agent.original"], "t/1");
    assert_eq!(a["sweety.request_id"].len(), 32);
    assert_eq!(
        server.status.as_ref().unwrap().code,
        StatusCode::Unset as i32
    );
    assert!(server.start_time_unix_nano > 0);
    assert!(server.end_time_unix_nano >= server.start_time_unix_nano);
    // Sampled, with a remote parent (OTLP span flags bits 8 and 9).
    assert_eq!(server.flags, 0x301);

    // The upstream span: a child of the server span.
    assert_eq!(hex(&client.trace_id), TRACE);
    assert_eq!(client.parent_span_id, server.span_id);
    assert_ne!(client.span_id, server.span_id);
    assert_eq!(client.name, "proxy up");
    let a = attrs(&client);
    assert_eq!(a["sweety.backend"], "up");
    assert_eq!(a["server.address"], "127.0.0.1");
    assert_eq!(a["server.port"], s.origin.port().to_string());
    assert_eq!(a["http.response.status_code"], "200");
    assert_eq!(a["http.request.resend_count"], "0");
    assert_eq!(
        client.status.as_ref().unwrap().code,
        StatusCode::Unset as i32
    );
    assert!(client.start_time_unix_nano >= server.start_time_unix_nano);
    assert!(client.end_time_unix_nano <= server.end_time_unix_nano);

    // The backend's parent is the upstream span; the tracestate went along unchanged.
    let (tp_up, ts_up) = upstream_traceparent(&s.seen, "/hello");
    assert_eq!(
        tp_up,
        vec![format!("00-{TRACE}-{}-01", hex(&client.span_id))]
    );
    assert_eq!(ts_up, vec!["vendor=abc,other=1".to_string()]);

    // Exported and counted.
    let m = &s.h.runtime.shared.metrics;
    for _ in 0..200 {
        if m.trace_spans.get(&"exported") == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(m.trace_spans.get(&"exported"), 2);
    assert_eq!(m.trace_spans.get(&"dropped"), 0);
}

#[tokio::test]
async fn retries_errors_and_unproxied_requests_have_the_spans_they_should() {
    let (rx, got) = receiver().await;
    let s = start(Some(tracing_to(rx, 1.0, true))).await;
    // A retried call: one upstream span with one resend; the 503 try is not the outcome.
    assert_eq!(send(s.addr, "/flaky", &[]).await, 200);
    // Nothing listens behind `down`: 502, both spans are errors.
    assert_eq!(send(s.addr, "/down", &[]).await, 502);
    // A fixed reply: a server span only.
    assert_eq!(send(s.addr, "/fixed", &[]).await, 200);
    let v = spans(&got, 5).await;
    assert_eq!(
        v.len(),
        5,
        "{:?}",
        v.iter().map(|s| &s.1.name).collect::<Vec<_>>()
    );
    let named = |n: &str| -> Span {
        v.iter()
            .find(|(_, s)| s.name == n)
            .unwrap_or_else(|| panic!("span {n}"))
            .1
            .clone()
    };
    let flaky_server = named("GET flaky");
    let flaky_up = v
        .iter()
        .find(|(_, s)| s.name == "proxy up")
        .unwrap()
        .1
        .clone();
    assert_eq!(flaky_up.parent_span_id, flaky_server.span_id);
    assert!(
        flaky_server.parent_span_id.is_empty(),
        "a new trace has no parent"
    );
    assert_eq!(attrs(&flaky_up)["http.request.resend_count"], "1");
    assert_eq!(attrs(&flaky_up)["http.response.status_code"], "200");
    // Both tries carried the same traceparent (one upstream span for the call).
    let tries: Vec<_> = s
        .seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(p, _, _)| p == "/flaky")
        .map(|(_, tp, _)| tp.clone())
        .collect();
    assert_eq!(tries.len(), 2);
    assert_eq!(tries[0], tries[1]);
    assert_eq!(
        tries[0],
        vec![format!(
            "00-{}-{}-01",
            hex(&flaky_up.trace_id),
            hex(&flaky_up.span_id)
        )]
    );

    let down_server = named("GET down");
    let down_up = named("proxy down");
    assert_eq!(down_up.parent_span_id, down_server.span_id);
    assert_eq!(
        down_server.status.as_ref().unwrap().code,
        StatusCode::Error as i32
    );
    assert_eq!(
        down_up.status.as_ref().unwrap().code,
        StatusCode::Error as i32
    );
    let a = attrs(&down_up);
    assert_eq!(a["error.type"], "connect");
    assert!(!a.contains_key("http.response.status_code"));
    assert_eq!(attrs(&down_server)["http.response.status_code"], "502");

    let fixed = named("GET fixed");
    assert_eq!(attrs(&fixed)["http.response.status_code"], "200");
    assert!(!v.iter().any(|(_, s)| s.parent_span_id == fixed.span_id));
}

#[tokio::test]
async fn sampling_follows_the_parent_and_the_ratio() {
    // Ratio 0, parent-based: an unsampled parent is not recorded but still propagated with a
    // new parent id; a sampled one is recorded; without a parent nothing is.
    let (rx, got) = receiver().await;
    let s = start(Some(tracing_to(rx, 0.0, true))).await;
    let unsampled = format!("00-{TRACE}-{CLIENT_SPAN}-00");
    assert_eq!(
        send(s.addr, "/a", &[("traceparent", &unsampled)]).await,
        200
    );
    let (tp, _) = upstream_traceparent(&s.seen, "/a");
    assert_eq!(tp.len(), 1);
    assert!(tp[0].starts_with(&format!("00-{TRACE}-")), "{tp:?}");
    assert!(tp[0].ends_with("-00"), "{tp:?}");
    assert!(
        !tp[0].contains(CLIENT_SPAN),
        "our span is the backend's parent"
    );
    for _ in 0..10 {
        assert_eq!(send(s.addr, "/b", &[]).await, 200);
    }
    let (tp, _) = upstream_traceparent(&s.seen, "/b");
    assert!(tp[0].ends_with("-00") && !tp[0].contains(TRACE), "{tp:?}");
    // A sampled request after them: when its spans arrive, anything queued before has too.
    let sampled = format!("00-{TRACE}-{CLIENT_SPAN}-01");
    assert_eq!(send(s.addr, "/c", &[("traceparent", &sampled)]).await, 200);
    let v = spans(&got, 2).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let v2 = got.lock().unwrap().clone();
    assert_eq!(v2.len(), 2, "only /c was sampled: {v:?}");
    assert!(v2
        .iter()
        .all(|(_, s)| attrs(s).get("url.path").is_none_or(|p| p == "/c")));

    // Not parent-based, ratio 0.5: the trace id decides (low 63 bits below 2^62), the flag
    // does not.
    let (rx, got) = receiver().await;
    let s = start(Some(tracing_to(rx, 0.5, false))).await;
    let low_id = "0af7651916cd43dd0000000000000001";
    let high_id = "0af7651916cd43ddfffffffffffffffe";
    let flagged = format!("00-{high_id}-{CLIENT_SPAN}-01");
    let unflagged = format!("00-{low_id}-{CLIENT_SPAN}-00");
    assert_eq!(
        send(s.addr, "/high", &[("traceparent", &flagged)]).await,
        200
    );
    assert_eq!(
        send(s.addr, "/low", &[("traceparent", &unflagged)]).await,
        200
    );
    spans(&got, 2).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let v = got.lock().unwrap().clone();
    assert_eq!(v.len(), 2, "{v:?}");
    assert!(v.iter().all(|(_, s)| hex(&s.trace_id) == low_id));
    assert!(upstream_traceparent(&s.seen, "/high").0[0].ends_with("-00"));
    assert!(upstream_traceparent(&s.seen, "/low").0[0].ends_with("-01"));

    // Ratio 1: every request, and each gets its own trace.
    let (rx, got) = receiver().await;
    let s = start(Some(tracing_to(rx, 1.0, true))).await;
    for _ in 0..5 {
        assert_eq!(send(s.addr, "/d", &[]).await, 200);
    }
    let v = spans(&got, 10).await;
    let traces: std::collections::HashSet<_> = v.iter().map(|(_, s)| s.trace_id.clone()).collect();
    assert_eq!(traces.len(), 5);
}

#[tokio::test]
async fn an_invalid_context_restarts_the_trace_and_is_never_passed_on() {
    let (rx, got) = receiver().await;
    let s = start(Some(tracing_to(rx, 1.0, true))).await;
    let invalid = [
        format!("00-{}-{CLIENT_SPAN}-01", TRACE.to_uppercase()),
        format!("00-{TRACE}-0000000000000000-01"),
        format!("ff-{TRACE}-{CLIENT_SPAN}-01"),
        format!("00-{TRACE}-{CLIENT_SPAN}-01-extra"),
        "garbage".to_string(),
    ];
    for (i, bad) in invalid.iter().enumerate() {
        let path = format!("/bad{i}");
        assert_eq!(
            send(
                s.addr,
                &path,
                &[("traceparent", bad), ("tracestate", "vendor=abc")]
            )
            .await,
            200
        );
        let (tp, ts) = upstream_traceparent(&s.seen, &path);
        assert_eq!(tp.len(), 1);
        assert_ne!(&tp[0], bad);
        assert!(!tp[0].to_lowercase().contains(TRACE), "restarted: {tp:?}");
        assert!(
            ts.is_empty(),
            "tracestate goes with an invalid parent: {ts:?}"
        );
    }
    // Two traceparent fields: invalid too.
    let tp1 = format!("00-{TRACE}-{CLIENT_SPAN}-01");
    assert_eq!(
        send(
            s.addr,
            "/two",
            &[("traceparent", &tp1), ("traceparent", &tp1)]
        )
        .await,
        200
    );
    let (tp, _) = upstream_traceparent(&s.seen, "/two");
    assert!(tp.len() == 1 && !tp[0].contains(TRACE), "{tp:?}");
    let v = spans(&got, 12).await;
    for (_, sp) in v.iter().filter(|(_, s)| s.kind == SpanKind::Server as i32) {
        assert!(
            sp.parent_span_id.is_empty(),
            "a restarted trace has no parent"
        );
        assert_ne!(hex(&sp.trace_id), TRACE);
        assert!(sp.trace_state.is_empty());
    }
}

#[tokio::test]
async fn tracing_off_leaves_the_fields_alone_and_exports_nothing() {
    let s = start(None).await;
    let tp = format!("00-{TRACE}-{CLIENT_SPAN}-01");
    assert_eq!(
        send(s.addr, "/x", &[("traceparent", &tp), ("tracestate", "a=1")]).await,
        200
    );
    assert_eq!(
        upstream_traceparent(&s.seen, "/x"),
        (vec![tp.clone()], vec!["a=1".to_string()])
    );
    assert_eq!(send(s.addr, "/y", &[]).await, 200);
    assert_eq!(upstream_traceparent(&s.seen, "/y"), (vec![], vec![]));
    assert!(s.h.runtime.shared.tracer.load().is_none());
    assert!(s.h.runtime.shared.metrics.trace_spans.snapshot().is_empty());
}

#[tokio::test]
async fn a_dead_or_silent_receiver_costs_the_requests_nothing() {
    // Nothing listens: exports fail fast.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    // Accepts and never answers: exports time out.
    let silent = spawn_backend(|s| async move {
        tokio::time::sleep(Duration::from_secs(30)).await;
        drop(s);
    })
    .await;
    for (receiver, silent) in [(dead, false), (silent, true)] {
        let mut t = tracing_to(receiver, 1.0, true);
        t.max_queue_spans = 8;
        t.max_batch_spans = 4;
        t.export_timeout = sweety_config::Duration::from_millis(300);
        let s = start(Some(t)).await;
        for i in 0..40 {
            assert_eq!(
                send(s.addr, &format!("/r{i}"), &[]).await,
                200,
                "{receiver}"
            );
        }
        let m = &s.h.runtime.shared.metrics;
        let counted = || m.trace_spans.get(&"failed") + m.trace_spans.get(&"dropped");
        assert_eq!(m.trace_spans.get(&"exported"), 0);
        if silent {
            // The first export hangs until its timeout: the queue (8) fills meanwhile and
            // later spans are dropped and counted.
            for _ in 0..200 {
                if m.trace_spans.get(&"failed") > 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            assert!(
                m.trace_spans.get(&"failed") > 0,
                "timed-out exports are counted"
            );
            assert!(
                m.trace_spans.get(&"dropped") > 0,
                "a full queue drops and counts"
            );
        }
        // Every one of the 80 spans ends up counted, as failed or dropped.
        for _ in 0..400 {
            if counted() == 80 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert_eq!(counted(), 80, "{receiver}");
        assert!(m.trace_spans.get(&"failed") > 0);
    }
}

#[tokio::test]
async fn a_reload_changes_the_tracer_and_turning_it_off_stops_it() {
    let (rx, got) = receiver().await;
    let s = start(Some(tracing_to(rx, 1.0, true))).await;
    assert_eq!(send(s.addr, "/one", &[]).await, 200);
    spans(&got, 2).await;
    let mut cfg = s.cfg.clone();
    cfg.generation += 1;
    cfg.tracing = None;
    s.h.runtime.apply(cfg).await.expect("applies");
    assert!(s.h.runtime.shared.tracer.load().is_none());
    let tp = format!("00-{TRACE}-{CLIENT_SPAN}-01");
    assert_eq!(send(s.addr, "/two", &[("traceparent", &tp)]).await, 200);
    assert_eq!(upstream_traceparent(&s.seen, "/two").0, vec![tp]);
}

#[tokio::test]
async fn grpc_over_h2c_exports_the_same_chain() {
    let (rx, got, calls) = receiver_with(None, Answer::Accept).await;
    let s = start(Some(tracing_by(OtlpProtocol::Grpc, "http", rx))).await;
    assert_chain(&s, (&got, &calls), "/grpc", "grpc over tcp").await;
    // A second export reuses the HTTP/2 connection and still arrives.
    got.lock().unwrap().clear();
    let tp = format!("00-{TRACE}-{CLIENT_SPAN}-01");
    assert_eq!(send(s.addr, "/again", &[("traceparent", &tp)]).await, 200);
    spans(&got, 2).await;
    assert_eq!(counted(&s, "exported", 4).await, 4);
}

#[tokio::test]
async fn both_protocols_reach_a_tls_receiver_of_a_private_ca_with_a_client_certificate() {
    let (client_ca, client_cert, client_key) = client_ca_and_cert("otlp clients");
    let (ca, server) = private_ca_receiver(Some(&client_ca));
    for (protocol, transport) in [
        (OtlpProtocol::Grpc, "grpc over tls"),
        (OtlpProtocol::HttpProtobuf, "http/protobuf over tls"),
    ] {
        let (rx, got, calls) = receiver_with(Some(server.clone()), Answer::Accept).await;
        let t = Tracing {
            otlp_ca: Some(PemSource::Pem(ca.clone())),
            otlp_client_cert: Some(PemSource::Pem(client_cert.clone())),
            otlp_client_key: Some(PemSource::Pem(client_key.clone())),
            ..tracing_by(protocol, "https", rx)
        };
        let s = start(Some(t)).await;
        assert_chain(&s, (&got, &calls), "/tls", transport).await;
    }
}

#[tokio::test]
async fn a_wrong_ca_a_missing_client_certificate_or_a_refusal_fails_exports_not_requests() {
    let (_, server) = private_ca_receiver(None);
    let (other_ca, _) = private_ca_receiver(None);
    let (client_ca, _, _) = client_ca_and_cert("otlp clients");
    let (mtls_ca, mtls_server) = private_ca_receiver(Some(&client_ca));
    let (_, unknown_server) = private_ca_receiver(None);
    let grpc = OtlpProtocol::Grpc;
    let http = OtlpProtocol::HttpProtobuf;
    // (what, protocol, the receiver's TLS, the CA we trust, how the receiver answers)
    let cases = [
        // TLS: the receiver's certificate is not signed by the configured CA, or (no CA
        // configured) by a well-known one.
        (
            "wrong ca",
            grpc,
            Some(server.clone()),
            Some(other_ca.clone()),
            Answer::Accept,
        ),
        (
            "wrong ca",
            http,
            Some(server),
            Some(other_ca),
            Answer::Accept,
        ),
        (
            "not a public ca",
            grpc,
            Some(unknown_server),
            None,
            Answer::Accept,
        ),
        // TLS: the receiver wants a client certificate and we have none.
        (
            "no client cert",
            grpc,
            Some(mtls_server),
            Some(mtls_ca),
            Answer::Accept,
        ),
        // The receiver refuses: grpc-status 14 (trailers-only), HTTP 503.
        ("unavailable", grpc, None, None, Answer::Unavailable),
        ("unavailable", http, None, None, Answer::Unavailable),
    ];
    for (what, protocol, tls, ca, answer) in cases {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let (rx, got, _) = receiver_with(tls, answer).await;
        let mut t = tracing_by(protocol, scheme, rx);
        t.sampling_ratio = 1.0;
        t.otlp_ca = ca.map(PemSource::Pem);
        let s = start(Some(t)).await;
        for i in 0..3 {
            assert_eq!(send(s.addr, &format!("/r{i}"), &[]).await, 200, "{what}");
        }
        assert_eq!(counted(&s, "failed", 6).await, 6, "{what} {protocol:?}");
        let m = &s.h.runtime.shared.metrics;
        assert_eq!(m.trace_spans.get(&"exported"), 0, "{what}");
        // A refusing receiver got (and decoded) the spans; a TLS failure sent none.
        let received = got.lock().unwrap().len();
        if answer == Answer::Unavailable {
            assert_eq!(received, 6, "{what} {protocol:?}");
        } else {
            assert_eq!(received, 0, "{what} {protocol:?}");
        }
    }
}

#[tokio::test]
async fn spans_rejected_in_a_partial_success_are_counted() {
    for (protocol, transport) in [
        (OtlpProtocol::Grpc, "grpc over tcp"),
        (OtlpProtocol::HttpProtobuf, "http/protobuf over tcp"),
    ] {
        let (rx, got, calls) = receiver_with(None, Answer::Reject(1)).await;
        let s = start(Some(tracing_by(protocol, "http", rx))).await;
        let tp = format!("00-{TRACE}-{CLIENT_SPAN}-01");
        assert_eq!(send(s.addr, "/partly", &[("traceparent", &tp)]).await, 200);
        spans(&got, 2).await;
        // Each export has one span rejected (the two spans normally travel in one).
        let m = &s.h.runtime.shared.metrics;
        let answered = || m.trace_spans.get(&"rejected") + m.trace_spans.get(&"exported");
        for _ in 0..400 {
            if answered() == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert_eq!(answered(), 2, "{protocol:?}");
        let calls = calls.lock().unwrap().clone();
        assert!(calls.iter().all(|c| c == transport), "{calls:?}");
        assert_eq!(m.trace_spans.get(&"rejected"), calls.len() as u64);
        assert_eq!(m.trace_spans.get(&"failed"), 0);
    }
}
