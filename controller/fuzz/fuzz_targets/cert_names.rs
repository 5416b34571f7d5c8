//! Certificate names of a tenant's TLS Secret and RFC 6125 matching
//! (`controller/src/translate/cert_names.rs`). Input: a big-endian u16 length, that many
//! `tls.crt` bytes, then `\n`-separated certificate names, `\0`, and a hostname; the
//! `tls.crt` part is tried as given (PEM text) and, base64-wrapped as a PEM CERTIFICATE block,
//! as DER.
//! Checks: no panic; `dns_names` gives lower-case names without a trailing dot; `covers`
//! ignores case and a trailing dot of the host; a covered host equals one of the names, or is
//! exactly one non-wildcard label under a `*.` name (never the bare suffix, never two labels).

#![no_main]

#[path = "../../src/translate/cert_names.rs"]
#[allow(dead_code)]
mod cert_names;

use libfuzzer_sys::fuzz_target;

/// Standard base64 with padding (the PEM body), for the DER form of the input.
fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn check_names(names: &[String]) {
    for n in names {
        assert_eq!(n, &n.to_ascii_lowercase(), "{n:?}");
        assert!(!n.ends_with('.'), "{n:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((len, rest)) = data.split_first_chunk::<2>() else {
        return;
    };
    let (crt, rest) = rest.split_at((u16::from_be_bytes(*len) as usize).min(rest.len()));
    let mut parts = rest.splitn(2, |&b| b == 0);
    let names = parts.next().unwrap_or_default();
    let host = parts.next().unwrap_or_default();

    if let Ok(pem) = std::str::from_utf8(crt) {
        if let Ok(n) = cert_names::dns_names(pem) {
            check_names(&n);
        }
    }
    let der_pem = format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        base64(crt)
    );
    if let Ok(n) = cert_names::dns_names(&der_pem) {
        check_names(&n);
    }

    let (Ok(names), Ok(host)) = (std::str::from_utf8(names), std::str::from_utf8(host)) else {
        return;
    };
    // As `dns_names` hands them over: lower case, no trailing dot.
    let names: Vec<String> = names
        .split('\n')
        .map(|n| n.trim_end_matches('.').to_ascii_lowercase())
        .collect();
    let covered = cert_names::covers(&names, host);
    assert_eq!(
        covered,
        cert_names::covers(&names, &host.to_ascii_uppercase())
    );
    assert_eq!(covered, cert_names::covers(&names, &format!("{host}.")));
    if covered {
        let h = host.trim_end_matches('.').to_ascii_lowercase();
        let ok = names.iter().any(|n| {
            *n == h
                || n.strip_prefix("*.").is_some_and(|suffix| {
                    !suffix.is_empty()
                        && !suffix.contains('*')
                        && h.split_once('.').is_some_and(|(first, rest)| {
                            rest == suffix && !first.is_empty() && !first.contains('*')
                        })
                })
        });
        assert!(ok, "{names:?} covers {host:?}");
    }
});
