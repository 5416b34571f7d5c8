//! Reading an OTLP receiver's answer (untrusted input; fuzzed by `fuzz/fuzz_targets/otlp_reply.rs`).
//!
//! * gRPC ([`grpc_status`], [`grpc_message_text`], [`grpc_unary_message`]): the call's outcome
//!   is the `grpc-status` of the trailers (or of the head, in a trailers-only answer), a decimal
//!   code; `grpc-message` is percent-encoded text. A unary answer's body is exactly one
//!   length-prefixed message: a flag byte (0: not compressed; we never offer compression, so a
//!   compressed message is refused), a 4-byte big-endian length, the message.
//! * Both transports ([`partial_success`]): the message is an `ExportTraceServiceResponse`; its
//!   `partial_success.rejected_spans` counts spans the receiver accepted the request for but
//!   dropped (OTLP: a partial success is answered with success and must not be retried).
//!
//! Every reader returns `None` for what it cannot read; nothing here panics or allocates more
//! than its input.

use super::otlp;
use prost::Message;

/// The longest `grpc-message` kept for logs, in characters.
pub const MAX_GRPC_MESSAGE: usize = 256;

/// The gRPC status code of a `grpc-status` value: 1 to 10 ASCII digits, at most `u32::MAX`.
pub fn grpc_status(v: &[u8]) -> Option<u32> {
    if v.is_empty() || v.len() > 10 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// The text of a `grpc-message` value: percent-decoded, invalid UTF-8 replaced, control
/// characters dropped, cut at [`MAX_GRPC_MESSAGE`] characters.
pub fn grpc_message_text(v: &[u8]) -> String {
    percent_encoding::percent_decode(v)
        .decode_utf8_lossy()
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_GRPC_MESSAGE)
        .collect()
}

/// The one message of a unary gRPC answer body, when `body` is exactly one uncompressed
/// length-prefixed message.
pub fn grpc_unary_message(body: &[u8]) -> Option<&[u8]> {
    let (&flag, rest) = body.split_first()?;
    if flag != 0 || rest.len() < 4 {
        return None;
    }
    let (len, msg) = rest.split_at(4);
    let len = u32::from_be_bytes(len.try_into().ok()?) as usize;
    (msg.len() == len).then_some(msg)
}

/// What an `ExportTraceServiceResponse` says about rejected spans: `(rejected_spans,
/// error_message)` (a negative count reads as 0), or `None` when `msg` is not one. An empty
/// message is a full success: `(0, "")`.
pub fn partial_success(msg: &[u8]) -> Option<(u64, String)> {
    let r = otlp::ExportTraceServiceResponse::decode(msg).ok()?;
    let p = r.partial_success.unwrap_or_default();
    let text = p
        .error_message
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_GRPC_MESSAGE)
        .collect();
    Some((u64::try_from(p.rejected_spans).unwrap_or(0), text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frame(flag: u8, msg: &[u8]) -> Vec<u8> {
        let mut v = vec![flag];
        v.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        v.extend_from_slice(msg);
        v
    }

    fn response(rejected: i64, text: &str) -> Vec<u8> {
        otlp::ExportTraceServiceResponse {
            partial_success: Some(otlp::ExportTracePartialSuccess {
                rejected_spans: rejected,
                error_message: text.into(),
            }),
        }
        .encode_to_vec()
    }

    #[test]
    fn statuses() {
        assert_eq!(grpc_status(b"0"), Some(0));
        assert_eq!(grpc_status(b"14"), Some(14));
        assert_eq!(grpc_status(b"4294967295"), Some(u32::MAX));
        for bad in [
            &b""[..],
            b"-1",
            b"1 ",
            b"0x1",
            b"4294967296",
            b"99999999999",
        ] {
            assert_eq!(grpc_status(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn messages_are_decoded_and_bounded() {
        assert_eq!(grpc_message_text(b"no%20collector"), "no collector");
        assert_eq!(grpc_message_text(b"caf%C3%A9%0A!"), "café!");
        assert_eq!(grpc_message_text(b"%FF"), "\u{fffd}");
        assert_eq!(grpc_message_text(b"100%"), "100%");
        assert_eq!(grpc_message_text(&[b'a'; 1000]).len(), MAX_GRPC_MESSAGE);
    }

    #[test]
    fn unary_bodies() {
        assert_eq!(grpc_unary_message(&frame(0, b"abc")), Some(&b"abc"[..]));
        assert_eq!(grpc_unary_message(&frame(0, b"")), Some(&b""[..]));
        assert_eq!(grpc_unary_message(&frame(1, b"abc")), None, "compressed");
        assert_eq!(grpc_unary_message(b""), None, "no message");
        assert_eq!(grpc_unary_message(&[0, 0, 0, 0]), None, "short prefix");
        let mut two = frame(0, b"a");
        two.extend(frame(0, b"b"));
        assert_eq!(grpc_unary_message(&two), None, "two messages");
        assert_eq!(
            grpc_unary_message(&frame(0, b"abc")[..7]),
            None,
            "cut short"
        );
    }

    #[test]
    fn partial_successes() {
        assert_eq!(partial_success(b""), Some((0, String::new())));
        assert_eq!(
            partial_success(&response(3, "too old")),
            Some((3, "too old".into()))
        );
        assert_eq!(partial_success(&response(-5, "")), Some((0, String::new())));
        assert_eq!(
            partial_success(&response(0, "a warning")),
            Some((0, "a warning".into()))
        );
        assert_eq!(partial_success(&[0x0a, 0x05, 0x08]), None, "cut short");
    }

    proptest! {
        #[test]
        fn any_status_value_reads_back(code: u32) {
            prop_assert_eq!(grpc_status(code.to_string().as_bytes()), Some(code));
        }

        #[test]
        fn a_framed_message_is_found_again(msg in proptest::collection::vec(any::<u8>(), 0..512)) {
            let framed = frame(0, &msg);
            prop_assert_eq!(grpc_unary_message(&framed), Some(&msg[..]));
        }

        #[test]
        fn a_response_reads_back(rejected in 0i64..i64::MAX, text in "[ -~]{0,300}") {
            let (n, t) = partial_success(&response(rejected, &text)).unwrap();
            prop_assert_eq!(n, rejected as u64);
            prop_assert_eq!(t.as_str(), &text[..text.len().min(MAX_GRPC_MESSAGE)]);
        }

        #[test]
        fn encoded_messages_decode(text in "\\PC{0,100}") {
            let encoded = crate::grpc::encode_message(&text);
            prop_assert_eq!(grpc_message_text(encoded.as_bytes()), text);
        }

        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = grpc_status(&b);
            prop_assert!(grpc_message_text(&b).chars().count() <= MAX_GRPC_MESSAGE);
            if let Some(m) = grpc_unary_message(&b) {
                prop_assert_eq!(m.len() + 5, b.len());
            }
            let _ = partial_success(&b);
        }
    }
}
