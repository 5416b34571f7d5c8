//! HTTP field rules that Sweety's HTTP/1.1 (`sweety-h1`) and HTTP/2 (`sweety-h2`) crates
//! share, kept in one place so that both protocols apply the same rule: which fields may not
//! be trailers.

#![forbid(unsafe_code)]

use http::header::HeaderName;

/// Whether a field may not be sent as a trailer (RFC 9110 §6.5.1): framing, routing,
/// connection-specific and credential fields, which a peer merging trailers into the head
/// would otherwise take as the message's own (hyper's encoder refuses much the same list).
pub fn forbidden_trailer(name: &HeaderName) -> bool {
    use http::header::*;
    [
        CONTENT_LENGTH,
        TRANSFER_ENCODING,
        TRAILER,
        TE,
        CONNECTION,
        UPGRADE,
        HOST,
        AUTHORIZATION,
        PROXY_AUTHORIZATION,
        SET_COOKIE,
        COOKIE,
        CONTENT_ENCODING,
        CONTENT_TYPE,
        CONTENT_RANGE,
        CACHE_CONTROL,
        EXPECT,
        MAX_FORWARDS,
    ]
    .contains(name)
        || name.as_str() == "keep-alive"
        || name.as_str() == "proxy-connection"
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On every standard field name `http` knows, the two spellings of keep-alive and names
    /// no rule lists: exactly the listed 19 are refused.
    #[test]
    fn the_refused_trailers_are_exactly_the_listed_ones() {
        use http::header::*;
        let standard = [
            ACCEPT,
            ACCEPT_CHARSET,
            ACCEPT_ENCODING,
            ACCEPT_LANGUAGE,
            ACCEPT_RANGES,
            ACCESS_CONTROL_ALLOW_CREDENTIALS,
            ACCESS_CONTROL_ALLOW_HEADERS,
            ACCESS_CONTROL_ALLOW_METHODS,
            ACCESS_CONTROL_ALLOW_ORIGIN,
            ACCESS_CONTROL_EXPOSE_HEADERS,
            ACCESS_CONTROL_MAX_AGE,
            ACCESS_CONTROL_REQUEST_HEADERS,
            ACCESS_CONTROL_REQUEST_METHOD,
            AGE,
            ALLOW,
            ALT_SVC,
            AUTHORIZATION,
            CACHE_CONTROL,
            CACHE_STATUS,
            CDN_CACHE_CONTROL,
            CONNECTION,
            CONTENT_DISPOSITION,
            CONTENT_ENCODING,
            CONTENT_LANGUAGE,
            CONTENT_LENGTH,
            CONTENT_LOCATION,
            CONTENT_RANGE,
            CONTENT_SECURITY_POLICY,
            CONTENT_SECURITY_POLICY_REPORT_ONLY,
            CONTENT_TYPE,
            COOKIE,
            DNT,
            DATE,
            ETAG,
            EXPECT,
            EXPIRES,
            FORWARDED,
            FROM,
            HOST,
            IF_MATCH,
            IF_MODIFIED_SINCE,
            IF_NONE_MATCH,
            IF_RANGE,
            IF_UNMODIFIED_SINCE,
            LAST_MODIFIED,
            LINK,
            LOCATION,
            MAX_FORWARDS,
            ORIGIN,
            PRAGMA,
            PROXY_AUTHENTICATE,
            PROXY_AUTHORIZATION,
            PUBLIC_KEY_PINS,
            PUBLIC_KEY_PINS_REPORT_ONLY,
            RANGE,
            REFERER,
            REFERRER_POLICY,
            REFRESH,
            RETRY_AFTER,
            SEC_WEBSOCKET_ACCEPT,
            SEC_WEBSOCKET_EXTENSIONS,
            SEC_WEBSOCKET_KEY,
            SEC_WEBSOCKET_PROTOCOL,
            SEC_WEBSOCKET_VERSION,
            SERVER,
            SET_COOKIE,
            STRICT_TRANSPORT_SECURITY,
            TE,
            TRAILER,
            TRANSFER_ENCODING,
            USER_AGENT,
            UPGRADE,
            UPGRADE_INSECURE_REQUESTS,
            VARY,
            VIA,
            WARNING,
            WWW_AUTHENTICATE,
            X_CONTENT_TYPE_OPTIONS,
            X_DNS_PREFETCH_CONTROL,
            X_FRAME_OPTIONS,
            X_XSS_PROTECTION,
        ];
        let others = [
            "keep-alive",
            "proxy-connection",
            "grpc-status",
            "grpc-message",
            "x-a",
        ];
        let refused: Vec<String> = standard
            .into_iter()
            .chain(others.into_iter().map(HeaderName::from_static))
            .filter(forbidden_trailer)
            .map(|n| n.as_str().to_owned())
            .collect();
        assert_eq!(
            refused,
            [
                "authorization",
                "cache-control",
                "connection",
                "content-encoding",
                "content-length",
                "content-range",
                "content-type",
                "cookie",
                "expect",
                "host",
                "max-forwards",
                "proxy-authorization",
                "set-cookie",
                "te",
                "trailer",
                "transfer-encoding",
                "upgrade",
                "keep-alive",
                "proxy-connection",
            ]
        );
    }
}
