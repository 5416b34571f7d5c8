//! The controller's one error type. Binaries wrap it in `anyhow`; the library never does.

/// Everything that can go wrong in the controller library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[source] kube::Error),
    /// A snapshot or golden file could not be parsed.
    #[error("parse {what}: {source}")]
    Parse {
        /// Which input (file name or object) was being parsed.
        what: String,
        /// Where and why the YAML was refused.
        #[source]
        source: serde_yaml::Error,
    },
    /// The shared default certificate could not be made or written (the text says why).
    #[error("default certificate: {0}")]
    DefaultCertificate(String),
    /// Reading or writing a local file or socket failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being read or written (and its path).
        what: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// A short, stable label for metrics (`error_kind`).
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Parse { .. } => "parse",
            Error::Io { .. } => "io",
            Error::DefaultCertificate(_) => "default_certificate",
        }
    }
}
