//! Active health checks: one task per endpoint of a backend with `health_check`, sending
//! `GET path` over the backend's own protocol and pool (or, for `type: tcp`, connecting) every
//! `interval`. An endpoint failing
//! `unhealthy_threshold` checks in a row is marked down (skipped by endpoint choice) until it
//! passes `healthy_threshold` in a row. Passive outlier ejection keeps working on top.
//!
//! The down/up state lives with the endpoint and survives reloads; the tasks belong to one
//! config's backend and stop when it is dropped (the next config starts its own).

use super::backend::BackendRt;
use super::head::Head;
use crate::body::empty;
use crate::ctx::{ConnInfo, Protocol, RequestCtx};
use crate::metrics::Metrics;
use http::header::{HeaderValue, HOST};
use http_body_util::BodyExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use sweety_config::HealthCheck;
use tokio::task::AbortHandle;

/// Bytes of a health check response body read at most (the rest is dropped unread).
const MAX_BODY_BYTES: usize = 64 * 1024;

/// The health check tasks of one backend; aborted on drop.
#[derive(Debug, Default)]
pub(super) struct Checks {
    started: AtomicBool,
    tasks: Mutex<Vec<AbortHandle>>,
}

impl Drop for Checks {
    fn drop(&mut self) {
        for t in self
            .tasks
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            t.abort();
        }
    }
}

/// Starts the checks of `backend` once (a no-op without `health_check`). Must be called
/// inside a tokio runtime.
pub(super) fn start(backend: &Arc<BackendRt>, metrics: &Arc<Metrics>) {
    let Some(hc) = backend.config.health_check.clone() else {
        return;
    };
    if backend.checks.started.swap(true, Ordering::AcqRel) {
        return;
    }
    let hc = Arc::new(hc);
    let mut tasks = backend
        .checks
        .tasks
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    for idx in 0..backend.endpoints.len() {
        let task = tokio::spawn(run(
            Arc::downgrade(backend),
            idx,
            hc.clone(),
            metrics.clone(),
        ));
        tasks.push(task.abort_handle());
    }
}

async fn run(weak: Weak<BackendRt>, idx: usize, hc: Arc<HealthCheck>, metrics: Arc<Metrics>) {
    let (mut passes, mut fails) = (0u32, 0u32);
    let ctx = RequestCtx {
        conn: Arc::new(ConnInfo {
            listener: "health-check".into(),
            peer: ([127, 0, 0, 1], 0).into(),
            local: ([127, 0, 0, 1], 0).into(),
            tls: false,
            sni: None,
            client_cert: None,
            client_cert_verdict: Default::default(),
            forwarding: Default::default(),
            tls_version: None,
            tls_cipher: None,
            read_budget: None,
        }),
        protocol: Protocol::Http1,
        start: Instant::now(),
        log: false,
    };
    loop {
        let Some(b) = weak.upgrade() else {
            return;
        };
        let ok = check_once(&b, idx, &hc, &ctx).await;
        // The capped label (`Metrics::backend_label`), not the raw name: no allocation, and
        // pruned with the other per-backend counters.
        let name = b.label.clone();
        metrics
            .health_checks
            .inc(&(name.clone(), if ok { "pass" } else { "fail" }));
        let state = &b.endpoints[idx].state;
        let up = state.hc_up.load(Ordering::Acquire);
        if ok {
            passes = passes.saturating_add(1);
            fails = 0;
            if !up && passes >= hc.healthy_threshold {
                state.hc_up.store(true, Ordering::Release);
                metrics.health_checks.inc(&(name, "up"));
                tracing::info!(backend = %b.config.name, endpoint = %state.address, "health check: endpoint up");
            }
        } else {
            fails = fails.saturating_add(1);
            passes = 0;
            if up && fails >= hc.unhealthy_threshold {
                state.hc_up.store(false, Ordering::Release);
                metrics.health_checks.inc(&(name, "down"));
                tracing::warn!(backend = %b.config.name, endpoint = %state.address, "health check: endpoint down");
            }
        }
        drop(b);
        tokio::time::sleep(hc.interval.get()).await;
    }
}

/// One check within `timeout`: a GET passing when the status is in the expected range, or a
/// TCP connect.
async fn check_once(b: &BackendRt, idx: usize, hc: &HealthCheck, ctx: &RequestCtx) -> bool {
    let timeout = hc.timeout.get();
    if hc.kind == sweety_config::HealthCheckKind::Tcp {
        let addr = b.endpoints[idx].state.address.as_str();
        return matches!(
            tokio::time::timeout(
                timeout,
                super::pool::connect_tcp(addr, b.connector.external)
            )
            .await,
            Ok(Ok(_))
        );
    }
    let mut req = http::Request::get(hc.path.as_str());
    if let Some(h) = hc
        .host
        .as_deref()
        .and_then(|h| HeaderValue::from_str(h).ok())
    {
        req = req.header(HOST, h);
    }
    let Ok(req) = req.body(()) else {
        return false;
    };
    let (parts, ()) = req.into_parts();
    let head = Head::prepare(parts, ctx, None, false);
    let run = async {
        let none = bytes::Bytes::new();
        let timeouts = sweety_config::Timeouts {
            backend: Some(sweety_config::Duration(timeout)),
            ..Default::default()
        };
        let (res, _) = b
            .try_once(idx, &head, empty(), &timeouts, Some(&none), None)
            .await;
        let Ok(resp) = res else {
            return false;
        };
        let status = resp.status().as_u16();
        let mut body = resp.into_body();
        let mut read = 0usize;
        while read < MAX_BODY_BYTES {
            match body.frame().await {
                Some(Ok(f)) => read += f.data_ref().map_or(0, |d| d.len()),
                Some(Err(_)) => return false,
                None => break,
            }
        }
        (hc.expected_status_min..=hc.expected_status_max).contains(&status)
    };
    tokio::time::timeout(timeout + Duration::from_millis(50), run)
        .await
        .unwrap_or(false)
}
