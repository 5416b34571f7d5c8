//! limits (in progress).
