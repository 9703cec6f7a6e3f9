//! Every request head checked before hyper sees it, so that a malformed one is answered in the
//! proxy's JSON shape and never with hyper's own bare status.
//!
//! hyper answers a head it cannot parse itself (a status, no body) and has no hook for it. So
//! [`Validated`] sits between the socket and hyper and reads ahead of it: it buffers a head
//! whole, parses it with httparse (hyper's own parser: what passes here parses there), applies
//! the framing rules the proxy enforces — `Transfer-Encoding` exactly `chunked`, a
//! `Content-Length` of digits only and never two different ones, never both fields — and then
//! follows the body's framing (a length, or chunk sizes read with httparse) to the next head.
//! Validated bytes pass to hyper unchanged, as they arrive (a body is never buffered whole); a
//! body's bytes, which need no check but their count, are read straight into hyper's buffer.
//!
//! It also refuses what the engines behind the proxy would refuse, so that no such head is
//! forwarded and no engine's own answer (not in the API's shape) relayed: a head whose lines do
//! not all end in CRLF (httparse takes a bare LF as a line end, so `x-session-id: a\nb: c` would
//! be two fields here and something else to another parser: a 400), a head over
//! `max_head_bytes` (h11's bound on a whole head, vLLM's server: a 431), and a request line or
//! a field name or value over `max_field_bytes` (aiohttp's bound, the app's: a 431).
//!
//! A refusal ends what hyper reads right there: hyper sees the end of the stream. Between two
//! messages it closes quietly, and when it shuts the connection down [`Validated`] writes the
//! door's answer first (a 400 or a 431 in the shape of a client's mistake of the path's API:
//! Anthropic's under `/v1/messages`, OpenAI's elsewhere and when no path was read), after
//! whatever hyper wrote for the requests before it. Inside a body
//! (a bad chunk) the request is already hyper's: its body ends early and the delegation
//! answers the 400. A client that ends the stream inside a head is closed without an answer.
//!
//! A head begun and not finished within `head_timeout` ends the stream the same way, quietly
//! (as the app closes such a connection), counted as `head_timeout` before hyper closes it.
//!
//! Invariants: at most `max_head_bytes` of an unfinished head are buffered; bytes are passed in
//! order and only once; one answer per refusal. O(1) per byte beyond httparse's own pass.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use hyper::StatusCode;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Sleep;

use crate::answers::{MALFORMED, Shape, raw_json_answer, shaped_client_error_body};
use crate::counters::{ClientError, ClientErrors};

/// The most fields a head may have (hyper's own default bound).
const MAX_HEADERS: usize = 100;
/// The longest chunk-size line (with its extensions) read before it is refused.
const MAX_CHUNK_LINE: usize = 4096;
/// Bytes read from the socket at a time.
const READ_CHUNK: usize = 16 * 1024;

/// The requests of one connection that hyper is still answering. A refusal waits for them:
/// hyper gives up a request in flight when its connection's stream ends (it does not serve
/// half-closed connections, so that a client that leaves aborts its request), so the end of
/// the stream is held back until the last answer before the refused head is sent.
#[derive(Default)]
pub(crate) struct Exchange {
    in_flight: AtomicUsize,
    reader: Mutex<Option<Waker>>,
}

impl Exchange {
    /// A request handed to the service, in flight until the guard is dropped: with its answer's
    /// body once that is sent, or with the service's future if it is given up before.
    pub(crate) fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(self))
    }

    /// Its answer is sent (or given up): wakes a reader waiting to end the stream.
    fn end(&self) {
        if self.in_flight.fetch_sub(1, Ordering::AcqRel) == 1
            && let Some(waker) = self.reader.lock().ok().and_then(|mut reader| reader.take())
        {
            waker.wake();
        }
    }

    /// True when nothing is in flight; else registers `cx` to be woken when that is so.
    fn idle_or_register(&self, cx: &Context<'_>) -> bool {
        if self.in_flight.load(Ordering::Acquire) == 0 {
            return true;
        }
        if let Ok(mut reader) = self.reader.lock() {
            *reader = Some(cx.waker().clone());
        }
        // An answer may have ended between the load and the registration.
        self.in_flight.load(Ordering::Acquire) == 0
    }
}

/// One request in flight on an [`Exchange`].
pub(crate) struct InFlight(Arc<Exchange>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// An answer's body that keeps its request in flight until it is sent (or dropped).
pub(crate) type Tracked<B> = crate::answers::Held<B, InFlight>;

/// Where the next unvalidated byte is in the message stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    Head,
    Length(u64),
    ChunkSize,
    ChunkData(u64),
    ChunkEnd,
    Trailers,
}

