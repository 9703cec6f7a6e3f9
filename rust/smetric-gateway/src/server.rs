//! The listener and its thread: [`Gateway::start`] binds, serves every connection with the
//! [`Limits`], and [`Gateway::stop`] (or dropping it) drains and joins.
//!
//! One thread, one current-thread tokio runtime: the data plane of one proxy process fits in a
//! core (the probe in `benches/dataplane` measured 0.5–1 ms of CPU a request), and the Python
//! control plane keeps the other. `start` returns once the socket is bound (port 0 gives the
//! address the system chose), or with the error that kept it from binding. `stop` closes the
//! listener at once, lets each open connection finish the request it is serving (hyper's
//! graceful shutdown closes idle keep-alive connections right away) for at most
//! `drain_timeout`, then ends the runtime, which drops whatever is left.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::StatusCode;
use hyper::header::HeaderValue;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

use crate::admission::Admission;
use crate::answers::{proxy_error_body, raw_json_answer};
use crate::counters::{ClientError, ClientErrors};
use crate::delegate::ControlPlane;
use crate::native::{FleetView, Native, NativeConfig, NativeHandles};
use crate::records::Records;
use crate::validate::{Exchange, Tracked, Validated};

/// The smallest head buffer hyper accepts (its `max_buf_size` panics below it).
const MIN_HEAD_BYTES: usize = 8192;

/// The most hyper reads from a connection at once (its buffer grows to it only while reads fill
/// it). Heads are bounded before hyper sees them (`validate.rs`, `max_head_bytes`), so this
/// bounds a large body's reads only: a 32K-token conversation (≈ 130 KB) in two or three reads
/// instead of nine 16 KB ones, each a syscall that contends on the socket's lock with the
/// sender still writing it (measured: BENCHMARKS.md, "The body read in large pieces").
const MAX_READ_BYTES: usize = 256 * 1024;

/// What one client connection may cost the gateway. No defaults here: `smetric serve`'s
/// configuration defines them once and the binding passes them in.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The largest request head (line and fields) read; a larger one is refused (431).
    pub max_head_bytes: usize,
    /// The longest request line, field name or field value; a longer one is refused (431).
    pub max_field_bytes: usize,
    /// The time a client has to send a whole head, on a new connection and between requests.
    pub head_timeout: Duration,
    /// How long [`Gateway::stop`] lets requests in flight finish.
    pub drain_timeout: Duration,
    /// Open client connections at most; a new one past it gets a 503 and is closed unread.
    pub max_connections: usize,
    /// The `Retry-After` of that 503, in seconds.
    pub retry_after_s: u64,
}

/// Where the gateway listens and where its control plane is.
#[derive(Clone, Copy, Debug)]
pub struct GatewayConfig {
    /// The public address (port 0: any free port; [`Gateway::address`] says which).
    pub listen: SocketAddr,
    /// The Python app's loopback address, known only to the gateway.
    pub control_plane: SocketAddr,
    pub limits: Limits,
}

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("invalid gateway setting {field}: {reason}")]
    Config { field: &'static str, reason: String },
    #[error("cannot listen on {address}: {source}")]
    Bind { address: SocketAddr, source: io::Error },
    #[error("cannot start the gateway's thread or runtime: {0}")]
    Start(io::Error),
    #[error("the gateway's thread ended before it was listening")]
    Exited,
    #[error("cannot configure TLS for https engines: {0}")]
    Tls(String),
}

