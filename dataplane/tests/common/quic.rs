//! The TLS side of the in-memory QUIC tests (`quic_loss_timer`, `quic_unacked`), which drive a
//! quinn-proto server with Sweety's HTTP/3 transport settings and a quinn-proto client by
//! hand, with no socket.

use std::sync::Arc;

/// A self-signed certificate for `localhost`: the server's rustls config (TLS 1.3, ALPN h3, as
/// Sweety's listeners) and a client config trusting only it.
pub(crate) fn tls() -> (Arc<rustls::ServerConfig>, rustls::ClientConfig) {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
    let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![ck.cert.der().clone()], key)
        .unwrap();
    server.alpn_protocols = vec![b"h3".to_vec()];
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ck.cert.der().clone()).unwrap();
    let mut client = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.alpn_protocols = vec![b"h3".to_vec()];
    (Arc::new(server), client)
}
