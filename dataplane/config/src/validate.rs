//! Validation of a whole [`Config`]: every problem is reported, each with the path of the
//! offending field (`virtual_hosts[0].routes[2].matches[0].path.regex: …`).

use crate::Config;
use std::fmt;

/// One validation problem and where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationError {
    /// Path of the field, e.g. `listeners[1].tls.certificates[0].cert`.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Every problem found in a config, in document order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ValidationErrors(pub Vec<ValidationError>);

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} config error(s):", self.0.len())?;
        for e in &self.0 {
            writeln!(f, "  {e}")?;
        }
        Ok(())
    }
}

impl Config {
    /// Checks the whole config and returns every error found.
    pub fn validate(&self) -> Result<(), ValidationErrors> {
        let mut errors = Vec::new();
        if self.version != crate::SCHEMA_VERSION {
            errors.push(ValidationError {
                path: "version".into(),
                message: format!(
                    "unsupported schema version {}, expected {}",
                    self.version,
                    crate::SCHEMA_VERSION
                ),
            });
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ValidationErrors(errors))
        }
    }
}
