//! The client side of HTTP/1.1 for keep-alive backends: one request at a time on a [`Conn`],
//! with no task and no channel of its own.
//!
//! [`Conn::send`] writes the request head straight from the caller's fields into one buffer
//! ([`head::write_request_head`]), with the body's first chunk in the same write when it is
//! small (larger chunks follow by vectored writes, without a copy), streams the rest of the
//! body as the body yields it (a chunk is asked for only once the one before it was written:
//! backpressure), and meanwhile reads the response head: once, with httparse, into
//! [`http::Response`] with its hop-by-hop fields left out ([`head::parse_response`]), interim
//! 1xx responses skipped. The returned [`ResponseBody`] owns the connection and reads the body
//! from it ([`body::Decoder`]); should the head come before the request was out, it keeps
//! sending the request as it is polled.
//!
//! The read buffer never holds more than the connection's `read_ahead` bytes (the head's size
//! bound too), and a body piece is taken out of it only when the body is polled: what a
//! connection reads ahead of its consumer is bounded.
//!
//! A connection goes back to its owner (the [`Release`] given to [`Conn::send`]) only
//! when the response was read to its declared end, the request was sent whole, nothing
//! follows the response in the buffer, and neither side asked to close (the client asks for a
//! GET or HEAD with a chunked body, [`head::closes_after`]); a response read whole
//! with its head (no body, or a `Content-Length` body already in the buffer) releases it before
//! `send` returns. Everything else closes the connection (it is dropped).
//!
//! Retry safety: a [`SendError`] gives the request body back ([`Unsent`]) when no byte of the
//! request reached the connection, and says whether any response byte came.

pub mod body;
pub mod head;

use body::{BodyError, Decoded, Decoder};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use head::{BodyShape, HeadError, Parsed, RequestFraming, ResponseHead};
use http::{HeaderMap, HeaderValue, Method};
use http_body::{Body, Frame, SizeHint};
use std::future::{poll_fn, Future};
use std::io::IoSlice;
use std::pin::Pin;
use std::task::{ready, Context, Poll, Waker};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

/// Boxed error of request bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Request body chunks of at most this many bytes are copied into the write buffer (with the
/// head or the chunk framing); larger ones are written from where they are.
pub const GATHER_AT_MOST: usize = 8 * 1024;

/// The smallest read buffer bound (a response head must fit in it).
pub const MIN_READ_AHEAD: usize = 1024;

