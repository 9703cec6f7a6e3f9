//! The fields the gateway and the app speak between them, on the loopback hop only: the
//! gateway's secret vouches for a request, and with it the app reads what the gateway decided
//! (admitted, refused, the turn it counted). The gateway drops
//! a client's own fields of these names before it delegates anything (`crate::delegate`), and
//! the app trusts them only with the secret.

/// The header that carries the gateway's per-process secret on everything it sends the app.
pub const GATEWAY_HEADER: &str = "x-smetric-gateway";
/// The door admitted the request (the app must not admit it again).
pub const ADMITTED_HEADER: &str = "x-smetric-gateway-admitted";
/// The door refused the request: the reason (`queue_full`, `queue_timeout`, `draining`).
pub const REFUSED_HEADER: &str = "x-smetric-gateway-refused";
/// The turn the gateway counted in the session table for a hinted request it hands on (the
/// app routes with it and does not count the request again).
pub const TURN_HEADER: &str = "x-smetric-gateway-turn";
/// The API name of a record that is not a request's: an end endpoint the gateway answered
/// (the app counts the end, and logs no request).
pub const SESSION_END_RECORD: &str = "session_end";
