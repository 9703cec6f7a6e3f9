//! The APIs of the native path, in one registry: an API is served natively when the control
//! plane armed it and a request posts to its path. O(APIs) per lookup.

use hyper::Method;

use super::messages::MESSAGES;
use super::openai::{CHAT, COMPLETIONS};
use super::protocol::Protocol;
use super::responses::RESPONSES;
use super::state::NativeApis;

/// Every API the native path knows.
const ALL: [&'static dyn Protocol; 4] = [&CHAT, &COMPLETIONS, &MESSAGES, &RESPONSES];

/// The API of `path`, armed or not.
pub(crate) fn by_path(path: &str) -> Option<&'static dyn Protocol> {
    ALL.into_iter().find(|api| api.path() == path)
}

/// The API a `method` request to `path` is served by natively, if the control plane armed it.
pub(crate) fn served(apis: NativeApis, method: &Method, path: &str) -> Option<&'static dyn Protocol> {
    if method != Method::POST {
        return None;
    }
    by_path(path).filter(|api| api.armed(apis))
}
