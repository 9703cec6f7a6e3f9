//! What the door refused or cut, counted by kind: the same kinds `smetric serve` counts in
//! `proxy_client_errors_total` (`connection_limit`, `head_timeout`, `http_<status>`), so the
//! control plane adds them to its own and `/metrics` reads one series whatever serves the port.
//! Relaxed atomics: each is a tally read now and then, ordered with nothing.

use std::sync::atomic::{AtomicU64, Ordering};

/// The door's client-error tallies.
#[derive(Debug, Default)]
pub(crate) struct ClientErrors {
    connection_limit: AtomicU64,
    head_timeout: AtomicU64,
    body_timeout: AtomicU64,
    http_400: AtomicU64,
    http_431: AtomicU64,
    http_405: AtomicU64,
    session_end_header: AtomicU64,
    session_id: AtomicU64,
}

/// One kind of client error.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ClientError {
    /// A connection past `max_connections`, refused with a 503.
    ConnectionLimit,
    /// A request head not complete within `head_timeout`; the connection is closed.
    HeadTimeout,
    /// A request body not complete within `body_timeout` (408).
    BodyTimeout,
    /// A malformed head or body (400).
    Malformed,
    /// A head over `max_head_bytes` (431).
    HeadTooLarge,
    /// A method no route serves on a path others do (405), answered whole at the door.
    WrongMethod,
    /// An end header neither true nor false (400, answered natively).
    SessionEndHeader,
    /// An end endpoint's session id no client session can have (400, answered natively).
    SessionId,
}

impl ClientErrors {
    pub(crate) fn count(&self, kind: ClientError) {
        let tally = match kind {
            ClientError::ConnectionLimit => &self.connection_limit,
            ClientError::HeadTimeout => &self.head_timeout,
            ClientError::BodyTimeout => &self.body_timeout,
            ClientError::Malformed => &self.http_400,
            ClientError::HeadTooLarge => &self.http_431,
            ClientError::WrongMethod => &self.http_405,
            ClientError::SessionEndHeader => &self.session_end_header,
            ClientError::SessionId => &self.session_id,
        };
        tally.fetch_add(1, Ordering::Relaxed);
    }

    /// Every kind with its tally, zeros included, under the proxy's kind names.
    pub(crate) fn snapshot(&self) -> Vec<(&'static str, u64)> {
        [
            ("connection_limit", &self.connection_limit),
            ("head_timeout", &self.head_timeout),
            ("body_timeout", &self.body_timeout),
            ("http_400", &self.http_400),
            ("http_431", &self.http_431),
            ("http_405", &self.http_405),
            ("session_end_header", &self.session_end_header),
            ("session_id", &self.session_id),
        ]
        .into_iter()
        .map(|(kind, tally)| (kind, tally.load(Ordering::Relaxed)))
        .collect()
    }
}
