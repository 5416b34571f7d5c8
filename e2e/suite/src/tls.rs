//! Test certificates: a throwaway CA and a leaf for the test hostnames, PEM-encoded for Secrets and clients.

use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, KeyUsagePurpose};

use crate::{Error, Result};

/// A CA certificate and a leaf signed by it.
#[derive(Debug, Clone)]
pub struct TestPki {
    /// The throwaway CA certificate, for clients to trust.
    pub ca_pem: String,
    /// Leaf certificate naming every test host, for the TLS Secret.
    pub cert_pem: String,
    /// The leaf's private key (PKCS#8), for the TLS Secret.
    pub key_pem: String,
}

/// A throwaway CA named `common_name`: its PEM certificate and the issuer that signs leaves with it.
fn new_ca(common_name: &str) -> Result<(String, rcgen::Issuer<'static, KeyPair>)> {
    let ca_key = KeyPair::generate().map_err(Error::Cert)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(Error::Cert)?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, common_name);
    let ca_cert = ca.self_signed(&ca_key).map_err(Error::Cert)?;
    Ok((ca_cert.pem(), rcgen::Issuer::new(ca, ca_key)))
}

/// Generates a CA and a server certificate for `hosts` (DNS names).
pub fn generate(hosts: &[&str]) -> Result<TestPki> {
    let (ca_pem, issuer) = new_ca("sweety e2e CA")?;
    let leaf_key = KeyPair::generate().map_err(Error::Cert)?;
    let leaf = CertificateParams::new(hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>())
        .map_err(Error::Cert)?;
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer).map_err(Error::Cert)?;
    Ok(TestPki {
        ca_pem,
        cert_pem: leaf_cert.pem(),
        key_pem: leaf_key.serialize_pem(),
    })
}

/// Generates a throwaway CA and a client certificate for `common_name` signed by it (extended key usage:
/// client authentication): `ca_pem` for the server's `ca.crt`, `cert_pem`/`key_pem` for the client.
pub fn client(common_name: &str) -> Result<TestPki> {
    let (ca_pem, issuer) = new_ca("sweety e2e client CA")?;
    let leaf_key = KeyPair::generate().map_err(Error::Cert)?;
    let mut leaf = CertificateParams::new(Vec::<String>::new()).map_err(Error::Cert)?;
    leaf.distinguished_name
        .push(rcgen::DnType::CommonName, common_name);
    leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer).map_err(Error::Cert)?;
    Ok(TestPki {
        ca_pem,
        cert_pem: leaf_cert.pem(),
        key_pem: leaf_key.serialize_pem(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaf_is_signed_by_the_ca() {
        let p = generate(&["a.e2e.test", "b.e2e.test"]).unwrap();
        assert!(p.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(p.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(p.key_pem.contains("PRIVATE KEY"));
        // rustls accepts the chain for both names.
        use rustls::client::danger::ServerCertVerifier;
        use rustls_pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(rustls_pki_types::CertificateDer::from_pem_slice(p.ca_pem.as_bytes()).unwrap())
            .unwrap();
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(roots.into(), provider)
                .build()
                .unwrap();
        let leaf = rustls_pki_types::CertificateDer::from_pem_slice(p.cert_pem.as_bytes()).unwrap();
        for host in ["a.e2e.test", "b.e2e.test"] {
            verifier
                .verify_server_cert(
                    &leaf,
                    &[],
                    &rustls_pki_types::ServerName::try_from(host).unwrap(),
                    &[],
                    rustls_pki_types::UnixTime::now(),
                )
                .unwrap();
        }
    }
}
