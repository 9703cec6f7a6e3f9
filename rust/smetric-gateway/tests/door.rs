//! The door (stage 1): every request reaches the control plane as the client sent it, minus
//! the hop-by-hop fields; answers come back streamed, not buffered; an unreachable control plane
//! is a 502 in OpenAI's shape; `stop` lets a request in flight finish and refuses new clients.
//! Bounded: loopback only, a handful of requests, every wait under a timeout.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::channel::Channel;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use smetric_gateway::{Gateway, GatewayConfig, Limits};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::timeout;

type Body = BoxBody<Bytes, Infallible>;

const WAIT: Duration = Duration::from_secs(10);

/// What the test control plane saw of the last request.
#[derive(Default)]
struct Seen {
    method: String,
    target: String,
    body_len: usize,
    headers: Vec<(String, String)>,
    /// Every request's target and body length so far, in order.
    all: Vec<(String, usize)>,
}

/// A control plane: `/stream` answers "first", then waits for `release` before "second";
/// `/slow` answers after 300 ms; anything else records the request and answers "ok".
struct Plane {
    address: SocketAddr,
    seen: Arc<Mutex<Seen>>,
    release: mpsc::Sender<()>,
}

async fn start_plane() -> Plane {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (release, released) = mpsc::channel::<()>(1);
    let released = Arc::new(tokio::sync::Mutex::new(released));
    let recorded = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let seen = Arc::clone(&recorded);
            let released = Arc::clone(&released);
            let service = service_fn(move |request: Request<Incoming>| {
                let seen = Arc::clone(&seen);
                let released = Arc::clone(&released);
                async move { Ok::<_, Infallible>(answer(request, &seen, released).await) }
            });
            tokio::spawn(async move {
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Plane { address, seen, release }
}

async fn answer(
    request: Request<Incoming>,
    seen: &Mutex<Seen>,
    released: Arc<tokio::sync::Mutex<mpsc::Receiver<()>>>,
) -> Response<Body> {
    match request.uri().path() {
        "/stream" => {
            let (mut frames, body) = Channel::<Bytes, Infallible>::new(1);
            tokio::spawn(async move {
                frames.send_data(Bytes::from_static(b"first")).await.unwrap();
                released.lock().await.recv().await;
                frames.send_data(Bytes::from_static(b"second")).await.unwrap();
            });
            Response::new(body.boxed())
        }
        "/slow" => {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Response::new(Full::new(Bytes::from_static(b"slow")).boxed())
        }
        _ => {
            let method = request.method().to_string();
            let target = request.uri().to_string();
            let headers = request
                .headers()
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned()))
                .collect();
            let body_len = request
                .into_body()
                .collect()
                .await
                .map_or(0, |body| body.to_bytes().len());
            let mut seen = seen.lock().unwrap();
            let mut all = std::mem::take(&mut seen.all);
            all.push((target.clone(), body_len));
            *seen = Seen {
                method,
                target,
                body_len,
                headers,
                all,
            };
            Response::new(Full::new(Bytes::from_static(b"ok")).boxed())
        }
    }
}

fn limits() -> Limits {
    Limits {
        max_head_bytes: 8192,
        max_field_bytes: 4096,
        head_timeout: Duration::from_secs(5),
        drain_timeout: Duration::from_secs(5),
        max_connections: 64,
        retry_after_s: 1,
    }
}

fn gateway_with(control_plane: SocketAddr, limits: Limits) -> Gateway {
    Gateway::start(
        GatewayConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            control_plane,
            limits,
        },
        None,
    )
    .unwrap()
}

fn gateway(control_plane: SocketAddr) -> Gateway {
    gateway_with(control_plane, limits())
}

fn tally(door: &Gateway, kind: &str) -> u64 {
    door.client_errors().into_iter().find(|(k, _)| *k == kind).unwrap().1
}

