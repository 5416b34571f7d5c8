//! Flood guards: per-connection, per-second counters of resets, control frames, empty
//! frames and glitches; past a limit the connection ends with GOAWAY ENHANCE_YOUR_CALM.
//!
//! A glitch is a frame that costs the server a read, a parse and a lookup but delivers
//! nothing: an unknown frame type (ignored, RFC 9113 §4.1), WINDOW_UPDATE or RST_STREAM on a
//! stream already closed, DATA or trailers on a stream we reset (credited back and dropped).
//! Each is legal once; a client that sends them by the thousand is using the connection to
//! burn CPU (nghttp2 counts the same class as "glitches", HAProxy as `glitches`, Envoy limits
//! frames without payload and control frames). Acknowledgements (SETTINGS and PING ACK) and a
//! client's GOAWAY count as control frames.

use super::*;

/// Per-second counters of the flood guards.
pub(super) struct Flood {
    pub(super) since: Instant,
    pub(super) resets: u32,
    pub(super) control: u32,
    pub(super) empty: u32,
    pub(super) glitches: u32,
}

impl Flood {
    /// Counts one event; true when the connection is over a limit.
    pub(super) fn hit(&mut self, which: fn(&mut Flood) -> &mut u32, limit: u32) -> bool {
        let now = clock();
        if now.duration_since(self.since) >= Duration::from_secs(1) {
            self.since = now;
            self.resets = 0;
            self.control = 0;
            self.empty = 0;
            self.glitches = 0;
        }
        let c = which(self);
        *c += 1;
        *c > limit
    }
}

impl<I: AsyncRead + AsyncWrite + Unpin, S: H2Service> Driver<I, S> {
    pub(super) fn control_flood(&mut self) -> FResult {
        if self.flood.hit(|f| &mut f.control, MAX_CONTROL_PER_SEC) {
            self.service.limit_hit("h2_control_flood");
            return Err(Fault::Conn(
                Reason::ENHANCE_YOUR_CALM,
                "control frame flood",
            ));
        }
        Ok(())
    }

    pub(super) fn empty_flood(&mut self) -> FResult {
        if self.flood.hit(|f| &mut f.empty, MAX_EMPTY_PER_SEC) {
            self.service.limit_hit("h2_empty_frame_flood");
            return Err(Fault::Conn(Reason::ENHANCE_YOUR_CALM, "empty frame flood"));
        }
        Ok(())
    }

    /// Counts a frame that delivered nothing (see the module docs).
    pub(super) fn glitch(&mut self) -> FResult {
        if self.flood.hit(|f| &mut f.glitches, MAX_GLITCHES_PER_SEC) {
            self.service.limit_hit("h2_glitch_flood");
            return Err(Fault::Conn(
                Reason::ENHANCE_YOUR_CALM,
                "flood of frames that do nothing",
            ));
        }
        Ok(())
    }

    pub(super) fn reset_flood(&mut self) -> FResult {
        if self
            .flood
            .hit(|f| &mut f.resets, self.cfg.max_resets_per_sec)
        {
            self.service.limit_hit("h2_rapid_reset");
            return Err(Fault::Conn(
                Reason::ENHANCE_YOUR_CALM,
                "too many stream resets",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flood_counters_reset_every_second() {
        let mut f = Flood {
            since: clock(),
            resets: 0,
            control: 0,
            empty: 0,
            glitches: 0,
        };
        for _ in 0..3 {
            assert!(!f.hit(|f| &mut f.resets, 3));
        }
        assert!(f.hit(|f| &mut f.resets, 3), "the fourth is over the limit");
        f.since -= Duration::from_secs(2);
        assert!(!f.hit(|f| &mut f.resets, 3), "a new second starts over");
    }
}
