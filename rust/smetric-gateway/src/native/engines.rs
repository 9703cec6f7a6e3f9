//! The engines' HTTP client the native path forwards with (one pool of kept-alive connections
//! for every engine), over plain HTTP or TLS by the instance URL's scheme.
//!
//! TLS: rustls (the `ring` provider), the server verified against the system's roots as the
//! app's client verifies it (OpenSSL's default paths: `SSL_CERT_FILE` / `SSL_CERT_DIR` when set,
//! which `rustls-native-certs` reads too). Roots are loaded once, when the gateway starts.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls::{ClientConfig, RootCertStore};

/// The engines' client: kept-alive connections, no delay, the configured connect timeout.
pub(crate) struct Engines {
    pub(crate) client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl Engines {
    /// # Errors
    /// The TLS configuration could not be built (rustls refused the provider's versions).
    pub(crate) fn new(connect_timeout: Duration) -> Result<Self, rustls::Error> {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(connect_timeout));
        http.enforce_http(false); // the TLS layer above takes https URLs
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls_config()?)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Ok(Self {
            client: Client::builder(TokioExecutor::new()).build(connector),
        })
    }
}

/// The TLS client configuration: the system's roots (a certificate that does not parse is
/// skipped; none at all leaves https engines unverifiable, so their attempts fail and go to the
/// app's failover, as an unreachable engine's do).
fn tls_config() -> Result<ClientConfig, rustls::Error> {
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth())
}
