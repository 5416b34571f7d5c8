//! Flow control (RFC 9113 §5.2, §6.9): DATA against the windows we grant, WINDOW_UPDATE and
//! INITIAL_WINDOW_SIZE from the client, and the credit given back as bodies are consumed.

use super::*;

impl<I: AsyncRead + AsyncWrite + Unpin, S: H2Service> Driver<I, S> {
    pub(super) fn on_data(&mut self, head: Head, payload: Bytes) -> FResult {
        let id = head.stream;
        if id == 0 {
            return Err(Fault::Conn(Reason::PROTOCOL_ERROR, "DATA on stream 0"));
        }
        let len = payload.len();
        self.conn_recv_window -= len as i64;
        if self.conn_recv_window < 0 {
            return Err(Fault::Conn(
                Reason::FLOW_CONTROL_ERROR,
                "connection window exceeded",
            ));
        }
        let content = if head.has(flag::PADDED) {
            let Some(c) = frame::unpad(&payload) else {
                return Err(Fault::Conn(Reason::PROTOCOL_ERROR, "bad padding"));
            };
            let start = 1;
            payload.slice(start..start + c.len())
        } else {
            payload
        };
        let end = head.has(flag::END_STREAM);
        if content.is_empty() && !end {
            self.empty_flood()?;
        }
        let Some(s) = self.streams.get_mut(&id) else {
            self.conn_release += len;
            if self.locally_reset_set.contains(&id) {
                // Sent before the client saw our RST_STREAM: the window is credited back
                // (and counted: the stream's window bounds the bytes, not the frames).
                return self.glitch();
            }
            if self.is_idle(id) {
                return Err(Fault::Conn(
                    Reason::PROTOCOL_ERROR,
                    "DATA on an idle stream",
                ));
            }
            return Err(Fault::Stream(id, Reason::STREAM_CLOSED));
        };
        if !s.recv_open {
            self.conn_release += len;
            return Err(Fault::Stream(id, Reason::STREAM_CLOSED));
        }
        s.recv_window -= len as i64;
        if s.recv_window < 0 {
            // Counted against the connection window all the same (RFC 9113 §6.9): credited
            // back, as the stream is reset.
            self.conn_release += len;
            return Err(Fault::Stream(id, Reason::FLOW_CONTROL_ERROR));
        }
        s.unreleased += len;
        // Padding is released at once (to the stream through `grant_stream`, queued below
        // when it is due: consumption alone may never queue a mostly padded upload).
        let padding = len - content.len();
        s.unreleased -= padding;
        self.conn_release += padding;
        s.grant += padding;
        let grant_due = padding > 0 && s.grant >= (self.cfg.stream_window as usize / 4).max(1);
        s.received += content.len() as u64;
        if s.content_length
            .is_some_and(|cl| s.received > cl || (end && s.received != cl))
        {
            // Not delivered: credited back, as the stream is reset.
            s.unreleased -= content.len();
            self.conn_release += content.len();
            return Err(Fault::Stream(id, Reason::PROTOCOL_ERROR));
        }
        let n = content.len();
        let accepted = match &s.recv {
            Some(r) => r.push(content),
            None => false,
        };
        if !accepted {
            s.unreleased -= n;
            self.conn_release += n;
        }
        if end {
            s.recv_open = false;
            if let Some(r) = s.recv.take() {
                r.finish(None);
            }
            self.maybe_close(id);
        }
        if grant_due {
            self.enqueue(id);
        }
        Ok(())
    }

    /// Applies the client's new INITIAL_WINDOW_SIZE to every stream's send window.
    pub(super) fn set_peer_initial_window(&mut self, v: i64) -> FResult {
        let delta = v - self.peer_initial_window;
        self.peer_initial_window = v;
        if delta == 0 {
            return Ok(());
        }
        for s in self.streams.values_mut() {
            s.send_window += delta;
            if s.send_window > MAX_WINDOW {
                return Err(Fault::Conn(
                    Reason::FLOW_CONTROL_ERROR,
                    "stream window overflow",
                ));
            }
        }
        if delta > 0 {
            let ids: Vec<u32> = self.streams.keys().copied().collect();
            for id in ids {
                self.enqueue(id);
            }
        }
        Ok(())
    }

    pub(super) fn on_window_update(&mut self, head: Head, payload: &[u8]) -> FResult {
        if payload.len() != 4 {
            return Err(Fault::Conn(
                Reason::FRAME_SIZE_ERROR,
                "WINDOW_UPDATE length",
            ));
        }
        let inc = (u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]])
            & 0x7fff_ffff) as i64;
        if head.stream == 0 {
            if inc == 0 {
                return Err(Fault::Conn(Reason::PROTOCOL_ERROR, "zero WINDOW_UPDATE"));
            }
            self.conn_send_window += inc;
            if self.conn_send_window > MAX_WINDOW {
                return Err(Fault::Conn(
                    Reason::FLOW_CONTROL_ERROR,
                    "connection window overflow",
                ));
            }
            for id in std::mem::take(&mut self.blocked) {
                if let Some(s) = self.streams.get_mut(&id) {
                    s.blocked = false;
                }
                self.enqueue(id);
            }
            return Ok(());
        }
        if self.is_idle(head.stream) {
            return Err(Fault::Conn(
                Reason::PROTOCOL_ERROR,
                "WINDOW_UPDATE on an idle stream",
            ));
        }
        let Some(s) = self.streams.get_mut(&head.stream) else {
            // A closed stream's: nothing to do.
            return self.glitch();
        };
        if inc == 0 {
            return Err(Fault::Stream(head.stream, Reason::PROTOCOL_ERROR));
        }
        s.send_window += inc;
        if s.send_window > MAX_WINDOW {
            return Err(Fault::Stream(head.stream, Reason::FLOW_CONTROL_ERROR));
        }
        self.enqueue(head.stream);
        Ok(())
    }

    // --------------------------------------------------------------- streams

    pub(super) fn release_windows(&mut self) {
        let half_conn = (self.cfg.conn_window / 2) as i64;
        // The flag first, then the count: a body consuming after the take sees the flag.
        self.signal.set_conn_low(self.conn_recv_window < half_conn);
        self.conn_release += self.signal.take_consumed();
        if self.conn_release > 0 && self.conn_recv_window < half_conn {
            let n = std::mem::take(&mut self.conn_release);
            self.conn_recv_window += n as i64;
            frame::put_window_update(&mut self.write_buf, 0, n as u32);
            self.signal.set_conn_low(self.conn_recv_window < half_conn);
        }
    }

    pub(super) fn grant_stream(&mut self, id: u32) {
        let half = (self.cfg.stream_window as usize / 4).max(1);
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        if s.recv_open && s.grant >= half {
            let n = std::mem::take(&mut s.grant);
            s.recv_window += n as i64;
            frame::put_window_update(&mut self.write_buf, id, n as u32);
        }
    }
}
