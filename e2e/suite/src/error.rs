//! The crate's error type.

/// What can go wrong in an e2e step.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {context}")]
    Kube {
        context: String,
        #[source]
        source: kube::Error,
    },
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("timed out after {secs}s waiting for {what}; last: {last}")]
    Timeout {
        what: String,
        secs: u64,
        last: String,
    },
    #[error("configuration: {0}")]
    Config(String),
    #[error("refusing to send traffic to {0}: not inside SWEETY_E2E_ALLOWED_CIDR")]
    NotAllowed(std::net::IpAddr),
    #[error("{client} request failed: {message}")]
    Request {
        client: &'static str,
        message: String,
    },
    #[error("generating test certificates")]
    Cert(#[source] rcgen::Error),
    #[error("restarting container {container}: {message}")]
    Restart { container: String, message: String },
}

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wraps a kube error with what was being done.
    pub fn kube(context: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let context = context.into();
        move |source| Error::Kube { context, source }
    }

    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let context = context.into();
        move |source| Error::Io { context, source }
    }
}
