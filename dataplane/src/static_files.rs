//! The static-file handler: GET/HEAD, Range, conditionals, precompressed siblings,
//! try_files/SPA fallback, traversal protection, bounded streaming and a small hot-file cache.
//!
//! STUB: interface fixed, implementation pending (static helper).

use crate::body::{text_response, Body};
use http::{Response, StatusCode};
use sweety_config::StaticSite;

/// The static-file handler, shared by all routes; owns the small-file cache.
#[derive(Debug)]
pub struct StaticFiles {
    _cache_max_bytes: usize,
}

impl StaticFiles {
    /// A handler whose in-memory cache holds at most `cache_max_bytes` of small files.
    pub fn new(cache_max_bytes: usize) -> StaticFiles {
        StaticFiles {
            _cache_max_bytes: cache_max_bytes,
        }
    }

    /// Serves `req` (its path after any rewrite) from `site`.
    pub async fn serve(&self, site: &StaticSite, req: &http::request::Parts) -> Response<Body> {
        let _ = (site, req);
        text_response(
            StatusCode::NOT_IMPLEMENTED,
            "static files not implemented\n",
        )
    }
}
