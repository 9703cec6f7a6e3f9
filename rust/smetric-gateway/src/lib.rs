//! The compiled data plane of `smetric serve` (`docs/proxy-data-plane.md`, "The compiled data
//! plane: design and stages"): a gateway that owns the proxy's public listener and serves the
//! data path in Rust, with the Python app behind it as the control plane.
//!
//! **The door** (stage 1). One listener, on a thread of its own running a current-thread tokio
//! runtime (the proxy's hot path never waits for the GIL). Each connection is served HTTP/1.1 by
//! hyper with the [`Limits`] (head size, head timeout, open connections: past the bound a new
//! connection gets a 503 in OpenAI's shape and is closed unread). A request the gateway does not
//! serve itself is *delegated* (`delegate`): its head and its body, streamed as they arrive,
//! go to the control plane — the Python app on a loopback address only the gateway knows — and
//! the answer comes back the same way.
//!
//! **The native path** (stage 2, [`native`]), when the control plane arms it: the APIs'
//! requests take their admission slot at the door (`admission`), and chat and completions are
//! served on the app's own router, with records of what happened for the app (`records`);
//! what the native path cannot finish is handed to the app ([`handoff`]).
//!
//! Invariants: the gateway fetches only the configured control plane and the fleet's instances,
//! never a URL taken from a request; a delegated body is streamed both ways (a native one is
//! read whole, within `max_body_bytes`); hop-by-hop fields never cross it (RFC 9110 §7.6.1); a
//! control plane that cannot be reached is a 502 in OpenAI's error shape, never a dropped
//! connection, and a client whose body breaks its own framing gets a 400, not the control
//! plane's 502; what the door refuses is counted under the proxy's kinds
//! ([`Gateway::client_errors`]); [`Gateway::stop`] stops accepting at once and gives the
//! requests in flight the drain time.
//! Complexity: O(1) per request beyond the bytes moved and one header pass each way; a native
//! request adds one parse, one render and one route of its body.

mod admission;
mod answers;
mod counters;
mod delegate;
pub mod engine_load;
pub mod handoff;
pub mod native;
mod records;
mod server;
pub mod session_gate;
pub mod session_table;
pub mod shared;
pub mod tokens;
mod validate;

pub use admission::{AdmissionLimits, AdmissionSnapshot, WAIT_BUCKETS_S};
pub use native::{FleetView, NativeApis, NativeConfig, NativeHandles, Routing};
pub use records::Record;
pub use server::{Gateway, GatewayConfig, GatewayError, Limits};
