//! Which hostnames a certificate may serve: the DNS names of its subjectAltName extension and
//! RFC 6125 matching (§6.4.3: a `*` only as the whole left-most label, matching exactly one
//! label; no partial-label wildcards; the Common Name is not consulted when there is no
//! DNS SAN, as browsers do). A Secret is used for an Ingress or SweetySite hostname only when
//! its certificate covers the name (see `ingress` and `site`). And whether the dataplane can
//! serve a certificate with its key at all ([`serves`]).

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The DNS subjectAltNames of the first (leaf) certificate of a PEM chain, lower-cased.
pub fn dns_names(pem: &str) -> Result<Vec<String>, String> {
    let leaf = CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .ok_or_else(|| "tls.crt holds no PEM certificate".to_string())?
        .map_err(|e| format!("tls.crt is not valid PEM: {e}"))?;
    let cert = webpki::EndEntityCert::try_from(&leaf)
        .map_err(|e| format!("tls.crt is not a valid X.509 certificate: {e}"))?;
    Ok(cert
        .valid_dns_names()
        .map(|n| n.trim_end_matches('.').to_ascii_lowercase())
        .collect())
}

/// Whether the dataplane can serve the PEM chain `cert` with the PEM key `key`: its own load
/// (`sweety_dataplane::tls::load_certified_key`: the chain parses, the key is a PKCS#8, PKCS#1
/// or SEC1 key of the ring provider, and it is the leaf certificate's key), so that a
/// certificate the controller puts in the config cannot make the dataplane refuse the config.
pub fn serves(cert: &str, key: &str) -> Result<(), String> {
    dns_names(cert)?;
    let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("tls.crt is not valid PEM: {e}"))?;
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes())
        .map_err(|e| format!("tls.key holds no private key: {e}"))?;
    let provider = rustls::crypto::ring::default_provider();
    match rustls::sign::CertifiedKey::from_der(chain, key, &provider) {
        Ok(_) => Ok(()),
        Err(rustls::Error::InconsistentKeys(_)) => {
            Err("tls.key is not the key of the certificate in tls.crt".into())
        }
        Err(e) => Err(format!("tls.key is no key the dataplane can use: {e}")),
    }
}

/// Whether a certificate with DNS names `names` covers `host` (an exact name, or a `*.`
/// wildcard hostname, which needs the same wildcard among the names).
pub fn covers(names: &[String], host: &str) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if host.is_empty() {
        return false;
    }
    names.iter().any(|n| {
        if *n == host {
            return true;
        }
        // `*.example.com` covers `a.example.com`, not `example.com`, `a.b.example.com` or
        // the wildcard host `*.example.com`'s siblings.
        let Some(suffix) = n.strip_prefix("*.") else {
            return false;
        };
        if suffix.is_empty() || suffix.contains('*') {
            return false;
        }
        match host.split_once('.') {
            Some((first, rest)) => {
                rest == suffix && !first.is_empty() && first != "*" && !first.contains('*')
            }
            None => false,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn rfc6125_matching() {
        let n = v(&["shop.example.com", "*.api.example.com"]);
        assert!(covers(&n, "shop.example.com"));
        assert!(covers(&n, "SHOP.example.com."));
        assert!(covers(&n, "v1.api.example.com"));
        assert!(!covers(&n, "api.example.com"), "a wildcard needs one label");
        assert!(!covers(&n, "a.v1.api.example.com"), "only one label");
        assert!(!covers(&n, "other.example.com"));
        assert!(!covers(&n, ""));
        // A wildcard hostname needs the wildcard itself.
        assert!(covers(&n, "*.api.example.com"));
        assert!(!covers(&v(&["a.example.com"]), "*.example.com"));
        // Partial-label and bare wildcards cover nothing else.
        assert!(!covers(&v(&["f*.example.com"]), "foo.example.com"));
        assert!(!covers(&v(&["*."]), "a."));
        assert!(!covers(&v(&["*.*.example.com"]), "a.b.example.com"));
    }

    /// Property: over generated names, a covered host either equals a name or is one label
    /// under a `*.` name, and never has fewer labels than the name covering it.
    #[test]
    fn coverage_is_never_wider_than_one_label() {
        let labels = ["a", "b", "*", "example", "com", "x-y", ""];
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let name = |next: &mut dyn FnMut(usize) -> usize| {
            let k = 1 + next(4);
            (0..k)
                .map(|_| labels[next(labels.len())])
                .collect::<Vec<_>>()
                .join(".")
        };
        for _ in 0..20_000 {
            // Certificate names arrive normalised (no trailing dot) from `dns_names`.
            let cert = name(&mut next).trim_end_matches('.').to_string();
            let host = name(&mut next);
            if covers(std::slice::from_ref(&cert), &host) {
                let host = host.trim_end_matches('.').to_ascii_lowercase();
                let under_wildcard = cert.strip_prefix("*.").is_some_and(|s| {
                    host.split_once('.')
                        .is_some_and(|(f, r)| r == s && !f.is_empty() && !f.contains('*'))
                });
                assert!(host == cert || under_wildcard, "{cert} covers {host}");
                assert_eq!(host.split('.').count(), cert.split('.').count());
            }
        }
    }

    #[test]
    fn san_names_from_pem() {
        let ck = rcgen::generate_simple_self_signed(vec![
            "shop.example.com".to_string(),
            "*.shop.example.com".to_string(),
        ])
        .unwrap();
        let names = dns_names(&ck.cert.pem()).unwrap();
        assert_eq!(names, ["shop.example.com", "*.shop.example.com"]);
        assert!(
            dns_names("-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n").is_err()
        );
        assert!(dns_names("no pem").is_err());
    }
}