impl Framing {
    /// The framing once `n` more body bytes have passed (`n` at most what is left of a length
    /// or a chunk; other framings carry no body bytes and stay as they are).
    fn after_body(self, n: u64) -> Self {
        match self {
            Framing::Length(left) if left == n => Framing::Head,
            Framing::Length(left) => Framing::Length(left - n),
            Framing::ChunkData(left) if left == n => Framing::ChunkEnd,
            Framing::ChunkData(left) => Framing::ChunkData(left - n),
            other => other,
        }
    }
}

enum Step {
    Progress,
    NeedMore,
}

/// The socket as hyper reads it: validated bytes only (see the module docs).
pub(crate) struct Validated<S> {
    inner: S,
    buf: Vec<u8>,
    /// `buf[..given]` went to hyper; `buf[given..given + ready]` may go.
    given: usize,
    ready: usize,
    framing: Framing,
    refusal: Option<(StatusCode, Shape)>,
    /// No more bytes pass: a refusal, anywhere.
    ended: bool,
    /// The refusal's answer and how much of it is written.
    answer: Option<(Vec<u8>, usize)>,
    client_ended: bool,
    max_head_bytes: usize,
    max_field_bytes: usize,
    errors: Arc<ClientErrors>,
    exchange: Arc<Exchange>,
    /// The time a begun head has to arrive whole, and its deadline while one is partly in.
    head_timeout: Duration,
    head_deadline: Option<Pin<Box<Sleep>>>,
    /// The connection's slot under `max_connections`: given back as soon as the client has gone
    /// (its end of the stream, or an error reading it), not when the request it left has
    /// finished unwinding — a departed client holds no slot, as in the app.
    slot: Option<OwnedSemaphorePermit>,
}

impl<S> Validated<S> {
    pub(crate) fn new(
        inner: S,
        (max_head_bytes, max_field_bytes): (usize, usize),
        head_timeout: Duration,
        errors: Arc<ClientErrors>,
        exchange: Arc<Exchange>,
        slot: OwnedSemaphorePermit,
    ) -> Self {
        Self {
            inner,
            buf: Vec::new(),
            given: 0,
            ready: 0,
            framing: Framing::Head,
            refusal: None,
            ended: false,
            answer: None,
            client_ended: false,
            max_head_bytes,
            max_field_bytes,
            errors,
            exchange,
            head_timeout,
            head_deadline: None,
            slot: Some(slot),
        }
    }

    fn unchecked(&self) -> &[u8] {
        &self.buf[self.given + self.ready..]
    }

    /// Stops passing bytes. Between two messages the door answers (at shutdown) and counts it;
    /// inside a body hyper already handed the request on, and the body's early end is answered
    /// and counted there (`delegate`), so the door only stops.
    fn refuse(&mut self, status: StatusCode, shape: Shape) -> Step {
        self.ended = true;
        if self.framing == Framing::Head {
            let kind = if status == StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE {
                ClientError::HeadTooLarge
            } else {
                ClientError::Malformed
            };
            self.errors.count(kind);
            self.refusal = Some((status, shape));
        }
        Step::Progress
    }

    fn accept(&mut self, n: usize, next: Framing) -> Step {
        self.ready += n;
        self.framing = next;
        Step::Progress
    }

