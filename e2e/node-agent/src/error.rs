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
    #[error("no free Pod IP left in {0} (.2-.199)")]
    NoFreeIp(crate::net::PodCidr),
    #[error("Pod CIDR {cidr} is already used by interface {device} (another agent's bridge?): choose another --pod-cidr")]
    CidrInUse {
        cidr: crate::net::PodCidr,
        device: String,
    },
    #[error("invalid --pod-cidr {0}")]
    PodCidr(String),
    #[error("invalid bridge name {0:?}: use 1-11 characters a-z and 0-9 (derived names must fit 15 bytes)")]
    BridgeName(String),
    #[error("apiserver relay: {0}")]
    Apiserver(String),
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