/// Why an exchange failed. The connection is closed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading from or writing to the backend failed.
    #[error("backend connection: {0}")]
    Io(#[from] std::io::Error),
    /// The backend closed the connection before a complete response head.
    #[error("backend closed the connection before a complete response head")]
    Closed,
    /// The response head is malformed or its framing ambiguous.
    #[error(transparent)]
    Head(#[from] HeadError),
    /// The response head does not fit in the read buffer.
    #[error("response head larger than {0} bytes")]
    HeadTooLarge(usize),
    /// The request body failed (its client broke off).
    #[error("request body: {0}")]
    RequestBody(BoxError),
    /// The request body was longer or shorter than its `Content-Length`.
    #[error("request body length differs from its Content-Length")]
    RequestLength,
    /// The response body is broken.
    #[error(transparent)]
    Body(#[from] BodyError),
    /// More than [`MAX_INTERIM`] interim (1xx) responses before the final one.
    #[error("more than {MAX_INTERIM} interim responses")]
    TooManyInterim,
}

/// Interim (1xx) responses read before a final one at most (hyper reads any number): a
/// backend streaming `100 Continue` for ever holds the try only until this many.
pub const MAX_INTERIM: usize = 16;

impl Error {
    /// Whether the backend went away (closed or reset the connection) rather than answered
    /// wrongly: what a pooled connection the backend closed while idle looks like.
    pub fn is_disconnect(&self) -> bool {
        use std::io::ErrorKind::*;
        match self {
            Error::Closed => true,
            Error::Io(e) => matches!(
                e.kind(),
                ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof | NotConnected
            ),
            _ => false,
        }
    }
}

/// A failed [`Conn::send`].
#[derive(Debug)]
pub struct SendError<B> {
    /// The cause.
    pub error: Error,
    /// The request body, when no byte of the request reached the connection (any request
    /// may then go again, on another connection).
    pub unsent: Option<Unsent<B>>,
    /// Some bytes of a response came before the failure.
    pub response_started: bool,
}

/// The request fields [`Conn::send`] writes.
#[derive(Debug, Clone, Copy)]
pub struct RequestHead<'a> {
    /// The method.
    pub method: &'a Method,
    /// The request target in origin form (path and query).
    pub target: &'a str,
    /// `Host`, written first (the map's own `Host` is then left out); `None`: the map's.
    pub host: Option<&'a HeaderValue>,
    /// The fields to send, hop-by-hop ones removed already.
    pub headers: &'a HeaderMap,
    /// Fields written after those of `headers` (see [`head::ExtraFields`]).
    pub extra: Option<&'a head::ExtraFields>,
}

/// Where a connection goes once it can carry another request (a pool's check-in).
pub trait Release<T> {
    /// Takes `conn` back.
    fn release(self, conn: Conn<T>);
}

/// A connection to a backend, idle between requests.
#[derive(Debug)]
pub struct Conn<T> {
    io: T,
    /// Read and not yet consumed; at most `read_ahead` bytes.
    rbuf: BytesMut,
    /// Output not yet written, from `wpos`.
    wbuf: Vec<u8>,
    wpos: usize,
    read_ahead: usize,
}

/// The request body on its way out.
#[derive(Debug)]
struct Writer<B> {
    body: B,
    framing: RequestFraming,
    /// `Length`: bytes still owed.
    left: u64,
    /// A large data chunk to write after the write buffer.
    pending: Bytes,
    /// Chunked: `pending` is a chunk's data, to be followed by its CRLF.
    crlf_after_pending: bool,
    /// The body's first chunk, kept until a byte is written (to give it back).
    first: Option<Bytes>,
    /// The whole request is queued (the body ended, its terminator written to the buffer).
    finished: bool,
    /// A byte of the request reached the connection.
    written: bool,
}

impl<B> Writer<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    fn new(body: B, framing: RequestFraming) -> Writer<B> {
        Writer {
            body,
            framing,
            left: match framing {
                RequestFraming::Length(n) => n,
                _ => 0,
            },
            pending: Bytes::new(),
            crlf_after_pending: false,
            first: None,
            finished: framing == RequestFraming::Empty,
            written: false,
        }
    }

    /// Queues a data chunk in `wbuf` (or as `pending` when large).
    fn queue(&mut self, wbuf: &mut Vec<u8>, data: Bytes) -> Result<(), Error> {
        if data.is_empty() {
            return Ok(());
        }
        let chunked = match self.framing {
            RequestFraming::Empty => return Err(Error::RequestLength),
            RequestFraming::Length(_) => {
                self.left = self
                    .left
                    .checked_sub(data.len() as u64)
                    .ok_or(Error::RequestLength)?;
                false
            }
            RequestFraming::Chunked => {
                crate::chunked::put_chunk_head(wbuf, data.len());
                true
            }
        };
        if data.len() <= GATHER_AT_MOST {
            wbuf.put_slice(&data);
            if chunked {
                wbuf.put_slice(crate::chunked::CHUNK_END);
            }
        } else {
            self.pending = data;
            self.crlf_after_pending = chunked;
        }
        Ok(())
    }

    /// The body ended: checks its length, queues the chunked terminator. A request's
    /// trailer fields are never sent (as hyper's client sent none once the proxy had removed
    /// `Trailer`): a client could otherwise hand a backend that merges trailers into the
    /// head a `Host`, `X-Forwarded-For` or credential field the proxy never checked.
    fn finish(&mut self, wbuf: &mut Vec<u8>) -> Result<(), Error> {
        match self.framing {
            RequestFraming::Length(_) if self.left != 0 => return Err(Error::RequestLength),
            RequestFraming::Chunked => wbuf.extend_from_slice(crate::chunked::LAST_CHUNK),
            _ => {}
        }
        self.finished = true;
        Ok(())
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> Conn<T> {
    /// A connection over `io` whose read buffer (and so the largest response head) holds at
    /// most `read_ahead` bytes (at least [`MIN_READ_AHEAD`]).
    pub fn new(io: T, read_ahead: usize) -> Conn<T> {
        Conn {
            io,
            rbuf: BytesMut::new(),
            wbuf: Vec::new(),
            wpos: 0,
            read_ahead: read_ahead.max(MIN_READ_AHEAD),
        }
    }

    /// The transport.
    pub fn get_ref(&self) -> &T {
        &self.io
    }

    /// Whether an idle connection can no longer carry a request: the backend closed it, reset
    /// it or sent something unasked. Looks at what the transport has ready now, without
    /// waiting.
    pub fn is_closed(&mut self) -> bool {
        if !self.rbuf.is_empty() {
            return true;
        }
        let mut cx = Context::from_waker(Waker::noop());
        // Ready with nothing (end of stream), with bytes (unasked) or with an error: all
        // mean this connection is done.
        self.poll_fill(&mut cx).is_ready()
    }

    /// Reads what the transport has into the read buffer, at most up to its bound; `Ok(0)` at
    /// the end of the stream (or when the buffer is full).
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        let room = self.read_ahead.saturating_sub(self.rbuf.len());
        if room == 0 {
            // A body piece the decoder cannot take without more (a chunk-size line) filled
            // the buffer.
            return Poll::Ready(Err(std::io::Error::other(
                "response framing larger than the read buffer",
            )));
        }
        self.rbuf.reserve(room);
        let mut limited = (&mut self.rbuf).limit(room);
        let fut = self.io.read_buf(&mut limited);
        let mut fut = std::pin::pin!(fut);
        fut.as_mut().poll(cx)
    }

    /// Writes what is queued and pulls the body for more until the whole request is written
    /// and flushed (`Ready(Ok)`), or the body or the transport makes us wait.
    fn poll_write_request<B>(
        &mut self,
        w: &mut Writer<B>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), Error>>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: Into<BoxError>,
    {
        loop {
            // Gather: chunks the body has ready join the buffer while it is small (before
            // the first write, only the first chunk, so that it can be given back).
            while !w.finished
                && w.pending.is_empty()
                && self.wbuf.len() - self.wpos < GATHER_AT_MOST
                && (w.written || w.first.is_none())
            {
                match Pin::new(&mut w.body).poll_frame(cx) {
                    Poll::Pending => break,
                    Poll::Ready(None) => w.finish(&mut self.wbuf)?,
                    Poll::Ready(Some(Err(e))) => {
                        return Poll::Ready(Err(Error::RequestBody(e.into())))
                    }
                    Poll::Ready(Some(Ok(frame))) => {
                        match frame.into_data() {
                            Ok(data) => {
                                if !w.written {
                                    w.first = Some(data.clone());
                                }
                                w.queue(&mut self.wbuf, data)?;
                            }
                            Err(_trailers) => {
                                // Trailers end the body; they are not sent (`finish`).
                                w.finish(&mut self.wbuf)?;
                                continue;
                            }
                        }
                        // The end goes after a large chunk still to be written: it is seen
                        // when the body is polled again.
                        if w.pending.is_empty() && w.body.is_end_stream() {
                            w.finish(&mut self.wbuf)?;
                        }
                    }
                }
            }
            if self.wpos < self.wbuf.len() || !w.pending.is_empty() {
                // One piece (a head with no body, or with its body copied in: the usual
                // request) goes by a plain write: on a socket that is `send`, where a vectored
                // write is `writev`, whose VFS path (the iovec import, the file checks) costs
                // more kernel time for the same bytes (e2e/bench/HISTORY.md, session 21).
                let n = if w.pending.is_empty() {
                    ready!(Pin::new(&mut self.io).poll_write(cx, &self.wbuf[self.wpos..]))?
                } else if self.wpos == self.wbuf.len() {
                    ready!(Pin::new(&mut self.io).poll_write(cx, &w.pending))?
                } else {
                    let bufs = [
                        IoSlice::new(&self.wbuf[self.wpos..]),
                        IoSlice::new(&w.pending),
                    ];
                    ready!(Pin::new(&mut self.io).poll_write_vectored(cx, &bufs))?
                };
                if n == 0 {
                    return Poll::Ready(Err(Error::Io(std::io::ErrorKind::WriteZero.into())));
                }
                w.written = true;
                w.first = None;
                let in_buf = (self.wbuf.len() - self.wpos).min(n);
                self.wpos += in_buf;
                w.pending.advance(n - in_buf);
                if self.wpos == self.wbuf.len() {
                    self.wbuf.clear();
                    self.wpos = 0;
                }
                if w.pending.is_empty() && w.crlf_after_pending {
                    w.crlf_after_pending = false;
                    self.wbuf.put_slice(crate::chunked::CHUNK_END);
                }
                continue;
            }
            // Nothing queued: the request is out, or the body has no chunk ready (its waker
            // is registered). Either way what was written goes out now.
            ready!(Pin::new(&mut self.io).poll_flush(cx))?;
            return if w.finished {
                Poll::Ready(Ok(()))
            } else {
                Poll::Pending
            };
        }
    }

    /// Reads until a final response head is parsed (interim ones skipped).
    fn poll_head(
        &mut self,
        head_request: bool,
        started: &mut bool,
        interim: &mut usize,
        cx: &mut Context<'_>,
    ) -> Poll<Result<ResponseHead, Error>> {
        loop {
            if !self.rbuf.is_empty() {
                match head::parse_response(&self.rbuf, head_request)? {
                    Parsed::Final(n, head) => {
                        self.rbuf.advance(n);
                        return Poll::Ready(Ok(head));
                    }
                    Parsed::Interim(n) => {
                        self.rbuf.advance(n);
                        *interim += 1;
                        if *interim > MAX_INTERIM {
                            return Poll::Ready(Err(Error::TooManyInterim));
                        }
                        continue;
                    }
                    Parsed::Partial if self.rbuf.len() >= self.read_ahead => {
                        return Poll::Ready(Err(Error::HeadTooLarge(self.read_ahead)));
                    }
                    Parsed::Partial => {}
                }
            }
            let n = ready!(self.poll_fill(cx))?;
            if n == 0 {
                return Poll::Ready(Err(Error::Closed));
            }
            *started = true;
        }
    }

    /// Sends one request (`req`'s fields and `body`) and waits for the response head. The
    /// response's body reads the rest from this connection, which goes to `release` once
    /// it can carry another request (see the module docs); else it is closed.
    pub async fn send<B, R>(
        mut self,
        req: RequestHead<'_>,
        body: B,
        release: R,
    ) -> Result<http::Response<ResponseBody<T, B, R>>, SendError<B>>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: Into<BoxError>,
        R: Release<T>,
    {
        let shape = BodyShape {
            end: body.is_end_stream(),
            exact: body.size_hint().exact(),
        };
        let head_request = *req.method == Method::HEAD;
        self.wbuf.clear();
        self.wpos = 0;
        let framing = head::write_request_head(
            &mut self.wbuf,
            req.method,
            req.target,
            req.host,
            req.headers,
            req.extra,
            shape,
        );
        // Asked the backend to close after this request: not reused.
        let closes = head::closes_after(req.method, framing);
        let mut w = Writer::new(body, framing);
        let mut started = false;
        let mut interim = 0;
        // The write failed after some bytes went: the backend may answer all the same.
        let mut write_error = None;
        let mut sent = false;
        let head = poll_fn(|cx| {
            if !sent && write_error.is_none() {
                match self.poll_write_request(&mut w, cx) {
                    Poll::Ready(Ok(())) => sent = true,
                    Poll::Ready(Err(e @ (Error::RequestBody(_) | Error::RequestLength))) => {
                        return Poll::Ready(Err(e));
                    }
                    Poll::Ready(Err(e)) if !w.written => return Poll::Ready(Err(e)),
                    Poll::Ready(Err(e)) => write_error = Some(e),
                    Poll::Pending => {}
                }
            }
            match ready!(self.poll_head(head_request, &mut started, &mut interim, cx)) {
                Ok(h) => Poll::Ready(Ok(h)),
                Err(e) => Poll::Ready(Err(write_error.take().unwrap_or(e))),
            }
        })
        .await;
        let head = match head {
            Ok(h) => h,
            Err(error) => {
                // A body that failed is not given back: it cannot be sent again.
                let broken = matches!(error, Error::RequestBody(_) | Error::RequestLength);
                let unsent = (!w.written && !broken).then(|| Unsent {
                    first: w.first.take(),
                    body: w.body,
                });
                return Err(SendError {
                    error,
                    unsent,
                    response_started: started,
                });
            }
        };
        let ResponseHead {
            response,
            framing,
            keep_alive,
        } = head;
        let (parts, ()) = response.into_parts();
        let decoder = Decoder::new(framing);
        let reusable = keep_alive && write_error.is_none() && !closes;
        // Read whole with its head: the connection goes back now.
        if sent {
            let whole = match decoder.remaining() {
                Some(n) => n <= self.rbuf.len() as u64,
                None => false,
            };
            if whole {
                let n = decoder.remaining().unwrap_or(0) as usize;
                let data = (n > 0).then(|| body::take(&mut self.rbuf, n));
                if reusable && self.rbuf.is_empty() {
                    release.release(self);
                }
                return Ok(http::Response::from_parts(
                    parts,
                    ResponseBody {
                        state: State::Whole(data),
                    },
                ));
            }
        }
        Ok(http::Response::from_parts(
            parts,
            ResponseBody {
                state: State::Streaming(Box::new(Streaming {
                    conn: self,
                    writer: (!sent && write_error.is_none()).then_some(w),
                    decoder,
                    reusable,
                    release: Some(release),
                })),
            },
        ))
    }
}

/// A request body that was not sent, given back whole: the chunk taken from it (if any)
/// first, then the rest.
#[derive(Debug)]
pub struct Unsent<B> {
    first: Option<Bytes>,
    body: B,
}

impl<B> Body for Unsent<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let rest = self.body.size_hint();
        let first = self.first.as_ref().map_or(0, |f| f.len() as u64);
        let mut h = SizeHint::new();
        if let Some(u) = rest.upper() {
            h.set_upper(u + first);
        }
        h.set_lower(rest.lower() + first);
        h
    }
}

