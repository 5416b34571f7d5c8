//! defaults (in progress).
