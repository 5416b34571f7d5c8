//! An OTLP receiver's answer on arbitrary bytes (the first byte picks the reader): a
//! `grpc-status` value reads as a number that formats back to it; a `grpc-message` decodes to
//! bounded text without control characters; a unary gRPC body yields exactly its one framed
//! message; an `ExportTraceServiceResponse` never panics and its rejection text is bounded.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sweety_dataplane::trace::reply::*;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 4 {
        0 => {
            if let Some(code) = grpc_status(rest) {
                assert_eq!(code.to_string().parse::<u32>().ok(), Some(code));
                assert!(rest.iter().all(u8::is_ascii_digit));
            }
        }
        1 => {
            let text = grpc_message_text(rest);
            assert!(text.chars().count() <= MAX_GRPC_MESSAGE);
            assert!(!text.chars().any(char::is_control));
        }
        2 => {
            if let Some(m) = grpc_unary_message(rest) {
                assert_eq!(rest[0], 0);
                assert_eq!(m.len() + 5, rest.len());
                assert_eq!(u32::from_be_bytes(rest[1..5].try_into().unwrap()) as usize, m.len());
            }
        }
        _ => {
            if let Some((_, text)) = grpc_unary_message(rest).and_then(partial_success) {
                assert!(text.chars().count() <= MAX_GRPC_MESSAGE);
            }
            if let Some((_, text)) = partial_success(rest) {
                assert!(text.chars().count() <= MAX_GRPC_MESSAGE);
            }
        }
    }
});
