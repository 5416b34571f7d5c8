//! Streams: their state, opening a stream for a request, resets, closing, and producing
//! each stream's response (head, body, trailers) into the write buffer.

use super::*;

/// What a stream's response is doing.
pub(super) enum Resp<F> {
    /// The pipeline is working on it: the request future, polled by the connection's task
    /// when the stream's waker fires (no task of its own; dropping it cancels the request).
    Running(F),
    /// HEADERS sent; the body is being sent.
    Body(Body),
    /// END_STREAM sent (or the stream reset).
    Done,
}

pub(super) struct Stream<F> {
    /// The request body's sink while the client may send data.
    pub(super) recv: Option<Arc<RecvShared>>,
    pub(super) recv_open: bool,
    /// What the client may still send on this stream.
    pub(super) recv_window: i64,
    /// Consumed bytes not yet granted back.
    pub(super) grant: usize,
    /// Bytes counted against the connection window, not yet released.
    pub(super) unreleased: usize,
    pub(super) content_length: Option<u64>,
    pub(super) received: u64,
    pub(super) send_window: i64,
    pub(super) resp: Resp<F>,
    /// Body data taken but not yet framed.
    pub(super) pending: Bytes,
    /// The body has no more data (trailers may follow in `trailers`).
    pub(super) body_done: bool,
    pub(super) trailers: Option<Box<HeaderMap>>,
    /// The waker of the stream's future and body, made at its first poll (or taken from the
    /// connection's spares, see [`Spares`]).
    pub(super) waker: Option<Arc<StreamWaker>>,
    /// The stream's waker fired (through `Signal`) since its request future was last polled:
    /// only then is a Running future polled again. A window change or a grant also queues
    /// the stream, and must not make the client a lever for re-polling the whole pipeline.
    pub(super) woken: bool,
    pub(super) queued: bool,
    /// Listed in the driver's `blocked` (waiting for connection window).
    pub(super) blocked: bool,
    /// Extended CONNECT: the tunnel's response body, sent instead of the response's on a 2xx.
    pub(super) tunnel_body: Option<Body>,
    pub(super) is_head: bool,
    /// Since when the response has had bytes waiting for flow-control window (the stream's
    /// or the connection's) without a byte sent: past `send_timeout` the stream is reset.
    pub(super) stalled: Option<Instant>,
}

impl<F> Stream<F> {
    pub(super) fn new(send_window: i64, recv_window: i64) -> Stream<F> {
        Stream {
            recv: None,
            recv_open: true,
            recv_window,
            grant: 0,
            unreleased: 0,
            content_length: None,
            received: 0,
            send_window,
            resp: Resp::Done,
            pending: Bytes::new(),
            body_done: false,
            trailers: None,
            waker: None,
            woken: false,
            queued: false,
            blocked: false,
            tunnel_body: None,
            is_head: false,
            stalled: None,
        }
    }

    pub(super) fn finished(&self) -> bool {
        !self.recv_open && matches!(self.resp, Resp::Done)
    }

    /// The response has body bytes in hand that no window lets out: the stream's own, or
    /// the connection's (`conn_window`), is used up. Only a frame of the client can open it.
    pub(super) fn waits_for_window(&self, conn_window: i64) -> bool {
        matches!(self.resp, Resp::Body(_))
            && !self.pending.is_empty()
            && self.send_window.min(conn_window) <= 0
    }
}

/// Stream `id`'s waker (made once, kept in `slot`, a spare of a closed stream reused when
/// there is one): it marks the stream ready in `signal` and wakes the connection's task.
fn waker_of(
    slot: &mut Option<Arc<StreamWaker>>,
    spares: &mut Spares,
    signal: &Arc<Signal>,
    id: u32,
) -> Waker {
    let w = slot.get_or_insert_with(|| {
        spares.take(id).unwrap_or_else(|| {
            Arc::new(StreamWaker {
                signal: signal.clone(),
                id,
            })
        })
    });
    Waker::from(w.clone())
}

/// Most stream wakers a connection keeps for its next streams.
pub(super) const SPARE_WAKERS: usize = 64;

