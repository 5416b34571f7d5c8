//! The rewritten request head of a proxied request, prepared once and used by every try: an
//! HTTP/1.1 backend connection writes its request head straight from these fields
//! (`pool::Conn::send_head`, no copy of the map); for HTTP/2 and upgrades it is turned into a
//! request ([`Head::build`]: absolute URI for HTTP/2, origin-form URI and Host for HTTP/1.1).

use super::forward;
use crate::body::Body;
use crate::ctx::RequestCtx;
use crate::filters::modify_headers;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Uri, Version};
use sweety_config::{Filter, WeightedBackend};
use sweety_h1::client::head::ExtraFields;

/// Bytes the forwarding fields' lines take for an IPv4 client and a short host.
const FORWARDING_ROOM: usize = 192;

/// The rewritten request head, reused for every try.
#[derive(Debug)]
pub(super) struct Head {
    pub(super) method: Method,
    pub(super) uri: Uri,
    pub(super) headers: HeaderMap,
    /// Host / :authority for the backend; `None`: the endpoint address.
    pub(super) host: Option<HeaderValue>,
    /// The forwarding fields, when they are not in `headers`: written by the HTTP/1.1
    /// client after the map's fields ([`forward::write_forwarding_fields`]).
    pub(super) forwarding: ExtraFields,
}

impl Head {
    /// The head of a request for `wb`'s backend. `h1`: the backend speaks HTTP/1.1 and the
    /// head goes through [`Head::build`] or Sweety's HTTP/1.1 client only (`pool::Conn::send_head`);
    /// the forwarding fields are then kept out of the map (in [`Head::forwarding`]) unless a
    /// request header filter of the backend may read or change them.
    pub(super) fn prepare(
        parts: http::request::Parts,
        ctx: &RequestCtx,
        wb: Option<&WeightedBackend>,
        h1: bool,
    ) -> Head {
        let original_host = forward::client_host(&parts.headers, &parts.uri);
        let mut headers = parts.headers;
        forward::strip_hop_by_hop(&mut headers);
        forward::join_cookies(&mut headers);
        let filters = wb.map(|w| w.filters.as_slice()).unwrap_or_default();
        let header_filters = filters
            .iter()
            .any(|f| matches!(f, Filter::RequestHeaders(_)));
        let mut forwarding = ExtraFields::default();
        if h1 && !header_filters {
            forwarding = forward::forwarding_lines(
                &mut headers,
                &ctx.conn.forwarding,
                FORWARDING_ROOM,
                ctx.conn.peer.ip(),
                ctx.scheme(),
                original_host.as_ref(),
            );
        } else {
            forward::add_forwarding_headers_cached(
                &mut headers,
                &ctx.conn.forwarding,
                ctx.conn.peer.ip(),
                ctx.scheme(),
                original_host.as_ref(),
            );
        }
        let mut filtered = false;
        for f in filters {
            if let Filter::RequestHeaders(m) = f {
                modify_headers(&mut headers, m);
                filtered = true;
            }
        }
        // A per-backend filter may have set Host; otherwise the client's host is kept (without
        // a filter the map's Host is the one `original_host` was taken from, when it has one).
        let host = if filtered {
            headers.get(header::HOST).cloned().or(original_host)
        } else {
            original_host
        };
        Head {
            method: parts.method,
            uri: parts.uri,
            headers,
            host,
            forwarding,
        }
    }

    /// The fields for a backend that takes a map (HTTP/2 clients, [`Head::build`]): the map
    /// with the forwarding fields in it (a copy, when they were kept out of it).
    pub(super) fn map(&self) -> std::borrow::Cow<'_, HeaderMap> {
        if self.forwarding.is_empty() {
            return std::borrow::Cow::Borrowed(&self.headers);
        }
        let mut h = self.headers.clone();
        for (name, value) in self.forwarding.iter() {
            // Checked as they were written: both parse.
            if let (Ok(n), Ok(v)) = (
                http::HeaderName::from_bytes(name),
                HeaderValue::from_bytes(value),
            ) {
                h.append(n, v);
            }
        }
        std::borrow::Cow::Owned(h)
    }

    /// The request for one try to `addr` over HTTP/1.1 (`h2 == false`) or HTTP/2.
    pub(super) fn build(&self, body: Body, addr: &str, h2: bool, tls: bool) -> Request<Body> {
        let path = self.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        let host = self
            .host
            .clone()
            .or_else(|| HeaderValue::from_str(addr).ok());
        let mut req = Request::new(body);
        *req.method_mut() = self.method.clone();
        *req.headers_mut() = self.map().into_owned();
        if h2 {
            *req.version_mut() = Version::HTTP_2;
            req.headers_mut().remove(header::HOST);
            let scheme = if tls { "https" } else { "http" };
            let authority = host
                .as_ref()
                .and_then(|h| h.to_str().ok())
                .filter(|h| h.parse::<http::uri::Authority>().is_ok())
                .unwrap_or(addr);
            *req.uri_mut() = format!("{scheme}://{authority}{path}")
                .parse()
                .unwrap_or_else(|_| Uri::from_static("/"));
        } else {
            *req.version_mut() = Version::HTTP_11;
            *req.uri_mut() = path.parse().unwrap_or_else(|_| Uri::from_static("/"));
            if let Some(h) = host {
                req.headers_mut().insert(header::HOST, h);
            }
        }
        req
    }
}
