//! The crate's error type.

/// What can go wrong in an e2e step.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API request failed.
    #[error("kubernetes API: {context}")]
    Kube {
        /// What the step was doing (object and verb).
        context: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// A file or process operation failed.
    #[error("{context}")]
    Io {
        /// What the step was doing.
        context: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A condition the test waits for did not come in time.
    #[error("timed out after {secs}s waiting for {what}; last: {last}")]
    Timeout {
        /// The condition, in words.
        what: String,
        /// How long the test waited.
        secs: u64,
        /// The last value seen (what was there instead).
        last: String,
    },
    /// The environment (kubeconfig, SWEETY_E2E_* variables) is missing or invalid.
    #[error("configuration: {0}")]
    Config(String),
    /// A load-balancer address outside the networks the run may send traffic to.
    #[error("refusing to send traffic to {0}: not inside SWEETY_E2E_ALLOWED_CIDR")]
    NotAllowed(std::net::IpAddr),
    /// An HTTP client could not complete a request (no response at all).
    #[error("{client} request failed: {message}")]
    Request {
        /// Which client: "curl" or "h3".
        client: &'static str,
        /// What it reported.
        message: String,
    },
    /// The test CA or leaf certificate could not be made.
    #[error("generating test certificates")]
    Cert(#[source] rcgen::Error),
    /// A container the test wanted to kill and see restarted could not be found or stopped.
    #[error("restarting container {container}: {message}")]
    Restart {
        /// The container's name.
        container: String,
        /// What went wrong.
        message: String,
    },
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
