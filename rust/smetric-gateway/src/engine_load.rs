//! The engine-load scraper: every period, every instance's `/metrics` (or `/load`) fetched on a
//! kept-alive connection, parsed ([`smetric_vllm::load_metrics`]) and fed to the router
//! (`Router::update_load`), all in Rust.
//!
//! Why here and not in the Python app: a round used to cost ≈ 0.3 ms of CPU per instance in
//! Python (a thread pool's hand-off, `http.client`, the parse), on threads that hold the GIL the
//! app's event loop needs — at 4 instances and the proxy's 0.25 s period, 5 ms of CPU a second,
//! most of the app's CPU at low request rates (`BENCHMARKS.md`). Here a round is one task per
//! instance on a runtime of its own (one worker thread, named `smetric-engine-load`), with the
//! engines' client of the native path (`native::engines`: kept-alive connections, http or https).
//!
//! Algorithm: a round fetches every instance concurrently (at most `max_concurrent` at a time).
//! A response slower than `timeout` is discarded and counted `slow`; a failure (connection,
//! a status other than 2xx, a body over [`MAX_BODY_BYTES`] or one that does not parse, an
//! instance the router no longer has) is counted in `errors` with its text in `last_error`; a
//! sample is fed to the router and kept as the instance's `last`, and two successive samples
//! give the prefix-cache hit rates of the interval. The periodic task runs a round, then
//! sleeps to the next tick of `period` (a round that overran skips the missed ticks rather than
//! bursting). A stale kept connection (the engine closed it while idle) is dropped by the
//! client's pool and the request sent on a new one.
//!
//! Invariants: a snapshot the router receives was answered within `timeout` of its request, so
//! it is at most `timeout` old when stamped; a failed or discarded scrape feeds nothing (the
//! router's last snapshot ages out under `engine_load_staleness_s`); memory is bounded by the
//! instance count and `MAX_BODY_BYTES` per request in flight; [`EngineLoadScraper::stop`] ends
//! the task and its requests at once.
//!
//! Complexity: per round O(instances) requests and O(page bytes) parse each.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::Request;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use parking_lot::Mutex;
use smetric_vllm::load_metrics::{EngineSample, engine_sample, server_load};
use tokio::runtime::Runtime;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::native::Routing;
use crate::native::engines::Engines;

/// The largest page read (a vLLM page is ≈ 60 KB; one serving many LoRA adapters a few MB).
pub const MAX_BODY_BYTES: usize = 16 << 20;

/// Which endpoint the scraper reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadEndpoint {
    /// `GET /metrics`: running, waiting, KV usage and the prefix-cache counters.
    Metrics,
    /// `GET /load` (`{"server_load": n}`, vLLM's `--enable-server-load-tracking`): `running = n`,
    /// `waiting = 0`.
    Load,
}

impl LoadEndpoint {
    fn path(self) -> &'static str {
        match self {
            Self::Metrics => "/metrics",
            Self::Load => "/load",
        }
    }
}

/// How the scraper scrapes.
#[derive(Clone, Debug)]
pub struct ScrapeConfig {
    /// Time between the starts of two rounds.
    pub period: Duration,
    /// A response slower than this is discarded; also the connect timeout.
    pub timeout: Duration,
    /// Which endpoint.
    pub endpoint: LoadEndpoint,
    /// Only this model's series count (None: all).
    pub model_name: Option<String>,
    /// Sent with every request (an engine behind a key: `Authorization: Bearer …`).
    pub headers: Vec<(String, String)>,
    /// Requests in flight at once within a round.
    pub max_concurrent: usize,
}

/// Why a scraper could not be built or used.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// A bad period, timeout, concurrency, header or instance URL.
    #[error("{0}")]
    InvalidArgument(String),
    /// The runtime or the TLS configuration could not be built.
    #[error("the engine-load scraper could not start: {0}")]
    Start(String),
    /// `start` on a scraper already started.
    #[error("the engine-load scraper is already started")]
    AlreadyStarted,
    /// A call after `stop`.
    #[error("the engine-load scraper is stopped")]
    Stopped,
}

/// One instance's scrape counters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ScrapeCounters {
    /// Scrapes fed to the router.
    pub ok: u64,
    /// Scrapes that failed.
    pub errors: u64,
    /// Scrapes answered later than the timeout, discarded.
    pub slow: u64,
    /// The last failure's text.
    pub last_error: Option<String>,
    /// The last sample fed.
    pub last: Option<EngineSample>,
    /// Prefix-cache hit rate between the last two samples (None without queries between them
    /// or across a counter reset).
    pub hit_rate: Option<f64>,
    /// The KV connector's hit rate, likewise.
    pub external_hit_rate: Option<f64>,
}

