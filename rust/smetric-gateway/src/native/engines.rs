//! The engines' HTTP client the native path forwards with (one pool of kept-alive connections
//! for every engine).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// The engines' client: kept-alive connections, no delay, the configured connect timeout.
pub(crate) struct Engines {
    pub(super) client: Client<HttpConnector, Full<Bytes>>,
}

impl Engines {
    pub(crate) fn new(connect_timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(connect_timeout));
        Self {
            client: Client::builder(TokioExecutor::new()).build(connector),
        }
    }
}