    /// Validates what it can of the unchecked bytes.
    fn advance(&mut self) -> Step {
        let data = self.unchecked();
        match self.framing {
            Framing::Head => {
                let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
                let mut request = httparse::Request::new(&mut headers);
                let parsed = request.parse(data);
                // httparse fills the path in as it reads, so a head refused after its request
                // line is answered in its API's shape.
                let shape = Shape::of_path(request.path);
                match parsed {
                    Ok(httparse::Status::Complete(n)) if n > self.max_head_bytes => {
                        self.refuse(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, shape)
                    }
                    Ok(httparse::Status::Complete(n))
                        if over_field_limit(&data[..n], request.headers, self.max_field_bytes) =>
                    {
                        self.refuse(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, shape)
                    }
                    Ok(httparse::Status::Complete(n)) if has_bare_line_end(&data[..n]) => {
                        self.refuse(StatusCode::BAD_REQUEST, shape)
                    }
                    Ok(httparse::Status::Complete(n)) => match body_framing(request.headers) {
                        Some(next) => self.accept(n, next),
                        None => self.refuse(StatusCode::BAD_REQUEST, shape),
                    },
                    Ok(httparse::Status::Partial) if data.len() > self.max_head_bytes => {
                        self.refuse(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, shape)
                    }
                    Ok(httparse::Status::Partial) => Step::NeedMore,
                    Err(_) => self.refuse(StatusCode::BAD_REQUEST, shape),
                }
            }
            Framing::Length(left) | Framing::ChunkData(left) => {
                let take = (data.len() as u64).min(left);
                if take == 0 {
                    return Step::NeedMore;
                }
                let next = self.framing.after_body(take);
                self.accept(take as usize, next)
            }
            Framing::ChunkSize => match httparse::parse_chunk_size(data) {
                Ok(httparse::Status::Complete((n, 0))) => self.accept(n, Framing::Trailers),
                Ok(httparse::Status::Complete((n, size))) => self.accept(n, Framing::ChunkData(size)),
                Ok(httparse::Status::Partial) if data.len() > MAX_CHUNK_LINE => {
                    self.refuse(StatusCode::BAD_REQUEST, Shape::OpenAi)
                }
                Ok(httparse::Status::Partial) => Step::NeedMore,
                Err(_) => self.refuse(StatusCode::BAD_REQUEST, Shape::OpenAi),
            },
            Framing::ChunkEnd => match data {
                [b'\r', b'\n', ..] => self.accept(2, Framing::ChunkSize),
                [] | [b'\r'] => Step::NeedMore,
                _ => self.refuse(StatusCode::BAD_REQUEST, Shape::OpenAi),
            },
            Framing::Trailers => {
                let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
                match httparse::parse_headers(data, &mut headers) {
                    Ok(httparse::Status::Complete((n, _))) => self.accept(n, Framing::Head),
                    Ok(httparse::Status::Partial) if data.len() > self.max_head_bytes => {
                        self.refuse(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, Shape::OpenAi)
                    }
                    Ok(httparse::Status::Partial) => Step::NeedMore,
                    Err(_) => self.refuse(StatusCode::BAD_REQUEST, Shape::OpenAi),
                }
            }
        }
    }

    /// Whether the head begun in the buffer has outlived `head_timeout` (counted, and the
    /// stream ended, before the connection closes); arms the deadline at a head's first byte
    /// and drops it once no head is partly in (registering `cx` while it runs).
    fn head_late(&mut self, cx: &mut Context<'_>) -> bool {
        if self.framing != Framing::Head || self.unchecked().is_empty() {
            self.head_deadline = None;
            return false;
        }
        let timeout = self.head_timeout;
        let deadline = self
            .head_deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if deadline.as_mut().poll(cx).is_pending() {
            return false;
        }
        self.head_deadline = None;
        self.errors.count(ClientError::HeadTimeout);
        self.ended = true;
        true
    }

    /// Drops what hyper already has, once it is most of the buffer.
    fn compact(&mut self) {
        if self.given > 0 && self.given * 2 >= self.buf.len() {
            self.buf.drain(..self.given);
            self.given = 0;
        }
    }
}

/// Whether a whole head has a line end other than CRLF: a bare LF (which httparse takes as a
/// line end) or a bare CR (which it refuses anyway). O(head bytes).
fn has_bare_line_end(head: &[u8]) -> bool {
    head.iter().enumerate().any(|(i, &b)| match b {
        b'\n' => i == 0 || head[i - 1] != b'\r',
        b'\r' => head.get(i + 1) != Some(&b'\n'),
        _ => false,
    })
}