/// An instance as [`EngineLoadScraper::stats`] reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct InstanceStats {
    /// Its name in the router.
    pub name: String,
    /// Its base URL.
    pub url: String,
    /// Its counters.
    pub counters: ScrapeCounters,
}

struct Target {
    name: String,
    url: String,
    /// The endpoint's URI, or why the instance's URL gives none (each scrape of it then fails
    /// with that text: one bad URL must not stop the fleet's other scrapes).
    uri: Result<hyper::Uri, String>,
}

/// `base` + `path` as an `http(s)://host[:port]/…` URI.
fn target_uri(base: &str, path: &str) -> Result<hyper::Uri, String> {
    let uri: hyper::Uri = format!("{base}{path}")
        .parse()
        .map_err(|e| format!("InvalidURL: {base:?}: {e}"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err(format!("InvalidURL: {base:?} is not http(s)://host[:port]"));
    }
    Ok(uri)
}

struct Shared {
    routing: Routing,
    engines: Engines,
    targets: Vec<Target>,
    counters: Mutex<Vec<ScrapeCounters>>,
    rounds: AtomicU64,
    config: ScrapeConfig,
    headers: HeaderMap,
    permits: Semaphore,
}

/// Scrapes every instance periodically and feeds `Router::update_load` (module docs).
pub struct EngineLoadScraper {
    shared: Arc<Shared>,
    runtime: Mutex<Option<Runtime>>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl EngineLoadScraper {
    /// A scraper of `instances` (router name, base URL) feeding `routing`'s load; not started.
    ///
    /// # Errors
    /// [`ScrapeError::InvalidArgument`] for a zero period or timeout or concurrency, or a
    /// header that is not valid HTTP (an instance URL that is not `http(s)://host[:port]` is
    /// not an error here: its scrapes fail, counted in its `errors`);
    /// [`ScrapeError::Start`] when the runtime or TLS cannot be built.
    pub fn new(routing: Routing, instances: Vec<(String, String)>, config: ScrapeConfig) -> Result<Self, ScrapeError> {
        let invalid = ScrapeError::InvalidArgument;
        if config.period.is_zero() || config.timeout.is_zero() || config.max_concurrent == 0 {
            return Err(invalid("period, timeout and max_concurrent must be positive".into()));
        }
        let mut headers = HeaderMap::new();
        for (name, value) in &config.headers {
            let name = HeaderName::try_from(name.as_str()).map_err(|e| invalid(format!("header {name:?}: {e}")))?;
            let value = HeaderValue::try_from(value.as_str()).map_err(|e| invalid(format!("header {name}: {e}")))?;
            headers.append(name, value);
        }
        let path = config.endpoint.path();
        let mut targets = Vec::with_capacity(instances.len());
        for (name, url) in instances {
            let base = url.trim_end_matches('/').to_owned();
            let uri = target_uri(&base, path);
            targets.push(Target { name, url: base, uri });
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("smetric-engine-load")
            .enable_all()
            .build()
            .map_err(|e| ScrapeError::Start(e.to_string()))?;
        // The client's pool spawns its connection tasks on the runtime it is used from: build it there.
        let engines = {
            let _entered = runtime.enter();
            Engines::new(config.timeout).map_err(|e| ScrapeError::Start(e.to_string()))?
        };
        let permits = Semaphore::new(config.max_concurrent);
        Ok(Self {
            shared: Arc::new(Shared {
                routing,
                engines,
                counters: Mutex::new(vec![ScrapeCounters::default(); targets.len()]),
                targets,
                rounds: AtomicU64::new(0),
                config,
                headers,
                permits,
            }),
            runtime: Mutex::new(Some(runtime)),
            task: Mutex::new(None),
        })
    }

    /// Scrapes every instance now and feeds the router; one entry per instance, in order, None
    /// where the scrape failed. Blocks the calling thread (which must not be a tokio runtime's).
    ///
    /// # Errors
    /// [`ScrapeError::Stopped`] after [`Self::stop`].
    pub fn scrape_once(&self) -> Result<Vec<Option<EngineSample>>, ScrapeError> {
        let handle = self
            .runtime
            .lock()
            .as_ref()
            .map(|r| r.handle().clone())
            .ok_or(ScrapeError::Stopped)?;
        let shared = Arc::clone(&self.shared);
        handle
            .block_on(async move { shared.round().await })
            .map_err(|_| ScrapeError::Stopped)
    }

    /// Starts a round every `period` on the scraper's runtime.
    ///
    /// # Errors
    /// [`ScrapeError::AlreadyStarted`]; [`ScrapeError::Stopped`] after [`Self::stop`].
    pub fn start(&self) -> Result<(), ScrapeError> {
        let runtime = self.runtime.lock();
        let runtime = runtime.as_ref().ok_or(ScrapeError::Stopped)?;
        let mut task = self.task.lock();
        if task.is_some() {
            return Err(ScrapeError::AlreadyStarted);
        }
        let shared = Arc::clone(&self.shared);
        *task = Some(runtime.spawn(async move {
            let period = shared.config.period;
            let mut next = Instant::now();
            loop {
                // A round that could not finish (the runtime going away) ends the loop.
                if shared.clone().round().await.is_err() {
                    return;
                }
                next += period;
                let now = Instant::now();
                if next < now {
                    next = now; // overran: skip the missed ticks instead of bursting
                }
                tokio::time::sleep_until(next).await;
            }
        }));
        Ok(())
    }

    /// Stops the periodic task and drops its requests and connections (idempotent).
    pub fn stop(&self) {
        if let Some(task) = self.task.lock().take() {
            task.abort();
        }
        if let Some(runtime) = self.runtime.lock().take() {
            runtime.shutdown_timeout(Duration::from_secs(1));
        }
    }

    /// Rounds completed so far.
    #[must_use]
    pub fn rounds(&self) -> u64 {
        self.shared.rounds.load(Ordering::Relaxed)
    }

    /// Every instance's counters, in the order they were given.
    #[must_use]
    pub fn stats(&self) -> Vec<InstanceStats> {
        let counters = self.shared.counters.lock().clone();
        let targets = &self.shared.targets;
        targets
            .iter()
            .zip(counters)
            .map(|(t, counters)| InstanceStats {
                name: t.name.clone(),
                url: t.url.clone(),
                counters,
            })
            .collect()
    }
}

impl Drop for EngineLoadScraper {
    fn drop(&mut self) {
        // Not `stop`: a drop must not block (nor panic inside another runtime).
        if let Some(runtime) = self.runtime.get_mut().take() {
            runtime.shutdown_background();
        }
    }
}

/// What one instance's scrape ended in.
enum Outcome {
    Fed(EngineSample),
    Failed(String),
    Slow,
}

impl Shared {
    /// One round: every instance scraped concurrently, the outcomes recorded. Err when a task
    /// could not run to its end (the runtime shutting down).
    async fn round(self: Arc<Self>) -> Result<Vec<Option<EngineSample>>, tokio::task::JoinError> {
        let tasks: Vec<JoinHandle<Outcome>> = (0..self.targets.len())
            .map(|i| {
                let shared = Arc::clone(&self);
                tokio::spawn(async move { shared.scrape(i).await })
            })
            .collect();
        let mut samples = Vec::with_capacity(tasks.len());
        for (i, task) in tasks.into_iter().enumerate() {
            let outcome = task.await?;
            samples.push(self.record(i, outcome));
        }
        self.rounds.fetch_add(1, Ordering::Relaxed);
        Ok(samples)
    }

    async fn scrape(&self, i: usize) -> Outcome {
        let Ok(_permit) = self.permits.acquire().await else {
            return Outcome::Failed("stopped".into());
        };
        let sample = match tokio::time::timeout(self.config.timeout, self.fetch(i)).await {
            Err(_) => return Outcome::Slow,
            Ok(Err(e)) => return Outcome::Failed(e),
            Ok(Ok(sample)) => sample,
        };
        match self.routing.load_router().update_load(
            &self.targets[i].name,
            sample.running,
            sample.waiting,
            sample.kv_usage,
            None,
        ) {
            Ok(()) => Outcome::Fed(sample),
            Err(e) => Outcome::Failed(format!("ValueError: {e}")), // the instance left the router
        }
    }

    /// The instance's sample, or the failure's text (its kind first, as the app logs errors).
    async fn fetch(&self, i: usize) -> Result<EngineSample, String> {
        let uri = self.targets[i].uri.clone()?;
        let mut request = Request::get(uri)
            .body(Full::new(Bytes::new()))
            .map_err(|e| format!("InvalidRequest: {e}"))?;
        request.headers_mut().extend(self.headers.clone());
        let response = self
            .engines
            .client
            .request(request)
            .await
            .map_err(|e| format!("ConnectionError: {e}"))?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
            .map_err(|e| format!("BodyError: {e}"))?
            .to_bytes();
        if !status.is_success() {
            return Err(format!(
                "HTTPError: HTTP {} from {}",
                status.as_u16(),
                self.config.endpoint.path()
            ));
        }
        match self.config.endpoint {
            LoadEndpoint::Load => server_load(&body)
                .map(|load| EngineSample {
                    running: Some(load),
                    waiting: Some(0),
                    ..EngineSample::default()
                })
                .map_err(|e| format!("ValueError: {e}")),
            LoadEndpoint::Metrics => {
                let text = String::from_utf8_lossy(&body);
                Ok(engine_sample(&text, self.config.model_name.as_deref()))
            }
        }
    }

    fn record(&self, i: usize, outcome: Outcome) -> Option<EngineSample> {
        let mut counters = self.counters.lock();
        let s = &mut counters[i];
        match outcome {
            Outcome::Fed(sample) => {
                if let Some(prev) = s.last {
                    s.hit_rate = rate(
                        sample.prefix_cache_hits,
                        prev.prefix_cache_hits,
                        sample.prefix_cache_queries,
                        prev.prefix_cache_queries,
                    );
                    s.external_hit_rate = rate(
                        sample.external_prefix_cache_hits,
                        prev.external_prefix_cache_hits,
                        sample.external_prefix_cache_queries,
                        prev.external_prefix_cache_queries,
                    );
                }
                s.ok += 1;
                s.last = Some(sample);
                Some(sample)
            }
            Outcome::Failed(error) => {
                s.errors += 1;
                s.last_error = Some(error);
                None
            }
            Outcome::Slow => {
                s.slow += 1;
                None
            }
        }
    }
}

/// The hit rate between two counter readings; None without queries between them, across a
/// counter reset, or with a reading missing.
fn rate(hits: Option<f64>, hits_before: Option<f64>, queries: Option<f64>, queries_before: Option<f64>) -> Option<f64> {
    let (dh, dq) = (hits? - hits_before?, queries? - queries_before?);
    (dq > 0.0 && dh >= 0.0).then(|| (dh / dq).min(1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_needs_queries_and_no_reset() {
        assert_eq!(rate(Some(992.0), Some(480.0), Some(2030.0), Some(1006.0)), Some(0.5));
        assert_eq!(
            rate(Some(1.0), Some(1.0), Some(5.0), Some(5.0)),
            None,
            "no queries between"
        );
        assert_eq!(rate(Some(0.0), Some(9.0), Some(10.0), Some(5.0)), None, "a reset");
        assert_eq!(rate(None, Some(1.0), Some(10.0), Some(5.0)), None);
    }

    fn config() -> ScrapeConfig {
        ScrapeConfig {
            period: Duration::from_millis(100),
            timeout: Duration::from_millis(500),
            endpoint: LoadEndpoint::Metrics,
            model_name: None,
            headers: vec![],
            max_concurrent: 4,
        }
    }

    #[test]
    fn bad_arguments_are_typed_errors() {
        let router = || {
            Routing::Colocated(Arc::new(
                smetric_core::Router::new(
                    &["a".into()],
                    smetric_core::PolicyKind::Smetric,
                    16,
                    0,
                    smetric_core::RouterConfig::default(),
                )
                .unwrap(),
            ))
        };
        let bad_url = EngineLoadScraper::new(router(), vec![("a".into(), "ftp://x".into())], config()).unwrap();
        assert_eq!(bad_url.scrape_once().unwrap(), [None]);
        let stats = bad_url.stats();
        assert_eq!((stats[0].counters.errors, stats[0].counters.ok), (1, 0));
        assert!(
            stats[0]
                .counters
                .last_error
                .as_deref()
                .unwrap()
                .starts_with("InvalidURL")
        );
        let mut c = config();
        c.headers = vec![("bad header".into(), "v".into())];
        assert!(matches!(
            EngineLoadScraper::new(router(), vec![], c),
            Err(ScrapeError::InvalidArgument(_))
        ));
        let mut c = config();
        c.period = Duration::ZERO;
        assert!(matches!(
            EngineLoadScraper::new(router(), vec![], c),
            Err(ScrapeError::InvalidArgument(_))
        ));
        let s = EngineLoadScraper::new(router(), vec![], config()).unwrap();
        s.start().unwrap();
        assert!(matches!(s.start(), Err(ScrapeError::AlreadyStarted)));
        s.stop();
        assert!(matches!(s.scrape_once(), Err(ScrapeError::Stopped)));
        s.stop();
    }
}
