//! The minimal compiled data plane with smetric's core: the measuring instrument
//! `benches/proxy_data_plane.py` runs beside `smetric serve`, the minimal aiohttp proxy and
//! vllm-router, to answer "what would a data plane that is not Python add on this host".
//!
//! Per request, on one thread (a current-thread tokio runtime, as the Python proxy has one
//! event loop): read the whole body; parse it with the proxy's own Rust parser
//! (`smetric_vllm::parse_openai_body`); route with `smetric_core::Router` (policy `smetric`) a
//! chat body on the approximate ids of its plain ChatML ([`chatml`], as `smetric serve --tokens
//! approximate` routes it) and a completions body on its token ids (`prompt`), any other body
//! (Messages, Responses: no renderer here) to the engines in turn; forward the body unchanged;
//! relay the answer frame by frame, reporting `on_prefilled` at its first frame and
//! `on_finished` when it ends. No admission, keys, headers, metrics or failover: the HTTP
//! stack, the parse and the route, nothing of a gateway's features.
//!
//! Run: `smetric-dataplane-probe PORT URL...` (prints `listening on http://127.0.0.1:PORT`).

// Prose names products (ChatML, SMetric) that are not code identifiers, as in the workspace.
#![allow(clippy::doc_markdown)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use smetric_core::{PolicyKind, Prompt, RequestId, RouteRequest, Router, RouterConfig};
use smetric_vllm::{Endpoint, parse_openai_body};

use smetric_gateway::native::chatml;

type Body = BoxBody<Bytes, hyper::Error>;

struct Plane {
    router: Router,
    engines: Vec<String>,
    turn: AtomicUsize,
    client: Client<HttpConnector, Full<Bytes>>,
}

/// Reports `on_finished` when the relayed answer is dropped: at its end, or when the client goes.
struct Finish {
    plane: Arc<Plane>,
    id: Option<RequestId>,
}

impl Drop for Finish {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.plane.router.on_finished(id, 0);
        }
    }
}

fn status(code: StatusCode, text: &'static str) -> Response<Body> {
    let body = Full::new(Bytes::from_static(text.as_bytes()))
        .map_err(|never| match never {})
        .boxed();
    let mut response = Response::new(body);
    *response.status_mut() = code;
    response
}

async fn handle(plane: Arc<Plane>, request: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let path = request.uri().path().to_owned();
    let Ok(collected) = request.into_body().collect().await else {
        return Ok(status(StatusCode::BAD_REQUEST, "body read failed"));
    };
    let raw = collected.to_bytes();
    // Chat: the approximate routing ids of its ChatML, as `smetric serve --tokens approximate`
    // renders them; completions: the token ids of `prompt`. Anything else (Messages, Responses:
    // no renderer here) goes to the engines in turn.
    let ids = if path == "/v1/chat/completions" {
        chatml::chatml_ids(&raw)
    } else {
        match parse_openai_body(&raw, Endpoint::Completions) {
            Ok(body) => match body.prompt {
                Some(smetric_vllm::Prompt::Ids(ids)) => Some(ids),
                _ => None,
            },
            Err(_) => None,
        }
    };
    let (instance, id) = match ids
        .as_deref()
        .map(|ids| plane.router.route(&RouteRequest::new(Prompt::Tokens(ids))))
    {
        Some(Ok(d)) => (d.instance_name.to_string(), Some(d.request_id)),
        _ => (
            plane.engines[plane.turn.fetch_add(1, Ordering::Relaxed) % plane.engines.len()].clone(),
            None,
        ),
    };
    let upstream = Request::post(format!("{instance}{path}"))
        .header("content-type", "application/json")
        .body(Full::new(raw))
        .expect("a valid request");
    let Ok(answer) = plane.client.request(upstream).await else {
        if let Some(id) = id {
            plane.router.on_aborted(id);
        }
        return Ok(status(StatusCode::BAD_GATEWAY, "upstream failed"));
    };
    let (parts, body) = answer.into_parts();
    let finish = Finish {
        plane: Arc::clone(&plane),
        id,
    };
    let mut first = true;
    let relayed = body
        .map_frame(move |frame| {
            if first {
                first = false;
                if let Some(id) = finish.id {
                    finish.plane.router.on_prefilled(id);
                }
            }
            frame
        })
        .boxed();
    Ok(Response::from_parts(parts, relayed))
}

fn main() {
    let mut args = std::env::args().skip(1);
    let port: u16 = args
        .next()
        .and_then(|p| p.parse().ok())
        .expect("usage: smetric-dataplane-probe PORT URL...");
    let engines: Vec<String> = args.map(|u| u.trim_end_matches('/').to_owned()).collect();
    assert!(!engines.is_empty(), "usage: smetric-dataplane-probe PORT URL...");
    let router = Router::new(&engines, PolicyKind::Smetric, 16, 0, RouterConfig::default()).expect("a valid router");
    let client = Client::builder(TokioExecutor::new()).build_http();
    let plane = Arc::new(Plane {
        router,
        engines,
        turn: AtomicUsize::new(0),
        client,
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("a runtime");
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port)))
            .await
            .expect("bind");
        eprintln!("listening on http://127.0.0.1:{port}");
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let plane = Arc::clone(&plane);
            tokio::spawn(async move {
                let service = service_fn(move |request| handle(Arc::clone(&plane), request));
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
}