/// The wakers of closed streams that nothing else holds, for the connection's next streams:
/// one allocation (and one count of the connection's `Signal`) less per stream. Only a waker
/// no clone of which is left is kept (`Arc::get_mut`), so a stale clone (a backend still
/// holding a closed stream's waker) can never mark the stream that reuses it ready: there is
/// none.
#[derive(Default)]
pub(super) struct Spares(Vec<Arc<StreamWaker>>);

impl Spares {
    /// A spare waker, now stream `id`'s.
    pub(super) fn take(&mut self, id: u32) -> Option<Arc<StreamWaker>> {
        let mut w = self.0.pop()?;
        // Unique when it was kept, and nothing could clone it since.
        Arc::get_mut(&mut w)?.id = id;
        Some(w)
    }

    /// Spare wakers kept now.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    /// Lets every spare go (an idle connection keeps none: up to [`SPARE_WAKERS`] allocations
    /// of ~40 bytes otherwise stay for the connection's life).
    pub(super) fn clear(&mut self) {
        self.0 = Vec::new();
    }

    /// Keeps the waker of a closed stream if nothing else holds it (and there is room: at
    /// most [`SPARE_WAKERS`]).
    pub(super) fn keep(&mut self, w: Option<Arc<StreamWaker>>) {
        if let Some(mut w) = w {
            if self.0.len() < SPARE_WAKERS && Arc::get_mut(&mut w).is_some() {
                self.0.push(w);
            }
        }
    }
}

/// A panic's message (a `&str` or `String` payload), for the log line.
pub(super) fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

/// Drops a stream's response (a request future still running, a response body) on the
/// connection's stack, where a task's harness no longer catches a panic in its `Drop`: such a
/// panic is logged and ends only this stream, never the connection (nor, while the driver is
/// itself unwinding, the process). The guard costs one call on the path without a panic.
pub(super) fn drop_guarded<F>(resp: Resp<F>, id: u32) {
    // Unwind safety: the value is dropped whole inside the closure; nothing of it is used
    // after a panic.
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(resp)));
    if let Err(payload) = dropped {
        let panic = panic_message(&*payload);
        tracing::error!(stream = id, panic, "dropping a request future panicked");
    }
}

/// Hashing of stream ids: a multiplicative hash (the ids are a client's choice, but a
/// connection holds at most `max_concurrent_streams` of them, so collisions cost little).
#[derive(Default, Clone, Copy)]
pub(super) struct StreamIds;

impl std::hash::BuildHasher for StreamIds {
    type Hasher = IdHasher;
    fn build_hasher(&self) -> IdHasher {
        IdHasher(0)
    }
}

