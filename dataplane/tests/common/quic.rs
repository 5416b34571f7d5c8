//! The TLS side and the datagram pump of the in-memory QUIC tests (`quic_loss_timer`,
//! `quic_unacked`, `quic_wakeups`), which drive a
//! quinn-proto server with Sweety's HTTP/3 transport settings and a quinn-proto client by
//! hand, with no socket.

use std::sync::Arc;

/// Appends the datagrams of every transmit `conn` has (GSO batches split at their segment size).
pub(crate) fn transmit(
    conn: &mut quinn_proto::Connection,
    now: std::time::Instant,
    out: &mut Vec<Vec<u8>>,
) {
    let mut buf = Vec::new();
    while let Some(t) = conn.poll_transmit(now, 10, &mut buf) {
        let seg = t.segment_size.unwrap_or(t.size);
        out.extend(buf[..t.size].chunks(seg).map(<[u8]>::to_vec));
        buf.clear();
    }
}

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

/// The server's endpoint: Sweety's HTTP/3 transport settings (the defaults of `http3` and
/// `limits`) over `tls`, quinn's default endpoint config, a fixed seed; its connections count
/// their sent-packet state in a total of their own, budget `http3.send_budget`.
pub(crate) fn server_endpoint(tls: Arc<rustls::ServerConfig>) -> quinn_proto::Endpoint {
    let budget = sweety_config::Http3::default().send_budget;
    let total = Arc::new(quinn_proto::SentStateTotal::new(budget));
    server_endpoint_sharing(tls, &total)
}

/// [`server_endpoint`] with its connections' sent-packet state counted in `total`.
pub(crate) fn server_endpoint_sharing(
    tls: Arc<rustls::ServerConfig>,
    total: &Arc<quinn_proto::SentStateTotal>,
) -> quinn_proto::Endpoint {
    let server_cfg = sweety_dataplane::listen::quic::server_config(
        tls,
        &sweety_config::Http3::default(),
        &sweety_config::Limits::default(),
        "test",
        total,
    )
    .unwrap();
    quinn_proto::Endpoint::new(
        Arc::new(quinn_proto::EndpointConfig::default()),
        Some(Arc::new(server_cfg)),
        false,
        Some([7; 32]),
    )
}

/// A client's endpoint (a fixed seed) and its connection to `server`, started at `now`, over
/// `tls`, with `transport` (quinn's defaults when `None`).
pub(crate) fn client(
    tls: rustls::ClientConfig,
    transport: Option<quinn_proto::TransportConfig>,
    server: std::net::SocketAddr,
    now: std::time::Instant,
) -> (
    quinn_proto::Endpoint,
    (quinn_proto::ConnectionHandle, quinn_proto::Connection),
) {
    let crypto = quinn_proto::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    let mut cfg = quinn_proto::ClientConfig::new(Arc::new(crypto));
    if let Some(transport) = transport {
        cfg.transport_config(Arc::new(transport));
    }
    let mut endpoint = quinn_proto::Endpoint::new(
        Arc::new(quinn_proto::EndpointConfig::default()),
        None,
        false,
        Some([9; 32]),
    );
    let conn = endpoint.connect(now, cfg, server, "localhost").unwrap();
    (endpoint, conn)
}
