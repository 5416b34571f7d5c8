//! The `conn_driver` fuzz target's committed seeds, run through the target's own harness
//! (`fuzz/harness/conn_driver.rs`): each seed must get past the preface and reach the
//! driver's request paths (a response HEADERS with the expected status and body), so the
//! fuzzer starts from inputs that exercise streams, not from ones that die at the preface.

#[path = "../fuzz/harness/conn_driver.rs"]
mod harness;

use sweety_h2::frame::{kind, Head, HEADER_LEN};
use sweety_h2::hpack::Decoder;

/// A response the server wrote: stream, `:status`, and the DATA bytes of the stream.
#[derive(Debug, PartialEq)]
struct Answer {
    stream: u32,
    status: String,
    body: String,
}

/// The responses in what the server wrote, in the order their HEADERS came.
fn answers(mut out: &[u8]) -> (Vec<Answer>, Vec<u8>) {
    let mut answers: Vec<Answer> = Vec::new();
    let mut kinds = Vec::new();
    let mut dec = Decoder::new();
    while out.len() >= HEADER_LEN {
        let h = Head::parse(out);
        let payload = &out[HEADER_LEN..HEADER_LEN + h.len as usize];
        out = &out[HEADER_LEN + h.len as usize..];
        kinds.push(h.kind);
        if h.kind == kind::HEADERS {
            let mut status = String::new();
            dec.decode(payload, usize::MAX, |f| {
                if f.name == b":status" {
                    status = String::from_utf8_lossy(f.value).into_owned();
                }
            })
            .expect("the server's header block decodes");
            answers.push(Answer {
                stream: h.stream,
                status,
                body: String::new(),
            });
        } else if h.kind == kind::DATA {
            let a = answers
                .iter_mut()
                .find(|a| a.stream == h.stream)
                .expect("DATA after its HEADERS");
            a.body.push_str(&String::from_utf8_lossy(payload));
        }
    }
    (answers, kinds)
}

/// `(stream, status, body)` per response.
fn summary(answers: &[Answer]) -> Vec<(u32, &str, &str)> {
    answers
        .iter()
        .map(|a| (a.stream, a.status.as_str(), a.body.as_str()))
        .collect()
}

#[test]
fn every_conn_driver_seed_reaches_the_request_paths() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/seeds/conn_driver");
    let mut seeds: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    seeds.sort();
    assert_eq!(seeds.len(), 9, "a new seed gets its expectation below");
    for path in seeds {
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        let out = harness::run(&std::fs::read(&path).unwrap());
        let (answers, kinds) = answers(&out);
        let got = summary(&answers);
        match name.as_str() {
            // The preface and SETTINGS written out in the seed (option bit 0 clear).
            "full_preface_get" => assert_eq!(got, [(1, "200", "0")], "{name}"),
            // Two requests after the harness's preface; one header block cut by CONTINUATION;
            // a padded HEADERS with priority fields.
            "get_after_preface" => {
                assert_eq!(got, [(1, "200", "0"), (3, "200", "0")], "{name}")
            }
            "continuation" | "padded_priority" => assert_eq!(got, [(1, "200", "0")], "{name}"),
            // The two GETs followed by the client's EOF (option bit 3): both were answered in
            // their first poll, before the EOF was read, and are sent.
            "get_after_preface_eof" => {
                assert_eq!(got, [(1, "200", "0"), (3, "200", "0")], "{name}")
            }
            // The POST, its body and trailers in one read, then the client's EOF: the
            // request's first poll comes after the read's frames (`Driver::first_polls`), the
            // body is whole by then, so it is answered before the EOF is read, and sent. (A
            // future still waiting at the EOF is cancelled: the conn test
            // the_clients_eof_or_read_error_drops_the_waiting_futures.)
            "post_body_trailers_eof" => assert_eq!(got, [(1, "200", "5")], "{name}"),
            // A 5-byte body and trailers: the service read the body.
            "post_body_trailers" => assert_eq!(got, [(1, "200", "5")], "{name}"),
            // An extended CONNECT (RFC 8441) the driver accepted as a tunnel.
            "extended_connect" => {
                assert_eq!(got.len(), 1, "{name}: {got:?}");
                assert_eq!((got[0].0, got[0].1), (1, "200"), "{name}");
            }
            // The request is reset before it is answered; the PING is answered (an ACK).
            "reset_and_window" => {
                assert!(got.is_empty(), "{name}: {got:?}");
                assert!(kinds.contains(&kind::PING), "{name}: {kinds:?}");
            }
            other => panic!("seed {other} has no expectation here"),
        }
    }
}
