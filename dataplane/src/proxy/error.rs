//! Proxy errors: what went wrong talking to a backend, where it came from, whether a retry is
//! safe, which metrics label counts it and which reply the client gets.

use crate::body::{text_response, Body, BoxError};
use http::{Response, StatusCode};
use std::time::Duration;

/// Where an error came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorOrigin {
    /// The backend (or the network towards it) misbehaved.
    Upstream,
    /// Our own configuration or state (no backend, no endpoint, a local limit reached).
    Internal,
}

/// An error forwarding one try of a request to a backend.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The TCP connection could not be opened, or a pooled connection closed before the request
    /// was written. No byte of the request was sent.
    #[error("connect to {addr} failed")]
    Connect {
        /// Endpoint address.
        addr: String,
        /// The cause.
        #[source]
        source: BoxError,
    },
    /// Opening the connection (TCP and TLS handshake) took longer than allowed.
    #[error("connect to {addr} timed out after {after:?}")]
    ConnectTimeout {
        /// Endpoint address.
        addr: String,
        /// The limit that elapsed.
        after: Duration,
    },
    /// The HTTP/2 connection this request waited for, which another request was opening for
    /// both, failed (`after` none) or was not open within this request's connect timeout
    /// (`after`). No byte of the request was sent. The endpoint's failure is counted once,
    /// on the request that opened the connection, so this one never counts towards outlier
    /// ejection.
    #[error("connect to {addr} failed: the connection this request waited for did not open")]
    ConnectWaited {
        /// Endpoint address.
        addr: String,
        /// The limit that elapsed, when it was the wait that ended it.
        after: Option<Duration>,
    },
    /// The TLS handshake failed (certificate not trusted, wrong name, no common ALPN…).
    #[error("TLS handshake with {addr} failed")]
    Tls {
        /// Endpoint address.
        addr: String,
        /// The cause.
        #[source]
        source: BoxError,
    },
    /// No response head arrived within the route's backend timeout.
    #[error("{addr} did not answer within {after:?}")]
    Timeout {
        /// Endpoint address.
        addr: String,
        /// The limit that elapsed.
        after: Duration,
    },
    /// The backend broke the protocol or closed the connection after the request was sent.
    #[error("protocol error talking to {addr}")]
    Protocol {
        /// Endpoint address.
        addr: String,
        /// The cause.
        #[source]
        source: BoxError,
    },
    /// The backend has no endpoint that may receive traffic.
    #[error("backend {backend:?} has no endpoint")]
    NoEndpoint {
        /// Backend name.
        backend: String,
    },
    /// No backend could be chosen (all weights zero, or an unknown backend name).
    #[error("no backend: {reason}")]
    NoBackend {
        /// Why.
        reason: String,
    },
    /// A limit of our own towards the endpoint is reached (every HTTP/2 connection the pool
    /// may hold to it is open and none has room). No byte of the request was sent and the
    /// endpoint did nothing wrong: it never counts towards outlier ejection.
    #[error("local limit towards {addr}: {reason}")]
    LocalOverload {
        /// Endpoint address.
        addr: String,
        /// Which limit.
        reason: &'static str,
    },
}

