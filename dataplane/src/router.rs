//! The route table: built once per config from [`sweety_config::Config`], then matched per
//! request with Gateway API precedence. Pure: no I/O, no clock, no globals.
//!
//! STUB: interface fixed, implementation pending (router helper).

use crate::filters::CompiledFilters;
use std::sync::Arc;
use sweety_config::{Config, Route};

/// One route of the table, with its compiled filters.
#[derive(Debug)]
pub struct RouteEntry {
    /// Route name (for metrics and logs).
    pub name: Arc<str>,
    /// Name of the virtual host it belongs to.
    pub vhost: Arc<str>,
    /// The route as configured.
    pub route: Arc<Route>,
    /// Its filters, compiled.
    pub filters: CompiledFilters,
}

/// The parts of a request that routing looks at.
#[derive(Debug)]
pub struct RequestHead<'a> {
    /// Listener name the request arrived on.
    pub listener: &'a str,
    /// Host without port, lower-cased (from `:authority` or `Host`).
    pub host: &'a str,
    /// Method.
    pub method: &'a http::Method,
    /// Path (no query), as received.
    pub path: &'a str,
    /// Raw query string, if any.
    pub query: Option<&'a str>,
    /// Request headers.
    pub headers: &'a http::HeaderMap,
}

/// A successful match.
#[derive(Debug, Clone, Copy)]
pub struct Matched<'a> {
    /// The route.
    pub entry: &'a RouteEntry,
    /// The prefix that a `prefix` path match matched (for prefix rewrites and redirects).
    pub prefix: Option<&'a str>,
}

/// Result of a lookup.
#[derive(Debug, Clone, Copy)]
pub enum Lookup<'a> {
    /// A route matched.
    Matched(Matched<'a>),
    /// No virtual host on this listener serves the host.
    NoHost,
    /// A virtual host matched but none of its routes did.
    NoRoute,
}

/// Errors building the table (invalid regexes and filters).
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct BuildError {
    /// Config path of the offending field.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

/// The immutable route table.
#[derive(Debug, Default)]
pub struct RouteTable {
    entries: Vec<RouteEntry>,
}

impl RouteTable {
    /// Builds the table from a (validated) config.
    pub fn build(cfg: &Config) -> Result<RouteTable, BuildError> {
        let mut entries = Vec::new();
        for vh in &cfg.virtual_hosts {
            for r in &vh.routes {
                entries.push(RouteEntry {
                    name: r.name.as_str().into(),
                    vhost: vh.name.as_str().into(),
                    route: Arc::new(r.clone()),
                    filters: CompiledFilters::compile(&r.filters).map_err(|message| {
                        BuildError {
                            path: format!("virtual_hosts.{}.routes.{}.filters", vh.name, r.name),
                            message,
                        }
                    })?,
                });
            }
        }
        Ok(RouteTable { entries })
    }

    /// Finds the route for a request.
    pub fn lookup<'a>(&'a self, _req: &RequestHead<'_>) -> Lookup<'a> {
        match self.entries.first() {
            Some(e) => Lookup::Matched(Matched {
                entry: e,
                prefix: None,
            }),
            None => Lookup::NoHost,
        }
    }

    /// The index of the virtual host that would serve `host` on `listener`, used to detect
    /// misdirected requests (Host served by another vhost than the TLS SNI).
    pub fn vhost_index(&self, _listener: &str, _host: &str) -> Option<usize> {
        None
    }
}