/// A response body read from a backend connection.
pub struct ResponseBody<T, B, F> {
    state: State<T, B, F>,
}

impl<T, B, F> std::fmt::Debug for ResponseBody<T, B, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Whole(d) => format!("whole, {} bytes", d.as_ref().map_or(0, Bytes::len)),
            State::Streaming(s) => format!("streaming, {:?}", s.decoder),
            State::Done => "done".into(),
        };
        f.debug_struct("ResponseBody")
            .field("state", &state)
            .finish()
    }
}

enum State<T, B, F> {
    /// Read whole with the head (the connection was released or closed already).
    Whole(Option<Bytes>),
    /// Read from the connection as it is polled.
    Streaming(Box<Streaming<T, B, F>>),
    /// Done.
    Done,
}

struct Streaming<T, B, F> {
    conn: Conn<T>,
    /// The request, when it was not out as the head came.
    writer: Option<Writer<B>>,
    decoder: Decoder,
    /// Neither side asked to close and the request went out whole so far.
    reusable: bool,
    release: Option<F>,
}

impl<T, B, F> Streaming<T, B, F>
where
    T: AsyncRead + AsyncWrite + Unpin,
    F: Release<T>,
{
    /// The body is complete: the connection goes back when it can carry another request.
    fn complete(self) {
        let Streaming {
            conn,
            writer,
            reusable,
            release,
            ..
        } = self;
        if reusable && writer.is_none() && conn.rbuf.is_empty() {
            if let Some(release) = release {
                release.release(conn);
            }
        }
    }
}

