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
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
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

/// An OTLP/HTTP receiver: decodes each export, answers 200 with an empty response.
async fn receiver() -> (SocketAddr, Received) {
    let got: Received = Arc::default();
    let g = got.clone();
    let addr = spawn_http_backend(move |req| {
        let got = g.clone();
        async move {
            use http_body_util::BodyExt;
            assert_eq!(req.method(), http::Method::POST);
            assert_eq!(req.uri().path(), "/v1/traces");
            let host = req.headers()["host"].to_str().unwrap();
            assert!(host.starts_with("127.0.0.1:"), "Host: {host}");
            assert_eq!(
                req.headers()["content-type"].as_bytes(),
                b"application/x-protobuf"
            );
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let export = ExportTraceServiceRequest::decode(body).expect("a valid OTLP export");
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
            http::Response::new(Full::new(Bytes::new()))
        }
    })
    .await;
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
