//! The connection task: construction, the poll loop (read, handle frames, produce, write),
//! deadlines and timers, frame dispatch, SETTINGS, GOAWAY and connection errors.

use super::streams::Resp;
use super::*;

impl<I: AsyncRead + AsyncWrite + Unpin, S: H2Service> Driver<I, S> {
    pub(super) fn new(
        io: I,
        service: S,
        cfg: Settings,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> Driver<I, S> {
        let now = clock();
        let mut write_buf = BytesMut::with_capacity(4096);
        frame::put_settings(
            &mut write_buf,
            &[
                (setting::MAX_CONCURRENT_STREAMS, cfg.max_concurrent_streams),
                (setting::INITIAL_WINDOW_SIZE, cfg.stream_window),
                (setting::MAX_HEADER_LIST_SIZE, cfg.max_header_bytes),
                (setting::ENABLE_CONNECT_PROTOCOL, 1),
            ],
        );
        if cfg.conn_window > frame::DEFAULT_WINDOW {
            frame::put_window_update(&mut write_buf, 0, cfg.conn_window - frame::DEFAULT_WINDOW);
        }
        let first_deadline = now + cfg.header_read_timeout;
        let gather = io.is_write_vectored();
        Driver {
            io,
            gather,
            service,
            stop: Box::pin(async move {
                let _ = stop.wait_for(|v| *v).await;
            }),
            stop_seen: false,
            signal: Arc::new(Signal::default()),
            ready: Vec::new(),
            spare_wakers: Default::default(),
            starting: Vec::new(),
            read_buf: BytesMut::with_capacity(READ_CHUNK),
            out: VecDeque::new(),
            out_len: 0,
            write_buf,
            peak_output: 0,
            unflushed: false,
            write_deferred: false,
            data_out: false,
            data_progress: false,
            scratch: BytesMut::with_capacity(1024),
            decoder: Decoder::new().watching_repeats(),
            kept_request: Default::default(),
            encoder: Encoder::new(),
            preface_done: false,
            frames_pending: false,
            inline_polls: 0,
            got_settings: false,
            read_closed: false,
            streams: HashMap::default(),
            queue: VecDeque::new(),
            blocked: Vec::new(),
            last_stream: 0,
            recently_closed: VecDeque::new(),
            recently_closed_max: 0,
            batch_clock: clock(),
            locally_reset: VecDeque::new(),
            locally_reset_set: Default::default(),
            cont: None,
            peer_initial_window: frame::DEFAULT_WINDOW as i64,
            peer_max_frame: frame::DEFAULT_MAX_FRAME_SIZE as usize,
            conn_send_window: frame::DEFAULT_WINDOW as i64,
            conn_recv_window: cfg.conn_window as i64,
            conn_release: 0,
            going_away: false,
            goaway_last: None,
            closing: None,
            settings_sent_at: now,
            settings_acked: false,
            early_refusals: 0,
            last_active: now,
            started: now,
            timer: Box::pin(tokio::time::sleep_until(first_deadline.into())),
            close_deadline: None,
            date: None,
            ping_sent: None,
            flood: Flood {
                since: now,
                resets: 0,
                control: 0,
                empty: 0,
                glitches: 0,
            },
            cfg,
        }
    }

    pub(super) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), H2Error>> {
        self.date = None;
        self.inline_polls = 0;
        // A write put off in the last poll goes out in this one, whatever woke the task.
        let may_defer = !std::mem::take(&mut self.write_deferred);
        let mut by_task = false;
        self.service.on_poll();
        for _ in 0..ROUNDS {
            // Graceful close requested (listener drain, shutdown).
            if !self.stop_seen && self.stop.as_mut().poll(cx).is_ready() {
                self.stop_seen = true;
                self.go_away(Reason::NO_ERROR, b"");
            }
            // Streams that were woken.
            by_task |= self.signal.take(&mut self.ready, cx.waker());
            let mut ready = std::mem::take(&mut self.ready);
            for id in ready.drain(..) {
                self.on_ready(id);
            }
            self.ready = ready;

            let mut progress = false;
            // Handle the frames left from the last read, or read and handle a batch of frames,
            // unless the output is not draining.
            if self.closing.is_none()
                && self.frames_pending
                && self.output_len() < self.cfg.write_buffer
            {
                // Frames left from an earlier read may have waited for the output to drain:
                // their requests start now, not at that read.
                self.batch_clock = clock();
                if let Err(f) = self.handle_frames() {
                    self.fault(f);
                }
                self.first_polls();
                progress = true;
            } else if self.closing.is_none()
                && !self.read_closed
                && self.output_len() < self.cfg.write_buffer
            {
                match self.poll_read(cx) {
                    Poll::Ready(Ok(0)) => {
                        self.read_closed = true;
                        self.on_read_closed();
                        self.cancel_running();
                        self.cancel_blocked();
                        if self.got_settings {
                            // No new streams can come: the client learns which it sent were
                            // taken, if it still reads; the connection closes when the streams
                            // still sending are done.
                            self.go_away(Reason::NO_ERROR, b"");
                        }
                        progress = true;
                    }
                    Poll::Ready(Ok(_)) => {
                        self.last_active = clock();
                        self.batch_clock = self.last_active;
                        self.ping_sent = None;
                        if let Err(f) = self.handle_frames() {
                            self.fault(f);
                        }
                        self.first_polls();
                        progress = true;
                    }
                    Poll::Ready(Err(e)) => {
                        // The client is gone (reset, TLS failure): nothing can reach it, so
                        // every stream ends here, its request cancelled (see `cancel_running`).
                        self.read_closed = true;
                        self.on_read_closed();
                        self.clear_output();
                        self.abort_all();
                        return Poll::Ready(Err(e.into()));
                    }
                    Poll::Pending => {}
                }
            }
            // Answer what is ready, then write once.
            if self.closing.is_none() {
                self.produce();
                self.release_windows();
            }
            if by_task && may_defer && !self.write_deferred && self.should_defer_write() {
                self.write_deferred = defer_wake(cx);
            }
            if !self.write_deferred {
                match self.poll_write(cx) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(e)) => {
                        self.abort_all();
                        return Poll::Ready(Err(e.into()));
                    }
                    Poll::Pending => {}
                }
            }
            // Finished?
            let done = self.closing.is_some()
                || ((self.going_away || self.read_closed) && self.streams.is_empty());
            if done {
                // Only the final flush is left: bounded, whether or not the client reads (a
                // drained connection's GOAWAY to a client that does not read would wait forever).
                self.set_close_deadline();
            }
            if done && self.output_len() == 0 {
                let expired = self.close_deadline.is_some_and(|d| clock() >= d);
                match Pin::new(&mut self.io).poll_shutdown(cx) {
                    Poll::Pending if !expired => {
                        let _ = self.poll_timer(cx);
                        return Poll::Pending;
                    }
                    _ => {
                        self.abort_all();
                        return Poll::Ready(match self.closing.take() {
                            Some(e) => Err(e),
                            None => Ok(()),
                        });
                    }
                }
            }
            if let Poll::Ready(()) = self.poll_timer(cx) {
                progress = true;
            }
            if self.frames_pending
                && self.inline_polls >= INLINE_FIRST_POLLS
                && self.closing.is_none()
                && self.output_len() < self.cfg.write_buffer
            {
                // This poll's budget is spent: yield, and go on in the next poll.
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let more_work = (!self.queue.is_empty() || self.frames_pending)
                && self.output_len() < self.cfg.write_buffer;
            if !progress && !more_work {
                if self.streams.is_empty() {
                    // Idle: the service holds nothing for requests (a reload frees the old
                    // config), nor the connection large empty buffers.
                    self.service.on_idle();
                    self.shrink_buffers();
                }
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    // ------------------------------------------------------------------ I/O

    /// Whether this poll's output, which holds answers made ready by another task (the poll
    /// checks that: `Signal::take`), should wait for the runtime's next turn: there is some,
    /// below the output bound, and other streams of the connection are still being answered.
    /// That task (an h2c backend connection's) answers streams of many connections per read:
    /// after the turn (tokio's `yield_now`, which wakes this task after the runtime's next look
    /// at the I/O driver, behind the tasks that look wakes) its next read's answers go in the
    /// same write. Bounded: the next poll writes, whatever woke it (`write_deferred`), so a
    /// write waits at most one turn; the output bound and what it stops are unchanged (reading
    /// stops at the bound as before, and past the bound nothing waits). Answers woken by the
    /// I/O driver or a timer (between task polls) are not held: that turn's wake-ups came
    /// already, and an idle runtime would pay an `epoll_wait` for nothing.
    fn should_defer_write(&self) -> bool {
        let len = self.output_len();
        len > 0
            && len < self.cfg.write_buffer
            && self.closing.is_none()
            && !self.going_away
            && !self.read_closed
            && !self.streams.is_empty()
    }

    /// Frees the read and write buffers when they are empty and larger than [`IDLE_BUFFER`]:
    /// an idle keep-alive connection holds no more than that of each (they grow again with
    /// the next responses).
    pub(super) fn shrink_buffers(&mut self) {
        shrink_idle(&mut self.write_buf);
        shrink_idle(&mut self.read_buf);
        if self.out.is_empty() && self.out.capacity() > 8 {
            self.out = VecDeque::new();
        }
        self.spare_wakers.clear();
    }

    pub(super) fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        self.read_buf.reserve(READ_CHUNK);
        let fut = self.io.read_buf(&mut self.read_buf);
        let mut fut = std::pin::pin!(fut);
        fut.as_mut().poll(cx)
    }

    /// Output bytes queued: `out` and `write_buf`.
    pub(super) fn output_len(&self) -> usize {
        self.out_len + self.write_buf.len()
    }

    /// Queues a DATA frame: its header in `write_buf`, and its payload copied after it when
    /// small or when the I/O cannot gather, else queued as it is (the vectored write gathers
    /// it; no copy).
    pub(super) fn put_data(&mut self, id: u32, data: Bytes, end: bool) {
        if data.len() < GATHER_DATA || !self.gather {
            frame::put_data(&mut self.write_buf, id, &data, end);
            return;
        }
        let flags = if end { flag::END_STREAM } else { 0 };
        frame::put_head(&mut self.write_buf, data.len(), kind::DATA, flags, id);
        let frames = self.write_buf.split().freeze();
        self.out_len += frames.len() + data.len();
        self.out.push_back(frames);
        self.out.push_back(data);
    }

    /// Drops the first `n` output bytes (written).
    fn consume_output(&mut self, mut n: usize) {
        while n > 0 {
            let Some(seg) = self.out.front_mut() else {
                break;
            };
            if n < seg.len() {
                seg.advance(n);
                self.out_len -= n;
                return;
            }
            n -= seg.len();
            self.out_len -= seg.len();
            self.out.pop_front();
        }
        self.write_buf.advance(n);
    }

    /// Drops all output (the connection gives up on it).
    pub(super) fn clear_output(&mut self) {
        self.out.clear();
        self.out_len = 0;
        self.write_buf.clear();
    }

    /// One write of the output's first bytes: `write_buf` alone with a plain write, else up to
    /// [`MAX_IOVECS`] buffers with a vectored one.
    fn poll_write_some(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        if self.out.is_empty() {
            return Pin::new(&mut self.io).poll_write(cx, &self.write_buf);
        }
        let mut bufs = [std::io::IoSlice::new(&[]); MAX_IOVECS];
        let mut k = 0;
        for seg in self.out.iter().take(MAX_IOVECS) {
            bufs[k] = std::io::IoSlice::new(seg);
            k += 1;
        }
        if k < MAX_IOVECS && !self.write_buf.is_empty() {
            bufs[k] = std::io::IoSlice::new(&self.write_buf);
            k += 1;
        }
        Pin::new(&mut self.io).poll_write_vectored(cx, &bufs[..k])
    }

    /// Writes the output; Ready(Ok) when it is empty and flushed. The flush is
    /// retried until it completes, also in later polls with nothing new to write:
    /// tokio-rustls takes plaintext (`Ok(n)`) while the socket would block and sends the
    /// records only on a later write or flush, so the end of a response would otherwise wait
    /// for the connection's next output.
    ///
    /// Outside tokio's cooperative budget: the task's budget (128 resource operations per
    /// poll) is spent by the stream futures this task polls (each backend read or write, each
    /// timer), and answers they made ready in this poll must not wait a scheduler tick for the
    /// socket because of that (with many busy streams, every write would). The write is
    /// bounded without it: by the output (at most `Settings::write_buffer` plus one frame)
    /// and the socket taking it. Reads stay under the budget: a connection whose futures spent
    /// it reads its next frames (new work) in its next poll, after the other tasks.
    pub(super) fn poll_write(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let mut write =
            tokio::task::coop::unconstrained(std::future::poll_fn(|cx| self.write_output(cx)));
        Pin::new(&mut write).poll(cx)
    }

    fn write_output(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.output_len() > self.peak_output {
            self.peak_output = self.output_len();
            PEAK_OUTPUT.fetch_max(self.peak_output, Ordering::Relaxed);
        }
        while self.output_len() > 0 {
            match self.poll_write_some(cx) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => {
                    self.consume_output(n);
                    self.unflushed = true;
                    self.data_progress |= self.data_out;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    if self.unflushed {
                        let _ = Pin::new(&mut self.io).poll_flush(cx)?;
                    }
                    return Poll::Pending;
                }
            }
        }
        self.data_out = false;
        if self.unflushed {
            std::task::ready!(Pin::new(&mut self.io).poll_flush(cx))?;
            self.unflushed = false;
        }
        Poll::Ready(Ok(()))
    }

