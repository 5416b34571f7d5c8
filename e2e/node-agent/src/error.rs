//! The crate's error type.

/// Everything that can go wrong in the node agent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API call failed: {context}")]
    Kube {
        context: String,
        #[source]
        source: kube::Error,
    },
    #[error("`{command}` failed: {stderr}")]
    Command { command: String, stderr: String },
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid --image-map entry {0:?} (expected SUBSTRING=/path/to/binary)")]
    ImageMap(String),
    #[error("no free Pod IP left in 10.244.0.2-10.244.0.199")]
    NoFreeIp,
    #[error("generating the kubelet API certificate")]
    Cert(#[source] rcgen::Error),
    #[error("kubelet API TLS setup")]
    Tls(#[source] rustls::Error),
    #[error("volume {volume}: {message}")]
    Volume { volume: String, message: String },
    #[error("container {container}: {message}")]
    Container { container: String, message: String },
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
