//! The ClientHello peek of an `https` listener with passthrough hosts
//! (`read_client_hello_into`, then `Replay`), on any bytes arriving in reads of any size
//! (the first two input bytes choose the read size and the peek limit): never panics, never
//! holds more than the limit, keeps exactly the bytes it read (a prefix of the input), and the
//! replay of them followed by the rest of the connection is the input, byte for byte.
#![no_main]

use futures_util::FutureExt;
use libfuzzer_sys::fuzz_target;
use std::pin::Pin;
use std::task::{Context, Poll};
use sweety_dataplane::listen::l4::{read_client_hello_into, HelloError, Replay};
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};

/// A connection that hands out `step` bytes per read, then EOF.
struct Steps<'a> {
    data: &'a [u8],
    step: usize,
}

impl AsyncRead for Steps<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let n = self.step.min(self.data.len()).min(buf.remaining());
        buf.put_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Poll::Ready(Ok(()))
    }
}

fuzz_target!(|input: &[u8]| {
    let [step, limit, data @ ..] = input else {
        return;
    };
    let step = usize::from(*step).max(1);
    let max = 64 + usize::from(*limit) * 64;
    let mut conn = Steps { data, step };
    let mut buf = Vec::new();
    let r = read_client_hello_into(&mut conn, max, &mut buf)
        .now_or_never()
        .expect("only ready reads");
    assert!(buf.len() <= max, "read {} past the limit {max}", buf.len());
    assert!(data.starts_with(&buf), "kept bytes it did not read in order");
    match r {
        Ok(name) => {
            if let Some(n) = &name {
                assert_eq!(*n, n.to_ascii_lowercase());
            }
        }
        Err(HelloError::Closed(_)) => assert_eq!(buf.len(), data.len(), "closed before EOF"),
        Err(HelloError::Invalid(_)) => {}
    }
    let mut replay = Replay::new(buf, conn);
    let mut got = Vec::new();
    replay
        .read_to_end(&mut got)
        .now_or_never()
        .expect("only ready reads")
        .expect("no read error");
    assert_eq!(got, data, "the replay is not the connection");
});