    /// Handles the deadlines that have passed, then re-arms the timer to the next one still in
    /// the future (a fired `Sleep` stays ready: returning without a reset would spin the task).
    pub(super) fn poll_timer(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        let now = clock();
        let fired = self.on_deadlines(now);
        let next = self.next_deadline(now);
        self.timer.as_mut().reset(next.into());
        // Registers the waker for the new deadline (it is in the future: pending).
        let _ = self.timer.as_mut().poll(cx);
        if fired {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// Acts on every deadline at or before `now`; true when one did. Each action changes the
    /// state so that its deadline is no longer one of `next_deadline`'s.
    pub(super) fn on_deadlines(&mut self, now: Instant) -> bool {
        if let Some(d) = self.close_deadline {
            if now >= d {
                // The client does not read: give up on the final flush.
                self.clear_output();
                self.closing
                    .get_or_insert(H2Error::Protocol(Reason::NO_ERROR, "close timed out"));
                return true;
            }
        }
        if self.closing.is_some() {
            // Closing: only the close deadline counts.
            return false;
        }
        let hrt = self.cfg.header_read_timeout;
        if !self.got_settings && now >= self.started + hrt {
            self.service.limit_hit("h2_preface_timeout");
            self.closing = Some(H2Error::Protocol(Reason::PROTOCOL_ERROR, "no preface"));
            self.set_close_deadline();
            return true;
        }
        if !self.settings_acked && now >= self.settings_ack_deadline() {
            self.fault(Fault::Conn(
                Reason::SETTINGS_TIMEOUT,
                "SETTINGS not acknowledged",
            ));
            return true;
        }
        if let Some((_, started)) = &self.cont {
            if now >= *started + hrt {
                self.service.limit_hit("header_read_timeout");
                self.fault(Fault::Conn(Reason::PROTOCOL_ERROR, "header block timeout"));
                return true;
            }
        }
        // Responses held by a flow-control window the client keeps at zero: reset (all of
        // them at once; the keep-alive checks below still run).
        let fired = self.reset_stalled(now);
        if fired && self.closing.is_some() {
            return true;
        }
        if self.streams.is_empty() && self.got_settings {
            if !self.going_away && now >= self.last_active + self.cfg.idle_timeout {
                self.service.limit_hit("idle_timeout");
                self.go_away(Reason::NO_ERROR, b"idle");
                self.set_close_deadline();
                return true;
            }
        } else if self.got_settings {
            // Streams are open but the client has been silent: is it still there? A PING,
            // and the connection ends when no frame comes within `header_read_timeout` (a response
            // waiting for flow-control window from a vanished client would wait forever).
            // A client reading our DATA is there, even if it sends nothing (large windows)
            // and our PING waits behind that DATA.
            if std::mem::take(&mut self.data_progress) {
                self.last_active = now;
                self.ping_sent = None;
                return false;
            }
            match self.ping_sent {
                None if now >= self.last_active + self.cfg.idle_timeout => {
                    frame::put_ping(&mut self.write_buf, *b"sweetyKA");
                    self.ping_sent = Some(now);
                    return true;
                }
                Some(at) if now >= at + hrt => {
                    self.service.limit_hit("h2_keepalive_timeout");
                    self.fault(Fault::Conn(
                        Reason::NO_ERROR,
                        "keep-alive PING not answered",
                    ));
                    return true;
                }
                _ => {}
            }
        }
        fired
    }

    /// Resets every stream whose response has waited for flow-control window for
    /// `send_timeout` with no byte sent, with RST_STREAM(CANCEL): the stream is no longer
    /// needed (RFC 9113 §7); the client broke no rule, so neither FLOW_CONTROL_ERROR nor
    /// PROTOCOL_ERROR. Dropping the stream drops its response body, which frees the request
    /// slot and aborts (never pools) the upstream request. True when one was reset.
    pub(super) fn reset_stalled(&mut self, now: Instant) -> bool {
        let limit = self.cfg.send_timeout;
        let stalled: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, s)| s.stalled.is_some_and(|at| now >= at + limit))
            .map(|(id, _)| *id)
            .collect();
        for &id in &stalled {
            self.service.limit_hit("h2_send_timeout");
            tracing::debug!(stream = id, "no flow-control window within send_timeout");
            if let Err(f) = self.reset_stream(id, Reason::CANCEL, Charge::Server) {
                self.fault(f);
            }
        }
        if !stalled.is_empty() && self.streams.is_empty() {
            self.last_active = now;
        }
        !stalled.is_empty()
    }

