//! access_log (in progress).
