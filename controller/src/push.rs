//! Pushes config snapshots to the dataplane over its Unix control socket and tracks which
//! generation it has acknowledged. (Interface only; the implementation lands with the socket
//! protocol work.)

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use sweety_config::Config;
use tokio::sync::watch;

/// How to reach the dataplane.
#[derive(Clone, Debug)]
pub struct PushOptions {
    /// The dataplane's control socket (`sweety-dataplane --control-socket PATH`).
    pub socket: PathBuf,
    /// Bursts of submits within this window are coalesced into one push (default 20 ms).
    pub debounce: Duration,
    /// Longest wait between reconnect attempts (backoff doubles up to this).
    pub max_backoff: Duration,
}

impl Default for PushOptions {
    fn default() -> Self {
        PushOptions {
            socket: PathBuf::from("/var/run/sweety/control.sock"),
            debounce: Duration::from_millis(20),
            max_backoff: Duration::from_secs(2),
        }
    }
}

/// What the pusher knows about the dataplane.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PushState {
    /// Connected to the dataplane right now.
    pub connected: bool,
    /// Highest generation submitted (assigned by `submit`).
    pub submitted: u64,
    /// Highest generation the dataplane acknowledged (applied).
    pub acked: u64,
    /// The last rejection: generation and the dataplane's errors.
    pub last_nack: Option<(u64, Vec<String>)>,
}

/// Handle to the background push task.
#[derive(Clone)]
pub struct Pusher {
    latest: watch::Sender<Option<(u64, Arc<Config>)>>,
    state: watch::Receiver<PushState>,
}

impl Pusher {
    /// Start the push task (needs a tokio runtime).
    pub fn spawn(options: PushOptions) -> Pusher {
        let _ = options;
        let (latest, _) = watch::channel(None);
        let (_, state) = watch::channel(PushState::default());
        Pusher { latest, state }
    }

    /// Offer a config. When its content hash differs from the last submitted one it gets the
    /// next generation and is pushed (debounced); otherwise the current generation is returned
    /// and nothing is sent.
    pub fn submit(&self, config: Config) -> u64 {
        let _ = (&self.latest, config);
        0
    }

    /// Watch the dataplane's state (connected, acked generation, last Nack).
    pub fn state(&self) -> watch::Receiver<PushState> {
        self.state.clone()
    }
}