    /// The earliest deadline after `now` (at most one idle timeout away).
    pub(super) fn next_deadline(&self, now: Instant) -> Instant {
        let hrt = self.cfg.header_read_timeout;
        let mut next = now + self.cfg.idle_timeout;
        let mut consider = |d: Instant| {
            if d > now && d < next {
                next = d;
            }
        };
        if let Some(d) = self.close_deadline {
            consider(d);
        }
        if self.closing.is_some() {
            return next;
        }
        if !self.got_settings {
            consider(self.started + hrt);
        }
        if !self.settings_acked {
            consider(self.settings_ack_deadline());
        }
        if let Some((_, started)) = &self.cont {
            consider(*started + hrt);
        }
        // The earliest send-progress deadline (a scan of at most max_concurrent_streams,
        // once per timer firing).
        for s in self.streams.values() {
            if let Some(at) = s.stalled {
                consider(at + self.cfg.send_timeout);
            }
        }
        if self.streams.is_empty() && self.got_settings {
            if !self.going_away {
                consider(self.last_active + self.cfg.idle_timeout);
            }
        } else if self.got_settings {
            match self.ping_sent {
                None => consider(self.last_active + self.cfg.idle_timeout),
                Some(at) => consider(at + hrt),
            }
        }
        next
    }

    pub(super) fn settings_ack_deadline(&self) -> Instant {
        self.settings_sent_at + self.cfg.header_read_timeout.max(Duration::from_secs(5))
    }

