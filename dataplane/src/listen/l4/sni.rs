//! Finding the SNI server name in a TLS ClientHello without terminating TLS, for
//! passthrough routing. Works on the bytes read so far: it says whether more are needed, and
//! never reads past `max` bytes. Handshake messages fragmented over several records are
//! reassembled.

/// What the bytes read so far say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peek {
    /// The ClientHello is not complete yet.
    NeedMore,
    /// A complete ClientHello, with its server name (lower-cased) if it has one.
    Hello(Option<String>),
    /// Not a TLS ClientHello (or malformed, or larger than allowed).
    Invalid(&'static str),
}

/// Parses the start of a TLS connection, `max` bytes at most.
pub fn peek(buf: &[u8], max: usize) -> Peek {
    // Reassemble handshake bytes from consecutive handshake records.
    let mut hs: Vec<u8> = Vec::new();
    let mut pos = 0;
    loop {
        if pos + 5 > buf.len() {
            return if buf.len() >= max {
                Peek::Invalid("ClientHello larger than the peek limit")
            } else {
                Peek::NeedMore
            };
        }
        if buf[pos] != 0x16 {
            return Peek::Invalid("not a TLS handshake record");
        }
        if buf[pos + 1] != 0x03 {
            return Peek::Invalid("not a TLS record version");
        }
        let len = usize::from(u16::from_be_bytes([buf[pos + 3], buf[pos + 4]]));
        if len == 0 || len > 16_384 {
            return Peek::Invalid("bad TLS record length");
        }
        let end = pos + 5 + len;
        if end > buf.len() {
            // Take what is there; the message may already be complete in a partial record?
            // No: records are only processed whole.
            return if end > max {
                Peek::Invalid("ClientHello larger than the peek limit")
            } else {
                Peek::NeedMore
            };
        }
        hs.extend_from_slice(&buf[pos + 5..end]);
        pos = end;
        if hs.len() >= 4 {
            if hs[0] != 0x01 {
                return Peek::Invalid("first handshake message is not a ClientHello");
            }
            let mlen = (usize::from(hs[1]) << 16) | (usize::from(hs[2]) << 8) | usize::from(hs[3]);
            if mlen + 4 > max {
                return Peek::Invalid("ClientHello larger than the peek limit");
            }
            if hs.len() >= mlen + 4 {
                return match client_hello_sni(&hs[4..4 + mlen]) {
                    Ok(sni) => Peek::Hello(sni),
                    Err(e) => Peek::Invalid(e),
                };
            }
        }
    }
}

/// A cursor over a byte slice with bounds-checked reads.
struct Cur<'a>(&'a [u8]);

impl<'a> Cur<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        if self.0.len() < n {
            return Err("truncated ClientHello");
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<usize, &'static str> {
        Ok(usize::from(self.take(1)?[0]))
    }
    fn u16(&mut self) -> Result<usize, &'static str> {
        let b = self.take(2)?;
        Ok(usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
}

fn client_hello_sni(body: &[u8]) -> Result<Option<String>, &'static str> {
    let mut c = Cur(body);
    c.take(2 + 32)?; // legacy_version, random
    let n = c.u8()?;
    c.take(n)?; // session id
    let n = c.u16()?;
    c.take(n)?; // cipher suites
    let n = c.u8()?;
    c.take(n)?; // compression methods
    if c.0.is_empty() {
        return Ok(None); // no extensions
    }
    let n = c.u16()?;
    let mut exts = Cur(c.take(n)?);
    while !exts.0.is_empty() {
        let ty = exts.u16()?;
        let len = exts.u16()?;
        let data = exts.take(len)?;
        if ty != 0 {
            continue;
        }
        let mut d = Cur(data);
        let list_len = d.u16()?;
        let mut list = Cur(d.take(list_len)?);
        while !list.0.is_empty() {
            let kind = list.u8()?;
            let len = list.u16()?;
            let name = list.take(len)?;
            if kind == 0 {
                let s = std::str::from_utf8(name).map_err(|_| "server name is not UTF-8")?;
                if s.is_empty()
                    || !s
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
                {
                    return Err("invalid server name");
                }
                return Ok(Some(s.trim_end_matches('.').to_ascii_lowercase()));
            }
        }
        return Ok(None);
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real ClientHello from rustls for `name`, in one record.
    fn client_hello(name: &str) -> Vec<u8> {
        crate::listen::l4::tests::client_hello(name, None)
    }

    #[test]
    fn finds_sni_in_a_real_client_hello() {
        let hello = client_hello("App.Example.com");
        assert_eq!(
            peek(&hello, 16_384),
            Peek::Hello(Some("app.example.com".into()))
        );
        // An IP address is sent without SNI.
        let hello = client_hello("127.0.0.1");
        assert_eq!(peek(&hello, 16_384), Peek::Hello(None));
    }

    #[test]
    fn partial_input_needs_more_at_every_length() {
        let hello = client_hello("a.test");
        for cut in 0..hello.len() {
            assert_eq!(peek(&hello[..cut], 16_384), Peek::NeedMore, "cut at {cut}");
        }
    }

    #[test]
    fn fragmented_handshake_is_reassembled() {
        let hello = client_hello("frag.test");
        let hs = &hello[5..];
        let (a, b) = hs.split_at(40);
        let mut buf = Vec::new();
        for part in [a, b] {
            buf.extend_from_slice(&[0x16, 0x03, 0x01]);
            buf.extend_from_slice(&(part.len() as u16).to_be_bytes());
            buf.extend_from_slice(part);
        }
        assert_eq!(peek(&buf, 16_384), Peek::Hello(Some("frag.test".into())));
    }

    #[test]
    fn bad_input_is_invalid() {
        assert!(matches!(
            peek(b"GET / HTTP/1.1\r\n\r\n", 16_384),
            Peek::Invalid(_)
        ));
        assert!(matches!(
            peek(&[0x16, 0x03, 0x01, 0x00, 0x00], 16_384),
            Peek::Invalid(_)
        ));
        // A handshake that is not a ClientHello.
        assert!(matches!(
            peek(
                &[0x16, 0x03, 0x01, 0x00, 0x04, 0x02, 0x00, 0x00, 0x00],
                16_384
            ),
            Peek::Invalid(_)
        ));
        // A ClientHello claiming more than the limit.
        let mut big = vec![0x16, 0x03, 0x01, 0x40, 0x00, 0x01, 0x00, 0xff, 0xff];
        big.resize(5 + 0x4000, 0);
        assert!(matches!(peek(&big, 1024), Peek::Invalid(_)));
        // Garbage inside a well-framed ClientHello: truncated fields.
        let mut junk = vec![
            0x16, 0x03, 0x01, 0x00, 0x08, 0x01, 0x00, 0x00, 0x04, 0x03, 0x03, 0x00, 0x00,
        ];
        junk.truncate(13);
        assert!(matches!(peek(&junk, 16_384), Peek::Invalid(_)));
        // Bytes keep coming but never complete within the limit.
        let hello = client_hello("a.test");
        assert!(matches!(peek(&hello, 64), Peek::Invalid(_)));
    }
}
