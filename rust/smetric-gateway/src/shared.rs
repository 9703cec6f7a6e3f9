//! What the two halves of `smetric serve` must agree on — the compiled gateway (this crate) and
//! the Python app and its helpers — defined once, here. The bindings export each constant to
//! Python as `smetric._core.SHARED_<NAME>` and the Python modules read them from there, so a
//! change made here is a change in both planes; nothing is copied by hand.
//!
//! Invariants: every constant here is exported by `rust/smetric-py/src/lib.rs` and read by its
//! Python user (`tests/test_architecture.py` checks that no Python module defines one of these
//! values itself).

/// RFC 9110 §7.6.1's hop-by-hop fields (and the older ones proxies still meet): never forwarded,
/// by the gateway to an engine nor by the app.
pub const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Headers naming a request's session, in the order they are read (vllm-router's
/// `x-session-id` first; Claude Code's, then the `thread-id` / `session-id` the Responses
/// clients send, then Dynamo's).
pub const SESSION_HEADERS: [&str; 5] = [
    "x-session-id",
    "x-claude-code-session-id",
    "thread-id",
    "session-id",
    "x-dynamo-session-id",
];
/// Headers naming the agent a request's agent was spawned by (Codex, Claude Code, OpenCode,
/// Dynamo), in the order they are read.
pub const PARENT_HEADERS: [&str; 4] = [
    "x-codex-parent-thread-id",
    "x-claude-code-parent-agent-id",
    "x-parent-session-id",
    "x-dynamo-parent-session-id",
];
/// Headers marking a session's last request (smetric's, Dynamo's): `true` or `false`.
pub const END_HEADERS: [&str; 2] = ["x-session-end", "x-dynamo-session-final"];
/// The error a cut stream ends with when it could not be continued.
pub const CUT_MESSAGE: &str = "the stream was cut and could not be continued";
/// The door's refusals, worded once: a full queue (429; `{admitted}` and `{queued}` filled in),
/// a wait past the queue's timeout (503; `{seconds}`), a draining proxy (503).
pub const REFUSED_AT_CAPACITY: &str = "the proxy is at capacity ({admitted} requests in flight, {queued} queued)";
/// See [`REFUSED_AT_CAPACITY`].
pub const REFUSED_QUEUE_TIMEOUT: &str = "no capacity freed within {seconds} s in the proxy's queue";
/// See [`REFUSED_AT_CAPACITY`].
pub const REFUSED_DRAINING: &str = "the proxy is shutting down";
/// The usage request spliced into a streamed OpenAI body (the engine then reports usage).
pub const USAGE_OPTION: &[u8] = br#"{"stream_options":{"include_usage":true},"#;
/// Upper bounds (seconds) of the admission queue-wait histogram.
pub const WAIT_BUCKETS_S: [f64; 14] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Hex digits of a stored-response id's instance tag and of its mac.
pub const PIN_TAG_HEX: usize = 12;
/// See [`PIN_TAG_HEX`].
pub const PIN_MAC_HEX: usize = 32;
/// The most characters of a client's value an error message repeats (`request.ECHOED_CHARS`):
/// a 100 KB model name does not come back whole.
pub const ECHOED_CHARS: usize = 256;
/// The longest session id the end endpoints accept, in bytes (`session.session_id_problem`).
pub const MAX_SESSION_ID_BYTES: usize = 256;
/// llm-d's session-affinity cookie: the base64 of the instance that served the session last
/// (read and set for the `llmd_session_affinity` policy).
pub const AFFINITY_COOKIE: &str = "llm-d-session";
/// The attributes llm-d sets the cookie with (`SessionAffinity.ResponseReceived`).
pub const AFFINITY_ATTRIBUTES: &str = "Path=/; HttpOnly; SameSite=Lax";
/// UTF-8 bytes per id of the byte-chunk tokenizer (the approximate ids without a tokenizer).
pub const BYTE_CHUNK_BYTES: usize = 4;
/// A system text block of an Anthropic request that starts with it is dropped (Claude Code's
/// per-request billing line, which would otherwise break every prefix).
pub const BILLING_HEADER_PREFIX: &str = "x-anthropic-billing-header";
/// Every route the proxy serves, as `(method, path pattern)` in aiohttp's pattern syntax (the
/// app registers these through its API adapters and fixed routes; `tests/serve` checks the two
/// tables are equal): `{name}` is one path segment (aiohttp's `[^{}/]+`), `{name:[\s\S]+}` one
/// or more of any character. A path no pattern matches is the pass-through API's 404
/// ([`NO_ROUTE`]); a path some pattern matches with another method, a 405 naming those methods.
pub const ROUTES: [(&str, &str); 25] = [
    ("GET", "/v1/models"),
    ("HEAD", "/v1/models"),
    ("GET", "/health"),
    ("HEAD", "/health"),
    ("GET", "/metrics"),
    ("HEAD", "/metrics"),
    ("POST", "/admin/instances"),
    ("DELETE", "/admin/instances"),
    ("POST", r"/v1/sessions/{session_id:[\s\S]+}/end"),
    ("POST", "/finish_session"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/responses"),
    ("GET", "/v1/responses/{response_id}"),
    ("DELETE", "/v1/responses/{response_id}"),
    ("POST", "/v1/responses/{response_id}/cancel"),
    ("POST", "/v1/messages"),
    ("POST", "/v1/messages/count_tokens"),
    ("POST", "/v1/embeddings"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("POST", "/v1/rerank"),
    ("POST", "/v1/score"),
    ("POST", "/pooling"),
    ("GET", "/v1/models/{model_id}"),
];
/// The 404 of a path no route serves (`{path}`: the request's path).
pub const NO_ROUTE: &str = "no such route: {path}";
/// The 405 of a path served with other methods (its `Allow` names them).
pub const WRONG_METHOD: &str = "method not allowed on this endpoint";
/// The 400 of an end header whose value is neither true nor false (`{name}`: the header).
pub const BAD_END_HEADER: &str = "{name} must be true or false";
/// The 400 of an end header on a request that names no session.
pub const END_WITHOUT_SESSION: &str = "x-session-end names no session: send the session's id (x-session-id)";
/// The 400s of an end endpoint's session id no client session can have (`{size}`, `{max}`: its
/// UTF-8 bytes and [`MAX_SESSION_ID_BYTES`]), checked in this order.
pub const SESSION_ID_EMPTY: &str = "the session id is empty";
pub const SESSION_ID_TOO_LONG: &str = "the session id is {size} bytes; at most {max} are accepted";
pub const SESSION_ID_CONTROL: &str = "the session id holds a control character (CR, LF, NUL, ...)";
/// The answer to a request pinned to a stored response whose instance is gone (`{where}`: one
/// of the two places below; `{instance}`, `{cause}`: the instance and why it failed).
pub const LOST_STATE: &str = "the stored response this request names lived on {where}: it is lost (no other \
                              instance holds it); send the whole conversation instead (store: false, no \
                              previous_response_id)";
pub const LOST_STATE_LEFT: &str = "an instance no longer in the fleet";
pub const LOST_STATE_FAILED: &str = "instance {instance}, which {cause}";
/// The 400 of a request without token ids when the proxy routes on token ids only.
pub const IDS_ONLY: &str = "this proxy routes on token ids: send prompt as a list of token ids";
