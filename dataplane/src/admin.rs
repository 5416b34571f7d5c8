//! admin (in progress).
