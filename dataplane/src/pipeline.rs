//! pipeline (in progress).
