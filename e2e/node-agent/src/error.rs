//! The crate's error type.

/// Everything that can go wrong in the node agent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API request failed.
    #[error("kubernetes API call failed: {context}")]
    Kube {
        /// What the agent was doing (object and verb).
        context: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// A host command (ip, iptables, ...) exited non-zero.
    #[error("`{command}` failed: {stderr}")]
    Command {
        /// The command line that was run.
        command: String,
        /// What it wrote to stderr.
        stderr: String,
    },
    /// A file, socket or process operation failed.
    #[error("{context}")]
    Io {
        /// What the agent was doing (and on which path).
        context: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// An `--image-map` argument is not `SUBSTRING=/path/to/binary`.
    #[error("invalid --image-map entry {0:?} (expected SUBSTRING=/path/to/binary)")]
    ImageMap(String),
    /// Every Pod address of the node's range is taken.
    #[error("no free Pod IP left in {0} (.2-.199)")]
    NoFreeIp(crate::net::PodCidr),
    /// The Pod range is already routed through another interface of the host.
    #[error("Pod CIDR {cidr} is already used by interface {device} (another agent's bridge?): choose another --pod-cidr")]
    CidrInUse {
        /// The range asked for.
        cidr: crate::net::PodCidr,
        /// The interface that already has it.
        device: String,
    },
    /// `--pod-cidr` is not an IPv4 /24.
    #[error("invalid --pod-cidr {0}")]
    PodCidr(String),
    /// `--bridge` would make interface names longer than Linux allows.
    #[error("invalid bridge name {0:?}: use 1-11 characters a-z and 0-9 (derived names must fit 15 bytes)")]
    BridgeName(String),
    /// The relay Pods use to reach the apiserver could not be set up.
    #[error("apiserver relay: {0}")]
    Apiserver(String),
    /// The kubelet API's self-signed certificate could not be made.
    #[error("generating the kubelet API certificate")]
    Cert(#[source] rcgen::Error),
    /// The kubelet API's TLS server configuration was refused.
    #[error("kubelet API TLS setup")]
    Tls(#[source] rustls::Error),
    /// A Pod volume could not be materialised under the Pod's directory.
    #[error("volume {volume}: {message}")]
    Volume {
        /// The volume's name in the Pod spec.
        volume: String,
        /// What is wrong with it.
        message: String,
    },
    /// A container could not be started or run.
    #[error("container {container}: {message}")]
    Container {
        /// The container's name in the Pod spec.
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
