//! Sweety patch (vendor/README.md): the QPACK coding of a response head, reachable by Sweety's
//! tests of the patch (`dataplane/tests/h3_qpack.rs`); the `qpack` module itself is private.
//! Nothing here is used by the server path.

use bytes::BytesMut;
use http::{HeaderMap, StatusCode};

/// The field section `send_response` writes for a head (the patched encoder) and its size.
pub fn encode_response(status: StatusCode, fields: &HeaderMap) -> Result<(BytesMut, u64), String> {
    let mut block = BytesMut::new();
    let size = crate::qpack::encode_response_stateless(&mut block, status, fields)
        .map_err(|e| e.to_string())?;
    Ok((block, size))
}

/// Upstream's encoding of the same head: `Header::response`'s fields through
/// `encode_stateless`, as `send_response` did before the patch.
pub fn encode_response_upstream(
    status: StatusCode,
    fields: HeaderMap,
) -> Result<(BytesMut, u64), String> {
    let mut block = BytesMut::new();
    let head = crate::proto::headers::Header::response(status, fields);
    let size = crate::qpack::encode_stateless(&mut block, head).map_err(|e| e.to_string())?;
    Ok((block, size))
}

/// A field section decoded by h3's stateless decoder (the one that reads requests): each
/// field's name and value, and the section's size.
pub fn decode(block: &[u8]) -> Result<(Vec<(Vec<u8>, Vec<u8>)>, u64), String> {
    let mut buf = block;
    let decoded = crate::qpack::decode_stateless(&mut buf, u64::MAX).map_err(|e| e.to_string())?;
    let fields = decoded
        .fields
        .into_iter()
        .map(|f| {
            let (n, v) = f.into_inner();
            (n.into_owned(), v.into_owned())
        })
        .collect();
    Ok((fields, decoded.mem_size))
}
