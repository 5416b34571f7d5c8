//! Sweety's own server-side HTTP/2 (RFC 9113) connection layer, used for h2 (TLS with ALPN)
//! and h2c (prior knowledge) connections when `limits.http2_engine` is `sweety` (hyper
//! serves them when it is `hyper`). HTTP/1.1 stays on hyper.
//!
//! * [`frame`]: frame header, types, flags, error codes, SETTINGS, frame writers.
//! * [`body`]: request bodies fed from DATA frames, the stream-to-connection wake-up path,
//!   and extended CONNECT (RFC 8441) tunnels.
//! * [`conn`]: the connection driver: state machine, flow control, limits, batching.
//!
//! Headers are (de)compressed by [`crate::hpack`]; every request goes through
//! `pipeline::handle` like on every other protocol.

pub mod body;
pub mod conn;
pub mod frame;

pub use body::{Upgrade, Upgraded};
pub use conn::{serve, H2Error, Settings};

/// The `date` response header value, formatted once per second per thread.
pub(crate) mod date {
    use http::HeaderValue;
    use std::cell::RefCell;
    use std::time::{SystemTime, UNIX_EPOCH};

    thread_local! {
        static CACHED: RefCell<(u64, Option<HeaderValue>)> = const { RefCell::new((0, None)) };
    }

    /// The current time as an HTTP date.
    pub fn now() -> HeaderValue {
        let now = SystemTime::now();
        let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        CACHED.with(|c| {
            let mut c = c.borrow_mut();
            if c.0 != secs || c.1.is_none() {
                let v = HeaderValue::from_str(&httpdate::fmt_http_date(now))
                    .expect("an HTTP date is a valid header value");
                *c = (secs, Some(v));
            }
            c.1.clone().expect("set above")
        })
    }

    #[cfg(test)]
    #[test]
    fn dates_are_http_dates() {
        let v = now();
        assert!(httpdate::parse_http_date(v.to_str().unwrap()).is_ok());
    }
}
