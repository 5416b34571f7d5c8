//! A client certificate's DER (what any TLS client may send) through the code that turns it
//! into the `ssl-client-*` headers a backend receives: `subject_and_issuer` and `escaped_pem`
//! never panic; the subject and issuer are valid header values with no control character
//! (nothing a client writes in its certificate can end the header or add one); the escaped PEM
//! keeps only unreserved bytes and `%XX`.
#![no_main]

use http::HeaderValue;
use libfuzzer_sys::fuzz_target;
use rustls_pki_types::CertificateDer;
use sweety_dataplane::client_cert::{escaped_pem, subject_and_issuer};

fuzz_target!(|data: &[u8]| {
    let der = CertificateDer::from(data);
    if let Some((subject, issuer)) = subject_and_issuer(&der) {
        for dn in [&subject, &issuer] {
            assert!(!dn.chars().any(char::is_control), "{dn:?}");
            assert!(HeaderValue::from_str(dn).is_ok(), "{dn:?}");
        }
    }
    let pem = escaped_pem(&der);
    assert!(pem
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._~%".contains(&b)));
    assert!(HeaderValue::from_str(&pem).is_ok());
});