impl ProxyError {
    /// Label under which `Metrics::upstream_error` counts this error.
    pub fn metrics_label(&self) -> &'static str {
        match self {
            ProxyError::Connect { .. } => "connect",
            ProxyError::ConnectTimeout { .. }
            | ProxyError::ConnectWaited { after: Some(_), .. } => "connect_timeout",
            ProxyError::ConnectWaited { after: None, .. } => "connect",
            ProxyError::Tls { .. } => "tls",
            ProxyError::Timeout { .. } => "timeout",
            ProxyError::Protocol { .. } => "protocol",
            ProxyError::NoEndpoint { .. } => "no_endpoint",
            ProxyError::NoBackend { .. } => "no_backend",
            ProxyError::LocalOverload { .. } => "local_overload",
        }
    }

    /// Whether the backend or our own state caused it.
    pub fn origin(&self) -> ErrorOrigin {
        match self {
            ProxyError::NoEndpoint { .. }
            | ProxyError::NoBackend { .. }
            | ProxyError::LocalOverload { .. } => ErrorOrigin::Internal,
            _ => ErrorOrigin::Upstream,
        }
    }

    /// True when no byte of the request reached the backend, so any request may be retried.
    pub fn request_not_sent(&self) -> bool {
        matches!(
            self,
            ProxyError::Connect { .. }
                | ProxyError::ConnectTimeout { .. }
                | ProxyError::ConnectWaited { .. }
                | ProxyError::Tls { .. }
                | ProxyError::LocalOverload { .. }
        )
    }

    /// Whether another try is safe after this error. `replayable` says the request is
    /// idempotent and has no body, so sending it twice is harmless.
    pub fn retry_safe(&self, replayable: bool) -> bool {
        match self {
            ProxyError::Connect { .. }
            | ProxyError::ConnectTimeout { .. }
            | ProxyError::ConnectWaited { .. }
            | ProxyError::Tls { .. }
            | ProxyError::LocalOverload { .. } => true,
            ProxyError::Timeout { .. } | ProxyError::Protocol { .. } => replayable,
            ProxyError::NoEndpoint { .. } | ProxyError::NoBackend { .. } => false,
        }
    }

    /// True when the endpoint misbehaved (counts towards outlier ejection): an upstream error
    /// of this try's own (a shared connection's failure counts on the try that opened it).
    pub fn is_endpoint_failure(&self) -> bool {
        self.origin() == ErrorOrigin::Upstream && !matches!(self, ProxyError::ConnectWaited { .. })
    }

    /// Status code of the reply to the client.
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::Timeout { .. }
            | ProxyError::ConnectTimeout { .. }
            | ProxyError::ConnectWaited { after: Some(_), .. } => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::NoBackend { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            ProxyError::LocalOverload { .. } => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::BAD_GATEWAY,
        }
    }

    /// A short plain-text reply for the client; details stay in logs.
    pub fn to_response(&self) -> Response<Body> {
        let text = match self {
            ProxyError::Connect { .. } | ProxyError::ConnectWaited { after: None, .. } => {
                "502 Bad Gateway: upstream connect error\n"
            }
            ProxyError::ConnectTimeout { .. }
            | ProxyError::ConnectWaited { after: Some(_), .. } => {
                "504 Gateway Timeout: upstream connect timed out\n"
            }
            ProxyError::Tls { .. } => "502 Bad Gateway: upstream TLS handshake failed\n",
            ProxyError::Timeout { .. } => "504 Gateway Timeout: upstream did not answer in time\n",
            ProxyError::Protocol { .. } => "502 Bad Gateway: upstream protocol error\n",
            ProxyError::NoEndpoint { .. } => "502 Bad Gateway: no healthy upstream endpoint\n",
            ProxyError::NoBackend { .. } => "500 Internal Server Error: no backend\n",
            ProxyError::LocalOverload { .. } => {
                "503 Service Unavailable: upstream connection limit reached\n"
            }
        };
        text_response(self.status(), text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<ProxyError> {
        let addr = || "127.0.0.1:1".to_string();
        vec![
            ProxyError::Connect {
                addr: addr(),
                source: "refused".into(),
            },
            ProxyError::ConnectTimeout {
                addr: addr(),
                after: Duration::from_secs(1),
            },
            ProxyError::ConnectWaited {
                addr: addr(),
                after: None,
            },
            ProxyError::ConnectWaited {
                addr: addr(),
                after: Some(Duration::from_secs(1)),
            },
            ProxyError::Tls {
                addr: addr(),
                source: "bad cert".into(),
            },
            ProxyError::Timeout {
                addr: addr(),
                after: Duration::from_secs(1),
            },
            ProxyError::Protocol {
                addr: addr(),
                source: "reset".into(),
            },
            ProxyError::NoEndpoint {
                backend: "b".into(),
            },
            ProxyError::NoBackend {
                reason: "zero weights".into(),
            },
            ProxyError::LocalOverload {
                addr: addr(),
                reason: "h2 connections",
            },
        ]
    }

    #[test]
    fn statuses_labels_and_retry_safety() {
        let table: Vec<(&str, u16, bool, bool, ErrorOrigin)> = all()
            .iter()
            .map(|e| {
                (
                    e.metrics_label(),
                    e.status().as_u16(),
                    e.retry_safe(false),
                    e.retry_safe(true),
                    e.origin(),
                )
            })
            .collect();
        use ErrorOrigin::*;
        assert_eq!(
            table,
            vec![
                ("connect", 502, true, true, Upstream),
                ("connect_timeout", 504, true, true, Upstream),
                ("connect", 502, true, true, Upstream),
                ("connect_timeout", 504, true, true, Upstream),
                ("tls", 502, true, true, Upstream),
                ("timeout", 504, false, true, Upstream),
                ("protocol", 502, false, true, Upstream),
                ("no_endpoint", 502, false, false, Internal),
                ("no_backend", 500, false, false, Internal),
                ("local_overload", 503, true, true, Internal),
            ]
        );
    }

    /// Only the endpoint's own failures count towards its ejection; every error that sent
    /// nothing says so.
    #[test]
    fn endpoint_failures_and_unsent_requests() {
        let table: Vec<(&str, bool, bool)> = all()
            .iter()
            .map(|e| {
                (
                    e.metrics_label(),
                    e.is_endpoint_failure(),
                    e.request_not_sent(),
                )
            })
            .collect();
        assert_eq!(
            table,
            vec![
                ("connect", true, true),
                ("connect_timeout", true, true),
                ("connect", false, true),
                ("connect_timeout", false, true),
                ("tls", true, true),
                ("timeout", true, false),
                ("protocol", true, false),
                ("no_endpoint", false, false),
                ("no_backend", false, false),
                ("local_overload", false, true),
            ]
        );
    }

    #[test]
    fn sources_are_chained() {
        let e = &all()[0];
        assert_eq!(
            std::error::Error::source(e).map(|s| s.to_string()),
            Some("refused".to_string())
        );
        assert_eq!(e.to_response().status(), StatusCode::BAD_GATEWAY);
    }
}