impl<T, B, F> Body for ResponseBody<T, B, F>
where
    T: AsyncRead + AsyncWrite + Unpin,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
    F: Release<T>,
{
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let s = match &mut self.state {
            State::Whole(data) => {
                let data = data.take();
                self.state = State::Done;
                return Poll::Ready(data.map(|d| Ok(Frame::data(d))));
            }
            State::Done => return Poll::Ready(None),
            State::Streaming(s) => s,
        };
        // The request goes on while the response comes.
        if let Some(w) = s.writer.as_mut() {
            match s.conn.poll_write_request(w, cx) {
                Poll::Ready(Ok(())) => s.writer = None,
                Poll::Ready(Err(_)) => {
                    s.writer = None;
                    s.reusable = false;
                }
                Poll::Pending => {}
            }
        }
        loop {
            let step = match s.decoder.decode(&mut s.conn.rbuf) {
                Ok(d) => d,
                Err(e) => {
                    self.state = State::Done;
                    return Poll::Ready(Some(Err(e.into())));
                }
            };
            match step {
                Decoded::Data(d) => {
                    if s.decoder.is_done() {
                        // The last piece: the connection goes back before the consumer
                        // (who may stop at `is_end_stream`) polls again.
                        if let State::Streaming(s) = std::mem::replace(&mut self.state, State::Done)
                        {
                            s.complete();
                        }
                    }
                    return Poll::Ready(Some(Ok(Frame::data(d))));
                }
                Decoded::End => {
                    if let State::Streaming(s) = std::mem::replace(&mut self.state, State::Done) {
                        s.complete();
                    }
                    return Poll::Ready(None);
                }
                Decoded::Trailers(t) => {
                    if let State::Streaming(s) = std::mem::replace(&mut self.state, State::Done) {
                        s.complete();
                    }
                    return Poll::Ready(Some(Ok(Frame::trailers(t))));
                }
                Decoded::NeedMore => {}
            }
            match ready!(s.conn.poll_fill(cx)) {
                Ok(0) => {
                    let end = s.decoder.eof();
                    // Closed by the backend: never reused.
                    self.state = State::Done;
                    return Poll::Ready(end.err().map(|e| Err(e.into())));
                }
                Ok(_) => {}
                Err(e) => {
                    self.state = State::Done;
                    return Poll::Ready(Some(Err(e.into())));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.state {
            State::Whole(d) => d.is_none(),
            State::Done => true,
            State::Streaming(s) => s.decoder.is_done(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.state {
            State::Whole(d) => SizeHint::with_exact(d.as_ref().map_or(0, |d| d.len() as u64)),
            State::Done => SizeHint::with_exact(0),
            State::Streaming(s) => match s.decoder.remaining() {
                Some(n) => SizeHint::with_exact(n),
                None => SizeHint::default(),
            },
        }
    }
}

#[cfg(test)]
mod tests;