    /// Re-arms the timer when a deadline earlier than the current one appears. A timer that
    /// has already fired is left alone: `poll_timer` handles it and re-arms to the next
    /// deadline (every deadline is derived from the state, so none is lost).
    pub(super) fn arm(&mut self, at: Instant) {
        let current = self.timer.deadline().into_std();
        if at < current && current > clock() {
            self.timer.as_mut().reset(at.into());
        }
    }

    // ---------------------------------------------------------------- frames

    /// Handles the complete frames in the read buffer, until the output reaches
    /// `Settings::write_buffer` (what one read can make the connection queue is bounded: a read of
    /// 15-byte requests or PINGs would otherwise queue an answer to each); the rest wait
    /// (`frames_pending`) until the output has drained.
    pub(super) fn handle_frames(&mut self) -> FResult {
        self.frames_pending = false;
        if !self.preface_done {
            let n = self.read_buf.len().min(frame::PREFACE.len());
            if self.read_buf[..n] != frame::PREFACE[..n] {
                self.closing = Some(H2Error::Protocol(Reason::PROTOCOL_ERROR, "bad preface"));
                return Ok(());
            }
            if n < frame::PREFACE.len() {
                return Ok(());
            }
            self.read_buf.advance(frame::PREFACE.len());
            self.preface_done = true;
        }
        while self.read_buf.len() >= HEADER_LEN && self.closing.is_none() {
            if self.output_len() >= self.cfg.write_buffer || self.inline_polls >= INLINE_FIRST_POLLS
            {
                self.frames_pending = true;
                break;
            }
            let head = Head::parse(&self.read_buf);
            if head.len > LOCAL_MAX_FRAME {
                return Err(Fault::Conn(Reason::FRAME_SIZE_ERROR, "frame too large"));
            }
            let total = HEADER_LEN + head.len as usize;
            if self.read_buf.len() < total {
                break;
            }
            if !self.got_settings {
                if head.kind != kind::SETTINGS || head.has(flag::ACK) {
                    return Err(Fault::Conn(Reason::PROTOCOL_ERROR, "expected SETTINGS"));
                }
                self.got_settings = true;
                // From now on the idle timeout applies (the timer held the preface's deadline).
                self.arm(self.last_active + self.cfg.idle_timeout);
            }
            let r = if head.kind == kind::DATA {
                // DATA payloads go to request bodies as slices of the read buffer (no copy;
                // small ones are copied together there, see `body::COALESCE_BELOW`).
                let mut raw = self.read_buf.split_to(total);
                raw.advance(HEADER_LEN);
                if self.cont.is_some() {
                    Err(Fault::Conn(Reason::PROTOCOL_ERROR, "expected CONTINUATION"))
                } else {
                    self.on_data(head, raw.freeze())
                }
            } else {
                // Other frames are handled in place in the read buffer.
                let buf = std::mem::take(&mut self.read_buf);
                let r = self.frame(head, &buf[HEADER_LEN..total]);
                self.read_buf = buf;
                self.read_buf.advance(total);
                r
            };
            match r {
                Ok(()) => {}
                Err(Fault::Stream(id, reason)) => {
                    // Stream errors the client provokes count like its own resets.
                    self.reset_stream(id, reason, Charge::Client)?;
                }
                Err(f) => return Err(f),
            }
        }
        Ok(())
    }