/// Whether a whole head's request line, or a field's name or value, is longer than `max`.
fn over_field_limit(head: &[u8], headers: &[httparse::Header<'_>], max: usize) -> bool {
    let line = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
    line > max + 1 || headers.iter().any(|h| h.name.len() > max || h.value.len() > max)
}

/// The body's framing from a head's fields; None for a head the proxy refuses (RFC 9112 §6:
/// a `Transfer-Encoding` other than `chunked` alone, a `Content-Length` that is not digits or
/// disagrees with another, or both fields at once — the ways to smuggle a request).
fn body_framing(headers: &[httparse::Header<'_>]) -> Option<Framing> {
    let mut chunked = false;
    let mut length: Option<u64> = None;
    for header in headers {
        if header.name.eq_ignore_ascii_case("transfer-encoding") {
            if chunked || !header.value.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                return None;
            }
            chunked = true;
        } else if header.name.eq_ignore_ascii_case("content-length") {
            let digits = header.value.trim_ascii();
            if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
                return None;
            }
            let value: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
            if length.is_some_and(|earlier| earlier != value) {
                return None;
            }
            length = Some(value);
        }
    }
    match (chunked, length) {
        (true, Some(_)) => None,
        (true, None) => Some(Framing::ChunkSize),
        (false, Some(n)) if n > 0 => Some(Framing::Length(n)),
        (false, _) => Some(Framing::Head),
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Validated<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, out: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.ready > 0 {
                let n = this.ready.min(out.remaining());
                out.put_slice(&this.buf[this.given..this.given + n]);
                this.given += n;
                this.ready -= n;
                this.compact();
                return Poll::Ready(Ok(()));
            }
            if this.client_ended {
                return Poll::Ready(Ok(())); // the end of the stream, for hyper
            }
            if this.ended {
                // Inside a body: at once, so the request's body ends early. Before a head: after
                // the answers to the requests before it.
                let now = this.refusal.is_none() || this.exchange.idle_or_register(cx);
                return if now { Poll::Ready(Ok(())) } else { Poll::Pending };
            }
            if matches!(this.advance(), Step::Progress) {
                continue;
            }
            if let Framing::Length(left) | Framing::ChunkData(left) = this.framing
                && out.remaining() > 0
            {
                return this.pass_body(cx, out, left);
            }
            let mut chunk = [0_u8; READ_CHUNK];
            let mut read = ReadBuf::new(&mut chunk);
            let polled = Pin::new(&mut this.inner).poll_read(cx, &mut read);
            if polled.is_pending() {
                if this.head_late(cx) {
                    continue; // ended: the stream ends for hyper, which closes quietly
                }
                return Poll::Pending;
            }
            if let Poll::Ready(Err(e)) = polled {
                this.slot = None;
                return Poll::Ready(Err(e));
            }
            if read.filled().is_empty() {
                this.client_ended = true; // an unfinished head is dropped, never passed on
                this.slot = None;
            } else {
                this.buf.extend_from_slice(read.filled());
            }
        }
    }
}

impl<S: AsyncRead + Unpin> Validated<S> {
    /// Reads body bytes straight into hyper's buffer, with nothing of ours buffered (`advance`
    /// has passed it all): a body's bytes need no check but their count, so they are not copied
    /// through `buf`, and a read may be as large as hyper's buffer (`server.rs`, `MAX_READ_BYTES`)
    /// instead of [`READ_CHUNK`] — a 130 KB body in two or three reads, not nine. Bytes past the
    /// body's end (a pipelined head, a chunk's line end) are taken back from hyper's buffer into
    /// `buf`, to be validated as every other byte is.
    fn pass_body(&mut self, cx: &mut Context<'_>, out: &mut ReadBuf<'_>, left: u64) -> Poll<io::Result<()>> {
        // A head has been read whole since the framing left `Head`: its deadline is done.
        self.head_deadline = None;
        let before = out.filled().len();
        if let Err(e) = ready!(Pin::new(&mut self.inner).poll_read(cx, out)) {
            self.slot = None;
            return Poll::Ready(Err(e));
        }
        let read = out.filled().len() - before;
        if read == 0 {
            // The end of the stream inside a body: hyper sees it and ends the body early.
            self.client_ended = true;
            self.slot = None;
            return Poll::Ready(Ok(()));
        }
        let take = usize::try_from(left).map_or(read, |left| left.min(read));
        if take < read {
            self.buf.extend_from_slice(&out.filled()[before + take..]);
            out.set_filled(before + take);
        }
        self.framing = self.framing.after_body(take as u64);
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Validated<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, data)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    /// Writes the refusal's answer (if any) before the connection closes.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some((status, shape)) = this.refusal.take() {
            let body = shaped_client_error_body(shape, status, message(status));
            this.answer = Some((raw_json_answer(status, &body, ""), 0));
        }
        if let Some((answer, written)) = &mut this.answer {
            while *written < answer.len() {
                let n = ready!(Pin::new(&mut this.inner).poll_write(cx, &answer[*written..]))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                *written += n;
            }
            ready!(Pin::new(&mut this.inner).poll_flush(cx))?;
        }
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

/// The fixed message of a refusal, as the app's (`http_guard.py`).
fn message(status: StatusCode) -> &'static str {
    if status == StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE {
        "request header fields too large"
    } else {
        MALFORMED
    }
}
