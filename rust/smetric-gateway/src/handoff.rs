//! The fields the gateway and the app speak between them, on the loopback hop only: the
//! gateway's secret vouches for a request, and with it the app reads what the gateway decided
//! (admitted, refused) or tried (attempts that failed, a stream that was cut). The gateway drops
//! a client's own fields of these names before it delegates anything (`crate::delegate`), and
//! the app trusts them only with the secret.

/// The header that carries the gateway's per-process secret on everything it sends the app.
pub const GATEWAY_HEADER: &str = "x-smetric-gateway";
/// The door admitted the request (the app must not admit it again).
pub const ADMITTED_HEADER: &str = "x-smetric-gateway-admitted";
/// The door refused the request: the reason (`queue_full`, `queue_timeout`, `draining`).
pub const REFUSED_HEADER: &str = "x-smetric-gateway-refused";
/// The attempt whose stream was cut, on a continuation handed to the app: `<instance> <cause>`
/// (the gateway fails over every attempt that fails before the client's first byte itself).
pub const FAILED_HEADER: &str = "x-smetric-gateway-failed";
/// The turn the gateway counted in the session table for a hinted request it hands on (the
/// app routes with it and does not count the request again).
pub const TURN_HEADER: &str = "x-smetric-gateway-turn";
/// The API of a cut stream sent to the app's continuation endpoint (`chat`, `completions`).
pub const API_HEADER: &str = "x-smetric-gateway-api";
/// The app's endpoint that continues a cut stream the gateway was relaying: its body is the
/// client's body's length in decimal and a newline, that body, then the stream's bytes so far.
pub const CONTINUE_PATH: &str = "/_smetric/gateway/continue";
/// The API name of a record that is not a request's: an end endpoint the gateway answered
/// (the app counts the end, and logs no request).
pub const SESSION_END_RECORD: &str = "session_end";