    pub(super) fn frame(&mut self, head: Head, payload: &[u8]) -> FResult {
        if let Some((c, _)) = &self.cont {
            if head.kind != kind::CONTINUATION || head.stream != c.stream {
                return Err(Fault::Conn(Reason::PROTOCOL_ERROR, "expected CONTINUATION"));
            }
        }
        match head.kind {
            kind::HEADERS => self.on_headers(head, payload),
            kind::PRIORITY => {
                if head.stream == 0 {
                    return Err(Fault::Conn(Reason::PROTOCOL_ERROR, "PRIORITY on stream 0"));
                }
                self.control_flood()?;
                if payload.len() != 5 {
                    return Err(Fault::Stream(head.stream, Reason::FRAME_SIZE_ERROR));
                }
                if frame::priority_dependency(payload) == head.stream {
                    return Err(Fault::Stream(head.stream, Reason::PROTOCOL_ERROR));
                }
                Ok(())
            }
            kind::RST_STREAM => self.on_rst(head, payload),
            kind::SETTINGS => self.on_settings(head, payload),
            kind::PUSH_PROMISE => Err(Fault::Conn(
                Reason::PROTOCOL_ERROR,
                "PUSH_PROMISE from a client",
            )),
            kind::PING => {
                if head.stream != 0 {
                    return Err(Fault::Conn(Reason::PROTOCOL_ERROR, "PING on a stream"));
                }
                if payload.len() != 8 {
                    return Err(Fault::Conn(Reason::FRAME_SIZE_ERROR, "PING length"));
                }
                self.control_flood()?;
                if !head.has(flag::ACK) {
                    frame::put_ping_ack(&mut self.write_buf, payload);
                }
                Ok(())
            }
            kind::GOAWAY => {
                if head.stream != 0 {
                    return Err(Fault::Conn(Reason::PROTOCOL_ERROR, "GOAWAY on a stream"));
                }
                if payload.len() < 8 {
                    return Err(Fault::Conn(Reason::FRAME_SIZE_ERROR, "GOAWAY length"));
                }
                self.control_flood()?;
                // The client closes the connection when its streams are done (the idle
                // timeout bounds the wait); nothing to change here.
                let code = u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]);
                if code != 0 {
                    tracing::debug!(reason = %Reason(code), "client sent GOAWAY");
                }
                Ok(())
            }
            kind::WINDOW_UPDATE => self.on_window_update(head, payload),
            kind::CONTINUATION => self.on_continuation(head, payload),
            // Unknown frame types are ignored (RFC 9113 §4.1), and counted.
            _ => self.glitch(),
        }
    }

    pub(super) fn on_settings(&mut self, head: Head, payload: &[u8]) -> FResult {
        if head.stream != 0 {
            return Err(Fault::Conn(Reason::PROTOCOL_ERROR, "SETTINGS on a stream"));
        }
        if head.has(flag::ACK) {
            if !payload.is_empty() {
                return Err(Fault::Conn(Reason::FRAME_SIZE_ERROR, "SETTINGS ACK length"));
            }
            self.settings_acked = true;
            return self.control_flood();
        }
        if !payload.len().is_multiple_of(6) {
            return Err(Fault::Conn(Reason::FRAME_SIZE_ERROR, "SETTINGS length"));
        }
        self.control_flood()?;
        // INITIAL_WINDOW_SIZE changes every stream's window: only the frame's last value is
        // applied, once (a frame of 2,730 entries would otherwise walk the streams per entry).
        let mut initial_window = None;
        for (id, v) in frame::settings_params(payload) {
            match id {
                setting::ENABLE_PUSH | setting::ENABLE_CONNECT_PROTOCOL if v > 1 => {
                    return Err(Fault::Conn(Reason::PROTOCOL_ERROR, "boolean setting"));
                }
                setting::INITIAL_WINDOW_SIZE => {
                    if v as i64 > MAX_WINDOW {
                        return Err(Fault::Conn(
                            Reason::FLOW_CONTROL_ERROR,
                            "INITIAL_WINDOW_SIZE",
                        ));
                    }
                    initial_window = Some(v as i64);
                }
                setting::MAX_FRAME_SIZE => {
                    if !(frame::DEFAULT_MAX_FRAME_SIZE..=frame::MAX_MAX_FRAME_SIZE).contains(&v) {
                        return Err(Fault::Conn(Reason::PROTOCOL_ERROR, "MAX_FRAME_SIZE"));
                    }
                    self.peer_max_frame = v as usize;
                }
                // The encoder never uses the dynamic table; the other settings do not
                // constrain a server.
                _ => {}
            }
        }
        if let Some(v) = initial_window {
            self.set_peer_initial_window(v)?;
        }
        frame::put_settings_ack(&mut self.write_buf);
        Ok(())
    }

    pub(super) fn on_read_closed(&mut self) {
        for s in self.streams.values_mut() {
            if let Some(r) = s.recv.take() {
                r.fail("connection closed");
            }
            s.recv_open = false;
        }
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in ids {
            self.maybe_close(id);
        }
    }

    /// The client closed its side (EOF): it can no longer acknowledge our SETTINGS or PING,
    /// nor send WINDOW_UPDATE, and a request it has not had an answer to is one it no longer
    /// waits for (an HTTP/2 client does not half-close to wait for answers; h2 ends every
    /// stream at EOF). Each request future still running is dropped at once, cancelling its
    /// backend request and releasing its slots, as the HTTP/1.1 engine does when its client
    /// goes, with RST_STREAM(CANCEL) in case the client still reads. Before, they ran until the
    /// backend answered or the keep-alive PING went unanswered (up to about 70 s). Responses
    /// already being sent go on while they have flow-control window (the client may read
    /// them; `send_timeout` bounds a client that does not); those without are reset too
    /// ([`Driver::cancel_blocked`]).
    pub(super) fn cancel_running(&mut self) {
        let running: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, s)| matches!(s.resp, Resp::Running(_)))
            .map(|(id, _)| *id)
            .collect();
        for id in running {
            let _ = self.reset_stream(id, Reason::CANCEL, Charge::Server);
        }
    }

    /// The client closed its side (EOF): a response waiting for flow-control window (the
    /// stream's or the connection's) can never get it, as only the client's WINDOW_UPDATE or
    /// SETTINGS opens a window. Each such stream is reset at once with RST_STREAM(CANCEL),
    /// its body dropped (its read-ahead file chunks, its upstream request), rather than held
    /// until `send_timeout`. Responses that still have window go on; one that runs out of it
    /// later is reset when it does (`step`). A half-closed client that still reads gets the
    /// RST_STREAM frames.
    pub(super) fn cancel_blocked(&mut self) {
        let conn_window = self.conn_send_window;
        let blocked: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, s)| s.waits_for_window(conn_window))
            .map(|(id, _)| *id)
            .collect();
        for id in blocked {
            tracing::debug!(stream = id, "no flow-control window after the client's EOF");
            self.service.blocked_at_eof();
            let _ = self.reset_stream(id, Reason::CANCEL, Charge::Server);
        }
    }

    /// Sends GOAWAY: no new streams; the connection closes when the open ones are done.
    pub(super) fn go_away(&mut self, reason: Reason, debug: &[u8]) {
        if !self.going_away {
            self.going_away = true;
            let last = *self.goaway_last.get_or_insert(self.last_stream);
            frame::put_goaway(&mut self.write_buf, last, reason, debug);
        }
    }

    pub(super) fn fault(&mut self, f: Fault) {
        match f {
            Fault::Stream(id, reason) => {
                if let Err(f) = self.reset_stream(id, reason, Charge::Client) {
                    self.fault(f);
                }
            }
            Fault::Conn(reason, why) => {
                if self.closing.is_some() {
                    // Already closing: one GOAWAY, one error.
                    return;
                }
                self.service.connection_error(reason, why);
                // A second GOAWAY after a graceful one carries the error, with the first's id.
                self.going_away = false;
                self.go_away(reason, why.as_bytes());
                self.closing = Some(H2Error::Protocol(reason, why));
                self.abort_all();
                self.set_close_deadline();
            }
        }
    }

    pub(super) fn set_close_deadline(&mut self) {
        if self.close_deadline.is_none() {
            let d = clock() + self.cfg.header_read_timeout;
            self.close_deadline = Some(d);
            self.arm(d);
        }
    }

    pub(super) fn abort_all(&mut self) {
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in ids {
            self.drop_stream(id, "connection closed");
        }
    }
}

/// Frees `buf` when it is empty and its allocation is larger than [`IDLE_BUFFER`]. Its
/// `capacity()` alone does not tell: written or consumed bytes move the start of the buffer
/// forward, so a drained 64 KiB output buffer may report a few bytes of capacity while it
/// holds all 64 KiB. `try_reclaim` moves the start back when the allocation is this buffer's
/// alone and answers whether it then has more than [`IDLE_BUFFER`] bytes: no copy (the buffer
/// is empty) and no allocation.
fn shrink_idle(buf: &mut BytesMut) {
    if buf.is_empty() && buf.try_reclaim(IDLE_BUFFER + 1) {
        *buf = BytesMut::new();
    }
}

/// Registers a wake-up of this task for after the runtime's next look at the I/O driver
/// (tokio's `yield_now`: woken tasks that are queued run first); true when registered.
fn defer_wake(cx: &mut Context<'_>) -> bool {
    let mut y = std::pin::pin!(tokio::task::yield_now());
    y.as_mut().poll(cx).is_pending()
}