/// Everything the server sends until it closes the connection (bounded by `WAIT`).
fn read_until_closed(stream: &mut std::net::TcpStream) -> String {
    use std::io::Read;
    stream.set_read_timeout(Some(WAIT)).unwrap();
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

#[tokio::test]
async fn a_request_reaches_the_control_plane_as_sent_without_hop_by_hop_fields() {
    let plane = start_plane().await;
    let door = gateway(plane.address);
    let body = vec![b'x'; 1 << 20];
    let request = Request::post(format!("http://{}/v1/chat/completions?trace=1", door.address()))
        .header("content-type", "application/json")
        .header("authorization", "Bearer key")
        .header("connection", "keep-alive, x-hop")
        .header("x-hop", "secret")
        .header("te", "trailers")
        .header("x-forwarded-for", "10.0.0.9")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let answer = timeout(WAIT, client().request(request)).await.unwrap().unwrap();
    assert_eq!(answer.status(), 200);
    let text = timeout(WAIT, answer.into_body().collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    assert_eq!(&text[..], b"ok");
    let seen = plane.seen.lock().unwrap();
    assert_eq!(
        (seen.method.as_str(), seen.target.as_str()),
        ("POST", "/v1/chat/completions?trace=1")
    );
    assert_eq!(seen.body_len, 1 << 20);
    let header = |name: &str| seen.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    assert_eq!(header("authorization"), Some("Bearer key"));
    assert_eq!(header("content-type"), Some("application/json"));
    assert_eq!(header("x-forwarded-for"), Some("10.0.0.9, 127.0.0.1"));
    assert_eq!((header("x-hop"), header("te")), (None, None));
}

#[tokio::test]
async fn an_answer_is_streamed_through_not_buffered() {
    let plane = start_plane().await;
    let door = gateway(plane.address);
    let request = Request::get(format!("http://{}/stream", door.address()))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let answer = timeout(WAIT, client().request(request)).await.unwrap().unwrap();
    let mut body = answer.into_body();
    // The control plane holds "second" back until the client has "first": a door that waited
    // for the whole answer would never deliver it.
    let first = timeout(WAIT, body.frame()).await.unwrap().unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "first");
    plane.release.send(()).await.unwrap();
    let second = timeout(WAIT, body.frame()).await.unwrap().unwrap().unwrap();
    assert_eq!(second.into_data().unwrap(), "second");
}

#[tokio::test]
async fn an_unreachable_control_plane_is_a_502_in_openais_shape() {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let door = gateway(closed);
    let request = Request::get(format!("http://{}/v1/models", door.address()))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let answer = timeout(WAIT, client().request(request)).await.unwrap().unwrap();
    assert_eq!(answer.status(), 502);
    let text = timeout(WAIT, answer.into_body().collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    let text = std::str::from_utf8(&text).unwrap();
    assert!(text.starts_with(r#"{"error":{"message":"#) && text.contains(r#""type":"BadGatewayError""#));
    assert!(text.ends_with(r#""param":null,"code":502}}"#), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_lets_the_request_in_flight_finish_and_refuses_new_clients() {
    let plane = start_plane().await;
    let mut door = gateway(plane.address);
    let address = door.address();
    let request = Request::get(format!("http://{address}/slow"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let in_flight = tokio::spawn(async move {
        let answer = client().request(request).await.unwrap();
        let status = answer.status();
        (status, answer.into_body().collect().await.unwrap().to_bytes())
    });
    tokio::time::sleep(Duration::from_millis(100)).await; // the request is at the control plane
    tokio::task::spawn_blocking(move || door.stop()).await.unwrap();
    let (status, text) = timeout(WAIT, in_flight).await.unwrap().unwrap();
    assert_eq!((status.as_u16(), &text[..]), (200, &b"slow"[..]));
    assert!(std::net::TcpStream::connect(address).is_err());
}

#[test]
fn a_head_limit_hyper_cannot_honour_is_refused_at_start() {
    let config = GatewayConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        control_plane: "127.0.0.1:9".parse().unwrap(),
        limits: Limits {
            max_head_bytes: 1024,
            ..limits()
        },
    };
    assert!(matches!(
        Gateway::start(config, None),
        Err(smetric_gateway::GatewayError::Config {
            field: "max_head_bytes",
            ..
        })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_past_the_bound_gets_a_503_in_openais_shape_and_is_counted() {
    let plane = start_plane().await;
    let door = gateway_with(
        plane.address,
        Limits {
            max_connections: 2,
            retry_after_s: 3,
            ..limits()
        },
    );
    let address = door.address();
    let answer = tokio::task::spawn_blocking(move || {
        let held: Vec<_> = (0..2).map(|_| std::net::TcpStream::connect(address).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(100)); // both are open at the door
        let mut third = std::net::TcpStream::connect(address).unwrap();
        let answer = read_until_closed(&mut third);
        drop(held);
        answer
    })
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");
    assert!(answer.contains("retry-after: 3\r\n") && answer.contains("content-type: application/json"));
    assert!(
        answer.ends_with(r#""type":"ServiceUnavailableError","param":null,"code":503}}"#),
        "{answer}"
    );
    assert_eq!(tally(&door, "connection_limit"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_body_that_breaks_its_framing_is_a_400_not_the_control_planes_502() {
    let plane = start_plane().await;
    let door = gateway(plane.address);
    let address = door.address();
    let answer = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut stream = std::net::TcpStream::connect(address).unwrap();
        let head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
        stream
            .write_all(format!("{head}5\r\nhello\r\nzz\r\n").as_bytes())
            .unwrap();
        read_until_closed(&mut stream)
    })
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
    assert!(answer.contains(r#""type":"invalid_request_error""#), "{answer}");
    assert_eq!(tally(&door, "http_400"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_that_stalls_is_closed_and_counted() {
    let plane = start_plane().await;
    let door = gateway_with(
        plane.address,
        Limits {
            head_timeout: Duration::from_millis(300),
            ..limits()
        },
    );
    let address = door.address();
    let answer = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut stream = std::net::TcpStream::connect(address).unwrap();
        stream
            .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: a")
            .unwrap(); // never finished
        read_until_closed(&mut stream)
    })
    .await
    .unwrap();
    assert_eq!(answer, "", "closed without an answer, as the proxy does");
    assert_eq!(tally(&door, "head_timeout"), 1);
}

/// Sends `raw` on a new connection and returns everything the door answers until it closes.
async fn exchange(door: &Gateway, raw: &'static [u8]) -> String {
    let address = door.address();
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut stream = std::net::TcpStream::connect(address).unwrap();
        stream.write_all(raw).unwrap();
        read_until_closed(&mut stream)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_heads_are_answered_once_in_the_json_shape_and_never_reach_the_control_plane() {
    let cases: [(&str, &[u8]); 9] = [
        (
            "TE not chunked",
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
        ),
        (
            "TE and CL",
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}",
        ),
        (
            "CL with sign",
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\nhello",
        ),
        (
            "two CLs",
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\nhello",
        ),
        (
            "bad chunk size",
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
        ),
        (
            "NUL in a field",
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\nContent-Length: 2\r\n\r\n{}",
        ),
        (
            "space before colon",
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length : 2\r\n\r\n{}",
        ),
        ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
        (
            "unknown version",
            b"POST /v1/completions HTTP/7.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
        ),
    ];
    let plane = start_plane().await;
    let door = gateway(plane.address);
    for (case, raw) in cases {
        let answer = exchange(&door, raw).await;
        assert!(answer.starts_with("HTTP/1.1 400 "), "{case}: {answer}");
        assert_eq!(answer.matches("HTTP/1.").count(), 1, "{case}: one answer: {answer}");
        assert!(answer.contains("content-type: application/json") && answer.contains("server: smetric"));
        assert!(
            answer.ends_with(r#""type":"invalid_request_error","param":null,"code":null}}"#),
            "{case}: {answer}"
        );
    }
    assert_eq!(
        plane.seen.lock().unwrap().method,
        "",
        "no request reached the control plane"
    );
    assert_eq!(tally(&door, "http_400"), 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_head_after_good_requests_is_answered_after_theirs() {
    let plane = start_plane().await;
    let door = gateway(plane.address);
    let raw = b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}\
                POST /b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n\
                GET /c HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n";
    let answer = exchange(&door, raw).await;
    assert_eq!(answer.matches("HTTP/1.1 200 OK").count(), 2, "{answer}");
    assert!(
        answer.contains("HTTP/1.1 400 ") && answer.ends_with(r#""code":null}}"#),
        "{answer}"
    );
    assert_eq!(
        plane.seen.lock().unwrap().target,
        "/b",
        "the chunked body was followed to the next head"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_read_into_hypers_buffer_end_where_their_framing_says() {
    // Bodies larger than any one read, sent with what follows them in one write, so that reads
    // straight into hyper's buffer meet the next head (or a chunk's line end) inside them: those
    // bytes must still be validated — the malformed head at the end is refused, not forwarded.
    let plane = start_plane().await;
    let door = gateway(plane.address);
    let body: Vec<u8> = (0..300_000_u32)
        .map(|i| if i % 97 == 0 { b'\n' } else { b'x' })
        .collect();
    let chunk = &body[..200_000];
    let mut raw = format!("POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
    raw.extend_from_slice(&body);
    raw.extend_from_slice(b"POST /b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    for _ in 0..2 {
        raw.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        raw.extend_from_slice(chunk);
        raw.extend_from_slice(b"\r\n");
    }
    raw.extend_from_slice(b"0\r\n\r\nGET /c HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n");
    let address = door.address();
    let answer = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut stream = std::net::TcpStream::connect(address).unwrap();
        stream.write_all(&raw).unwrap();
        read_until_closed(&mut stream)
    })
    .await
    .unwrap();
    assert_eq!(answer.matches("HTTP/1.1 200 OK").count(), 2, "{answer}");
    assert!(
        answer.contains("HTTP/1.1 400 ") && answer.ends_with(r#""code":null}}"#),
        "the door's answer in the JSON shape, not hyper's bare one: {answer}"
    );
    assert_eq!(tally(&door, "http_400"), 1);
    let seen = plane.seen.lock().unwrap();
    assert_eq!(
        seen.all,
        vec![("/a".to_owned(), 300_000), ("/b".to_owned(), 400_000)],
        "each body whole, the refused head never forwarded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_over_the_limit_is_a_431() {
    let plane = start_plane().await;
    let door = gateway(plane.address);
    let mut raw = b"GET /health HTTP/1.1\r\nHost: x\r\n".to_vec();
    for _ in 0..3 {
        raw.extend_from_slice(b"X-Pad: ");
        raw.extend(std::iter::repeat_n(b'a', 4000));
        raw.extend_from_slice(b"\r\n");
    }
    raw.extend_from_slice(b"\r\n");
    let answer = exchange(&door, Box::leak(raw.into_boxed_slice())).await;
    assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
    assert_eq!(tally(&door, "http_431"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_the_engines_would_refuse_is_a_431_in_the_paths_api_shape_and_never_forwarded() {
    let plane = start_plane().await;
    let door = gateway(plane.address);
    let field = "a".repeat(5000); // over max_field_bytes (4096), the head under max_head_bytes
    let fields = "a".repeat(3000); // three of them: each field under, the head over (8192)
    let cases = [
        ("/v1/messages", format!("X-Session-Id: {field}\r\n"), true),
        ("/v1/chat/completions", format!("X-Session-Id: {field}\r\n"), false),
        (
            "/v1/messages",
            format!("X-A: {fields}\r\nX-B: {fields}\r\nX-C: {fields}\r\n"),
            true,
        ),
        ("/v1/completions", format!("X-{field}: 1\r\n"), false),
    ];
    for (path, fields, anthropic) in cases {
        let raw = format!("POST {path} HTTP/1.1\r\nHost: x\r\n{fields}Content-Length: 2\r\n\r\n{{}}");
        let answer = exchange(&door, Box::leak(raw.into_bytes().into_boxed_slice())).await;
        assert!(answer.starts_with("HTTP/1.1 431 "), "{path}: {answer}");
        assert_eq!(answer.matches("HTTP/1.").count(), 1, "{path}: one answer: {answer}");
        let body = answer.split("\r\n\r\n").nth(1).unwrap();
        let expected = if anthropic {
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"request header fields too large"}}"#
        } else {
            r#"{"error":{"message":"request header fields too large","type":"invalid_request_error","param":null,"code":null}}"#
        };
        assert_eq!(body, expected, "{path}");
    }
    let long_line = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "p".repeat(5000));
    let answer = exchange(&door, Box::leak(long_line.into_bytes().into_boxed_slice())).await;
    assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
    assert_eq!(
        plane.seen.lock().unwrap().method,
        "",
        "nothing reached the control plane"
    );
    assert_eq!(tally(&door, "http_431"), 5);
    let at_limit = format!(
        "POST /v1/messages HTTP/1.1\r\nHost: x\r\nX-Session-Id: {}\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}",
        "a".repeat(4096)
    );
    let answer = exchange(&door, Box::leak(at_limit.into_bytes().into_boxed_slice())).await;
    assert!(
        answer.starts_with("HTTP/1.1 200 "),
        "a field at the limit passes: {answer}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_cr_or_lf_in_a_head_is_a_400_in_the_paths_api_shape_and_never_forwarded() {
    let cases: [(&str, &[u8], bool); 5] = [
        (
            "LF inside a value, the rest a field",
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Session-Id: a\nX-Other: b\r\nContent-Length: 2\r\n\r\n{}",
            false,
        ),
        (
            "LF inside a value",
            b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nX-Session-Id: a\nb\r\nContent-Length: 2\r\n\r\n{}",
            true,
        ),
        (
            "CR inside a value",
            b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nX-Session-Id: a\rb\r\nContent-Length: 2\r\n\r\n{}",
            true,
        ),
        (
            "LF line ends",
            b"POST /v1/messages HTTP/1.1\nHost: x\nX-Session-Id: a\nContent-Length: 2\n\n{}",
            true,
        ),
        (
            "LF after the request line",
            b"POST /v1/responses HTTP/1.1\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
            false,
        ),
    ];
    let plane = start_plane().await;
    let door = gateway(plane.address);
    for (case, raw, anthropic) in cases {
        let answer = exchange(&door, raw).await;
        assert!(answer.starts_with("HTTP/1.1 400 "), "{case}: {answer}");
        assert_eq!(answer.matches("HTTP/1.").count(), 1, "{case}: one answer: {answer}");
        let body = answer.split("\r\n\r\n").nth(1).unwrap();
        let expected = if anthropic {
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"malformed HTTP request"}}"#
        } else {
            r#"{"error":{"message":"malformed HTTP request","type":"invalid_request_error","param":null,"code":null}}"#
        };
        assert_eq!(body, expected, "{case}");
    }
    assert_eq!(
        plane.seen.lock().unwrap().method,
        "",
        "nothing reached the control plane"
    );
    assert_eq!(tally(&door, "http_400"), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_while_its_request_is_in_flight_closes_the_delegated_one() {
    use std::io::{Read, Write};
    // A control plane that reads the request, never answers, and reports when the door closes
    // the connection that carried it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let (closed_tx, closed_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (mut upstream, _) = listener.accept().unwrap();
        upstream.set_read_timeout(Some(WAIT)).unwrap();
        let mut buf = [0_u8; 4096];
        let mut seen = Vec::new();
        while !seen.ends_with(b"\r\n\r\n{}") {
            let n = upstream.read(&mut buf).unwrap();
            seen.extend_from_slice(&buf[..n]);
        }
        let started = std::time::Instant::now();
        let closed = matches!(upstream.read(&mut buf), Ok(0) | Err(_));
        let _ = closed_tx.send((closed, started.elapsed()));
    });
    let door = gateway(address);
    let client_address = door.address();
    tokio::task::spawn_blocking(move || {
        let mut client = std::net::TcpStream::connect(client_address).unwrap();
        client
            .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            .unwrap();
        std::thread::sleep(Duration::from_millis(200)); // the request is at the control plane
        drop(client); // leaves without reading an answer
    })
    .await
    .unwrap();
    let (closed, after) = closed_rx.recv_timeout(2 * WAIT).unwrap();
    assert!(
        closed && after < Duration::from_secs(2),
        "closed {closed} after {after:?}"
    );
}