/// A running gateway; stopped when dropped.
pub struct Gateway {
    address: SocketAddr,
    errors: Arc<ClientErrors>,
    native: Option<Arc<Native>>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Gateway {
    /// Binds `config.listen` and serves on a thread of its own until [`Gateway::stop`]; with
    /// `native`, it admits the APIs' requests and serves chat and completions itself
    /// ([`crate::native`]), starting from the fleet as `fleet` describes it.
    pub fn start(config: GatewayConfig, native: Option<(NativeConfig, FleetView)>) -> Result<Self, GatewayError> {
        if config.limits.max_head_bytes < MIN_HEAD_BYTES {
            return Err(GatewayError::Config {
                field: "max_head_bytes",
                reason: format!(
                    "must be at least {MIN_HEAD_BYTES}, got {}",
                    config.limits.max_head_bytes
                ),
            });
        }
        if config.limits.max_field_bytes == 0 {
            return Err(GatewayError::Config {
                field: "max_field_bytes",
                reason: "must be at least 1".to_owned(),
            });
        }
        let native = match native {
            None => None,
            Some((native, fleet)) => {
                if HeaderValue::from_str(&native.secret).is_err() || native.secret.is_empty() {
                    return Err(GatewayError::Config {
                        field: "secret",
                        reason: "must be a non-empty header value".to_owned(),
                    });
                }
                let admission = Admission::new(native.admission, fleet.live());
                let records = Arc::new(Records::new(native.max_records).map_err(GatewayError::Start)?);
                let native =
                    Native::new(native, fleet, admission, records).map_err(|e| GatewayError::Tls(e.to_string()))?;
                Some(Arc::new(native))
            }
        };
        let (ready_tx, ready_rx) = mpsc::channel();
        let (stop_tx, stop_rx) = oneshot::channel();
        let errors = Arc::new(ClientErrors::default());
        let counted = Arc::clone(&errors);
        let serving = native.clone();
        let thread = std::thread::Builder::new()
            .name("smetric-gateway".to_owned())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = ready_tx.send(Err(GatewayError::Start(e)));
                        return;
                    }
                };
                runtime.block_on(serve(config, serving, counted, ready_tx, stop_rx));
            })
            .map_err(GatewayError::Start)?;
        match ready_rx.recv() {
            Ok(Ok(address)) => Ok(Self {
                address,
                errors,
                native,
                stop: Some(stop_tx),
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(GatewayError::Exited)
            }
        }
    }

    /// The address it listens on.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// What the door refused or cut so far, by the proxy's kind names (zeros included).
    pub fn client_errors(&self) -> Vec<(&'static str, u64)> {
        self.errors.snapshot()
    }

    /// The native path's controls, when it is armed.
    pub fn native(&self) -> Option<NativeHandles> {
        self.native.as_ref().map(|native| NativeHandles {
            native: Arc::clone(native),
        })
    }

    /// Stops accepting, drains (at most `drain_timeout`) and joins the thread; idempotent.
    /// Requests waiting for admission are refused; admitted ones finish.
    pub fn stop(&mut self) {
        if let Some(native) = &self.native {
            native.admission.close();
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn serve(
    config: GatewayConfig,
    native: Option<Arc<Native>>,
    errors: Arc<ClientErrors>,
    ready: mpsc::Sender<Result<SocketAddr, GatewayError>>,
    mut stop: oneshot::Receiver<()>,
) {
    let bound = TcpListener::bind(config.listen)
        .await
        .and_then(|listener| Ok((listener.local_addr()?, listener)));
    let listener = match bound {
        Ok((address, listener)) => {
            let _ = ready.send(Ok(address));
            listener
        }
        Err(source) => {
            let _ = ready.send(Err(GatewayError::Bind {
                address: config.listen,
                source,
            }));
            return;
        }
    };
    let secret = native
        .as_ref()
        .and_then(|n| HeaderValue::from_str(&n.config.secret).ok());
    let plane = Arc::new(ControlPlane::new(config.control_plane, Arc::clone(&errors), secret));
    let open = Arc::new(Semaphore::new(config.limits.max_connections));
    let refusal = Bytes::from(connection_refusal(config.limits.retry_after_s));
    let graceful = GracefulShutdown::new();
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        // A backstop: the validating wrapper times a begun head itself (and counts it first).
        .header_read_timeout(config.limits.head_timeout * 2)
        .max_buf_size(config.limits.max_head_bytes.max(MAX_READ_BYTES));
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((mut stream, peer)) = accepted else {
                    // Out of descriptors or memory: back off instead of spinning on it.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let Some(permit) = slot(&open).await else {
                    errors.count(ClientError::ConnectionLimit);
                    let refusal = refusal.clone();
                    tokio::spawn(async move {
                        // Answered before anything is read; a client that does not read it is
                        // not waited for long.
                        let _ = tokio::time::timeout(REFUSAL_WRITE, stream.write_all(&refusal)).await;
                        let _ = stream.shutdown().await;
                    });
                    continue;
                };
                let exchange = Arc::new(Exchange::default());
                let answered = Arc::clone(&exchange);
                let plane = Arc::clone(&plane);
                let native = native.clone();
                let service = service_fn(move |request| {
                    let plane = Arc::clone(&plane);
                    let native = native.clone();
                    let in_flight = answered.begin();
                    async move {
                        let answer = match native {
                            Some(native) => crate::native::serve(native, plane, request, peer).await,
                            None => plane.delegate(request, peer, &[]).await,
                        };
                        Ok::<_, Infallible>(answer.map(|body| Tracked::new(body, in_flight).boxed()))
                    }
                });
                let checked = Validated::new(
                    stream,
                    (config.limits.max_head_bytes, config.limits.max_field_bytes),
                    config.limits.head_timeout,
                    Arc::clone(&errors),
                    exchange,
                    permit,
                );
                let connection = graceful.watch(http.serve_connection(TokioIo::new(checked), service));
                let errors = Arc::clone(&errors);
                tokio::spawn(async move {
                    if let Err(e) = connection.await {
                        count_connection_error(&errors, &e);
                    }
                });
            }
            _ = &mut stop => break,
        }
    }
    drop(listener);
    let _ = tokio::time::timeout(config.limits.drain_timeout, graceful.shutdown()).await;
}

/// A slot under the connection bound, or None when the bound is reached. Before refusing, the
/// connections accepted earlier get to run: a burst of accepts can meet clients that have
/// already left but whose connection tasks have not yet read their end (and so still hold a
/// slot), which would refuse a live client in their place.
async fn slot(open: &Arc<Semaphore>) -> Option<OwnedSemaphorePermit> {
    for _ in 0..SLOT_YIELDS {
        if let Ok(permit) = Arc::clone(open).try_acquire_owned() {
            return Some(permit);
        }
        tokio::task::yield_now().await;
    }
    Arc::clone(open).try_acquire_owned().ok()
}

/// How many times the accept loop lets other tasks run before it refuses a connection.
const SLOT_YIELDS: usize = 3;

/// How long a refused connection's 503 may take to write.
const REFUSAL_WRITE: Duration = Duration::from_secs(1);

/// The whole answer to a connection past the bound: the 503 `smetric serve` answers, in the
/// shape of the proxy's own failures, with `Retry-After`.
fn connection_refusal(retry_after_s: u64) -> Vec<u8> {
    let status = StatusCode::SERVICE_UNAVAILABLE;
    let body = proxy_error_body(
        status,
        "too many open connections to the proxy",
        "ServiceUnavailableError",
    );
    raw_json_answer(status, &body, &format!("retry-after: {retry_after_s}\r\n"))
}

/// Counts what ended a connection early: a head that took too long, or one that did not parse.
fn count_connection_error(errors: &ClientErrors, e: &hyper::Error) {
    if e.is_timeout() {
        errors.count(ClientError::HeadTimeout);
    } else if e.is_parse_too_large() {
        errors.count(ClientError::HeadTooLarge);
    } else if e.is_parse() || e.is_parse_status() {
        errors.count(ClientError::Malformed);
    }
}