pub(super) struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        // The product's high bits are well mixed: fold them into the low ones too.
        self.0 ^ (self.0 >> 29)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8 | *b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = (n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

impl<I: AsyncRead + AsyncWrite + Unpin, S: H2Service> Driver<I, S> {
    pub(super) fn is_idle(&self, id: u32) -> bool {
        id > self.last_stream
    }

    pub(super) fn start_stream(&mut self, id: u32, end_stream: bool, h: NewHead) -> FResult {
        let mut s = Stream::new(self.peer_initial_window, self.cfg.stream_window as i64);
        let kept = matches!(h, NewHead::Kept(_));
        let request = match h.into_parts() {
            // A tunnel whose client side ends at once cannot be one (the backend would be
            // dialed and switched for an empty, ended stream).
            Ok((_, true)) if end_stream => Err("extended CONNECT with END_STREAM"),
            r => r,
        }
        .map_err(|why| {
            tracing::debug!(stream = id, why, "malformed HTTP/2 request");
        });
        let Ok((mut parts, tunnel)) = request else {
            return self.reset_stream(id, Reason::PROTOCOL_ERROR, Charge::Client);
        };
        if !kept && !tunnel {
            self.keep_request(&parts);
        }
        s.content_length = h_content_length(&parts.headers)
            .map_err(|_| Fault::Stream(id, Reason::PROTOCOL_ERROR))?;
        if end_stream && s.content_length.is_some_and(|cl| cl != 0) {
            return Err(Fault::Stream(id, Reason::PROTOCOL_ERROR));
        }
        s.is_head = parts.method == Method::HEAD;
        let body = if end_stream {
            s.recv_open = false;
            crate::empty()
        } else {
            let r = RecvShared::new(
                self.signal.clone(),
                id,
                (self.cfg.stream_window as usize / 4).max(1),
            );
            s.recv = Some(r.clone());
            let recv = RecvBody::new(r, s.content_length);
            if tunnel {
                let (up, out) = crate::body::tunnel(recv);
                parts
                    .extensions
                    .insert(Upgrade(Arc::new(Mutex::new(Some(up)))));
                s.tunnel_body = Some(out);
                crate::empty()
            } else {
                crate::boxed(recv)
            }
        };
        let req = Request::from_parts(parts, body);
        // The request's start: this batch's clock reading.
        let fut = self.service.call(req, self.batch_clock);
        s.resp = Resp::Running(fut);
        self.streams.insert(id, s);
        // First poll after this batch of frames ([`Driver::first_polls`]), with the stream's
        // waker: ready responses (cache hits, fixed replies, refusals) are answered in this
        // read's write; one that waits is polled again by this task when its waker fires.
        self.inline_polls += 1;
        self.starting.push(id);
        Ok(())
    }

    /// The first polls of the streams the last batch of frames started, in their order. A
    /// batch's header blocks are decoded one after another and then its requests run one
    /// after another, so that each of the two code paths stays in the instruction cache for
    /// the whole batch (decoding between two requests evicted much of the request path).
    /// Past the output bound (`Settings::write_buffer`) the rest wait as woken streams in the
    /// queue, polled by [`Driver::produce`] once the output drains: the answers' heads, which
    /// go straight to the output, stay within the bound as before.
    pub(super) fn first_polls(&mut self) {
        let mut ids = std::mem::take(&mut self.starting);
        for (k, &id) in ids.iter().enumerate() {
            if self.output_len() >= self.cfg.write_buffer {
                for &id in &ids[k..] {
                    if let Some(s) = self.streams.get_mut(&id) {
                        s.woken = true;
                    }
                    self.enqueue(id);
                }
                break;
            }
            self.poll_response(id);
        }
        ids.clear();
        self.starting = ids;
    }

    /// Polls stream `id`'s request future (with the stream's waker, which marks the stream
    /// ready for this task) and starts its response once it is ready. A panic in the future
    /// ends only its stream (RST_STREAM INTERNAL_ERROR, as a panicking task did), never the
    /// connection.
    pub(super) fn poll_response(&mut self, id: u32) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        let Resp::Running(fut) = &mut s.resp else {
            return;
        };
        let waker = waker_of(&mut s.waker, &mut self.spare_wakers, &self.signal, id);
        let mut cx = Context::from_waker(&waker);
        // Unwind safety: after a panic the future is dropped with its stream, never polled
        // again, and the driver's own state is not touched inside the closure.
        let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Pin::new(&mut *fut).poll(&mut cx)
        }));
        match polled {
            Ok(Poll::Pending) => {}
            Ok(Poll::Ready((resp, stored))) => self.start_response(id, resp, stored),
            Err(payload) => {
                let panic = panic_message(&*payload);
                tracing::error!(stream = id, panic, "a request future panicked");
                // Our fault, not the client's: not counted as a reset.
                let _ = self.reset_stream(id, Reason::INTERNAL_ERROR, Charge::Server);
            }
        }
    }

    pub(super) fn on_rst(&mut self, head: Head, payload: &[u8]) -> FResult {
        if head.stream == 0 {
            return Err(Fault::Conn(
                Reason::PROTOCOL_ERROR,
                "RST_STREAM on stream 0",
            ));
        }
        if payload.len() != 4 {
            return Err(Fault::Conn(Reason::FRAME_SIZE_ERROR, "RST_STREAM length"));
        }
        if self.is_idle(head.stream) {
            return Err(Fault::Conn(
                Reason::PROTOCOL_ERROR,
                "RST_STREAM on an idle stream",
            ));
        }
        if let Some(s) = self.streams.get(&head.stream) {
            let unfinished = !matches!(s.resp, Resp::Done);
            self.drop_stream(head.stream, "stream reset by the client");
            if unfinished {
                return self.reset_flood();
            }
        }
        // A closed or finished stream's: nothing to do. If we had reset it, the frames the
        // client sent before it saw that are behind it now: whatever comes after its own
        // RST_STREAM it sent on a stream it knew closed, a STREAM_CLOSED error (RFC 9113 §5.1),
        // no longer ignored.
        self.forget_reset(head.stream);
        self.glitch()
    }

    pub(super) fn enqueue(&mut self, id: u32) {
        if let Some(s) = self.streams.get_mut(&id) {
            if !s.queued {
                s.queued = true;
                self.queue.push_back(id);
            }
        }
    }

    pub(super) fn remember_closed(&mut self, id: u32) {
        if id <= self.recently_closed_max && self.recently_closed.contains(&id) {
            return;
        }
        self.recently_closed_max = self.recently_closed_max.max(id);
        if self.recently_closed.len() == RECENTLY_CLOSED {
            self.recently_closed.pop_front();
        }
        self.recently_closed.push_back(id);
    }

    /// Drops a removed stream's id from the `blocked` list.
    pub(super) fn forget_blocked(&mut self, s: &Stream<S::Future>, id: u32) {
        if s.blocked {
            self.blocked.retain(|b| *b != id);
        }
    }

    /// Remembers a stream we reset, refused or ignored (bounded: the oldest is forgotten).
    pub(super) fn mark_reset(&mut self, id: u32) {
        if !self.locally_reset_set.insert(id) {
            return;
        }
        if self.locally_reset.len() == LOCALLY_RESET {
            if let Some(old) = self.locally_reset.pop_front() {
                self.locally_reset_set.remove(&old);
            }
        }
        self.locally_reset.push_back(id);
    }

    /// Forgets that we reset `id` (its frames are no longer ignored).
    pub(super) fn forget_reset(&mut self, id: u32) {
        if self.locally_reset_set.remove(&id) {
            self.locally_reset.retain(|r| *r != id);
        }
    }

    /// Removes a stream: aborts its response, fails its request body, releases its window.
    pub(super) fn drop_stream(&mut self, id: u32, why: &'static str) {
        let Some(s) = self.streams.remove(&id) else {
            return;
        };
        self.forget_blocked(&s, id);
        self.remember_closed(id);
        // The body's buffered bytes reach the connection window through `Signal::consumed`.
        if let Some(r) = &s.recv {
            r.fail(why);
            r.discard();
        }
        // A request future still running is dropped with the stream: its backend request is
        // cancelled here (a pooled connection in the middle of it is closed, never reused).
        drop_guarded(s.resp, id);
        self.spare_wakers.keep(s.waker);
    }

    /// Sends RST_STREAM for `id`, removes the stream if it was open, and remembers it as
    /// closed and as reset by us (its frames in flight are then ignored). A reset the client
    /// caused (refused or malformed stream, a frame it should not have sent) counts towards
    /// the rapid-reset limit: the error is the connection's end when it is over.
    pub(super) fn reset_stream(&mut self, id: u32, reason: Reason, charge: Charge) -> FResult {
        frame::put_rst(&mut self.write_buf, id, reason);
        if reason != Reason::STREAM_CLOSED {
            // STREAM_CLOSED answers a frame on a stream both sides had closed: the next one is
            // answered the same way.
            self.mark_reset(id);
        }
        if self.streams.contains_key(&id) {
            self.drop_stream(id, "stream reset");
        } else {
            self.remember_closed(id);
        }
        match charge {
            Charge::Client => self.reset_flood(),
            Charge::Server => Ok(()),
        }
    }

    /// Removes a stream that is finished both ways. A response finished before the client
    /// finished its request gets RST_STREAM(NO_ERROR) (RFC 9113 §8.1).
    pub(super) fn maybe_close(&mut self, id: u32) {
        let Some(s) = self.streams.get(&id) else {
            return;
        };
        if s.finished() {
            if let Some(s) = self.streams.remove(&id) {
                self.forget_blocked(&s, id);
                self.remember_closed(id);
                self.spare_wakers.keep(s.waker);
            }
            if self.streams.is_empty() {
                // The idle timeout counts from the last stream's end (the timer may be set
                // later: the preface's deadline).
                self.last_active = clock();
                self.arm(self.last_active + self.cfg.idle_timeout);
            }
        } else if matches!(s.resp, Resp::Done) && s.recv_open {
            let dropped = s.recv.as_ref().is_none_or(|r| r.dropped());
            if dropped {
                let _ = self.reset_stream(id, Reason::NO_ERROR, Charge::Server);
            }
        }
    }

    pub(super) fn on_ready(&mut self, id: u32) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        if let Some(r) = &s.recv {
            let consumed = r.take_consumed();
            // Stream window only: the connection's comes through `Signal::consumed`.
            let consumed = consumed.min(s.unreleased);
            s.unreleased -= consumed;
            if r.dropped() {
                // Nobody reads further data: stop granting (it is discarded on arrival).
                s.grant = 0;
                if matches!(s.resp, Resp::Done) {
                    self.maybe_close(id);
                    return;
                }
            } else {
                s.grant += consumed;
            }
        }
        s.woken = true;
        self.enqueue(id);
    }

    /// Encodes a response head and starts sending it. `stored`: a cache hit's stored head,
    /// sent ahead of the fields of `resp`'s map (its fields are never connection-specific).
    pub(super) fn start_response(
        &mut self,
        id: u32,
        resp: Response<Body>,
        stored: Option<S::Head>,
    ) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        let (mut parts, body) = resp.into_parts();
        crate::conn_headers::strip(&mut parts.headers, crate::conn_headers::Te::Remove);
        let stored_has = |name: &HeaderName| stored.as_ref().is_some_and(|h| h.contains(name));
        // Whether the map has `date` and `content-length`, in one look at its names (two
        // hashed lookups cost ~280 instructions per response; a response has a few names).
        let (mut has_date, mut has_length) = (false, false);
        for name in parts.headers.keys() {
            if name == header::DATE {
                has_date = true;
            } else if name == header::CONTENT_LENGTH {
                has_length = true;
            }
        }
        if !has_date && !stored_has(&header::DATE) {
            let date = self.date.get_or_insert_with(crate::date::now).clone();
            parts.headers.insert(header::DATE, date);
        }
        let mut body = body;
        // 204 and 304 never have a body (nor a length); HEAD gets the length a GET would get,
        // without the body (RFC 9110 §9.3.2, §15.3.5, §15.4.5).
        let no_body = matches!(
            parts.status,
            http::StatusCode::NO_CONTENT | http::StatusCode::NOT_MODIFIED
        );
        if let Some(t) = s.tunnel_body.take() {
            if parts.status.is_success() {
                parts.headers.remove(header::CONTENT_LENGTH);
                body = t;
            }
        } else if !no_body && !body.is_end_stream() {
            if let Some(n) = body.size_hint().exact() {
                if !has_length && !stored_has(&header::CONTENT_LENGTH) {
                    parts
                        .headers
                        .insert(header::CONTENT_LENGTH, HeaderValue::from(n));
                }
            }
        }
        if s.is_head || no_body {
            body = crate::empty();
        }
        let end = body.is_end_stream();
        self.scratch.clear();
        self.encoder.begin_block(&mut self.scratch);
        Encoder::status(&mut self.scratch, parts.status.as_u16());
        crate::encode_fields(
            &mut self.scratch,
            &parts.headers,
            &parts.extensions,
            stored.as_ref(),
        );
        frame::put_headers(
            &mut self.write_buf,
            id,
            &self.scratch,
            end,
            self.peer_max_frame,
        );
        if end {
            s.resp = Resp::Done;
            drop(body);
            self.maybe_close(id);
        } else {
            s.resp = Resp::Body(body);
            // Send what the body has now, in this batch.
            self.enqueue(id);
        }
    }

    /// Sends what the queued streams have, fairly, until the output buffer is full.
    pub(super) fn produce(&mut self) {
        // Bounded: a body yielding empty chunks forever cannot spin the task.
        let mut steps = 0usize;
        while self.output_len() < self.cfg.write_buffer && steps < 10_000 {
            steps += 1;
            let Some(id) = self.queue.pop_front() else {
                break;
            };
            let Some(s) = self.streams.get_mut(&id) else {
                continue;
            };
            s.queued = false;
            self.grant_stream(id);
            if self.step(id) {
                // A stream in the middle of a body chunk goes on first: its chunk is freed
                // before other streams' bodies are read (round-robin per write would hold one
                // chunk per stream at once: 1,000 streams x 128 KiB).
                let mid_chunk = self.streams.get(&id).is_some_and(|s| !s.pending.is_empty());
                if let Some(s) = self.streams.get_mut(&id) {
                    s.queued = true;
                    if mid_chunk {
                        self.queue.push_front(id);
                    } else {
                        self.queue.push_back(id);
                    }
                }
            }
        }
    }

    /// Advances one stream's response; true when it can do more right away.
    pub(super) fn step(&mut self, id: u32) -> bool {
        // A response still being produced: polled only when its waker fired (the stream may
        // be queued for a window change or a grant, which the future does not wait for).
        if let Some(s) = self.streams.get_mut(&id) {
            if matches!(s.resp, Resp::Running(_)) {
                if std::mem::take(&mut s.woken) {
                    self.poll_response(id);
                }
                return false;
            }
        }
        for _ in 0..FRAMES_PER_TURN {
            let Some(s) = self.streams.get_mut(&id) else {
                return false;
            };
            let Resp::Body(body) = &mut s.resp else {
                return false;
            };
            if s.pending.is_empty() && !s.body_done {
                // Noop waker first (a ready body needs none), the stream's waker if pending.
                let mut polled =
                    Pin::new(&mut *body).poll_frame(&mut Context::from_waker(Waker::noop()));
                if polled.is_pending() {
                    let waker = waker_of(&mut s.waker, &mut self.spare_wakers, &self.signal, id);
                    polled = Pin::new(&mut *body).poll_frame(&mut Context::from_waker(&waker));
                }
                let s = self.streams.get_mut(&id).expect("present");
                let Resp::Body(body) = &mut s.resp else {
                    unreachable!()
                };
                match polled {
                    Poll::Pending => return false,
                    Poll::Ready(None) => s.body_done = true,
                    Poll::Ready(Some(Err(e))) => {
                        tracing::debug!(error = %e, stream = id, "response body failed");
                        let _ = self.reset_stream(id, Reason::INTERNAL_ERROR, Charge::Server);
                        return false;
                    }
                    Poll::Ready(Some(Ok(f))) => match f.into_data() {
                        Ok(d) => {
                            s.pending = d;
                            if body.is_end_stream() {
                                s.body_done = true;
                            }
                        }
                        Err(f) => {
                            if let Ok(t) = f.into_trailers() {
                                s.trailers = Some(Box::new(t));
                            }
                            s.body_done = true;
                        }
                    },
                }
            }
            let s = self.streams.get_mut(&id).expect("present");
            if !s.pending.is_empty() {
                let avail = s.send_window.min(self.conn_send_window);
                if avail <= 0 && self.read_closed {
                    // After the client's EOF no window can open (see `cancel_blocked`).
                    tracing::debug!(stream = id, "no flow-control window after the client's EOF");
                    self.service.blocked_at_eof();
                    let _ = self.reset_stream(id, Reason::CANCEL, Charge::Server);
                    return false;
                }
                if avail <= 0 {
                    if !s.blocked {
                        s.blocked = true;
                        self.blocked.push(id);
                    }
                    if s.stalled.is_none() {
                        // The send-progress clock of this stream starts (one timer per
                        // connection: armed to the earliest deadline).
                        let now = clock();
                        s.stalled = Some(now);
                        self.arm(now + self.cfg.send_timeout);
                    }
                    return false;
                }
                let n = s
                    .pending
                    .len()
                    .min(avail as usize)
                    .min(self.peer_max_frame.min(MAX_DATA_FRAME));
                let chunk = s.pending.split_to(n);
                s.stalled = None;
                s.send_window -= n as i64;
                self.conn_send_window -= n as i64;
                let end = s.pending.is_empty() && s.body_done && s.trailers.is_none();
                if end {
                    s.resp = Resp::Done;
                }
                self.put_data(id, chunk, end);
                self.data_out = true;
                if end {
                    self.maybe_close(id);
                    return false;
                }
                if self.output_len() >= self.cfg.write_buffer {
                    return true;
                }
                continue;
            }
            if s.body_done {
                match s.trailers.take() {
                    Some(t) => {
                        self.scratch.clear();
                        self.encoder.begin_block(&mut self.scratch);
                        for (name, value) in t.iter() {
                            crate::encode_field(&mut self.scratch, name, value);
                        }
                        frame::put_headers(
                            &mut self.write_buf,
                            id,
                            &self.scratch,
                            true,
                            self.peer_max_frame,
                        );
                    }
                    None => frame::put_data(&mut self.write_buf, id, &[], true),
                }
                s.resp = Resp::Done;
                self.maybe_close(id);
                return false;
            }
        }
        true
    }
}
