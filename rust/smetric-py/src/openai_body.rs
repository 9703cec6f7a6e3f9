//! `parse_openai_body`: a thin binding of `smetric_vllm::openai_body`, the router's parse of an
//! OpenAI request body. `smetric.serve.request.parse_request` is the typed facade. Beside it,
//! `escapes_lone_surrogate` (`smetric_vllm::lone_surrogate`), the proxy's check of any API's body,
//! and `nests_too_deep` with `MAX_JSON_NESTING` (the same limit `parse_openai_body` applies), for
//! the APIs whose bodies Python decodes.
//!
//! Token ids cross into Python as one `bytes` object of native-endian u32s (the facade wraps it
//! in an `array('I')` with one copy), never as a list of ints; `messages`, `tools` and
//! `chat_template_kwargs` as the JSON text of their values. The parse runs without the GIL.
//! A rejected body raises `smetric.errors.InvalidArgumentError` with `argument` = the offending
//! field, or `"body"` when the body is not JSON or not an object.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyModule};
use smetric_vllm::openai_body::{MAX_NESTING, nests_deeper_than};
use smetric_vllm::{BodyError, Endpoint, Prompt, parse_openai_body as parse};

use crate::errors::python_error;

/// The fields of an OpenAI request body that a router reads (see ``parse_openai_body``).
#[pyclass(frozen, get_all, module = "smetric._core", name = "OpenAIBody")]
#[allow(clippy::struct_excessive_bools)] // the request's own boolean fields, one each
pub(crate) struct PyOpenAIBody {
    model: Option<String>,
    stream: bool,
    max_tokens: Option<u64>,
    user: Option<String>,
    prompt_cache_key: Option<String>,
    cache_salt: Option<String>,
    messages_json: Option<String>,
    tools_json: Option<String>,
    chat_template_kwargs_json: Option<String>,
    add_generation_prompt: bool,
    continue_final_message: bool,
    add_special_tokens: bool,
    prompt_text: Option<String>,
    prompt_ids: Option<Py<PyBytes>>,
    stream_options_json: Option<String>,
    kv_transfer_params: bool,
}

fn body_error(py: Python<'_>, err: &BodyError) -> PyErr {
    let argument = err.param.unwrap_or("body");
    python_error(py, "InvalidArgumentError", &err.message, |k| {
        k.set_item("argument", argument)?;
        k.set_item("reason", &err.message)
    })
}

/// Parses the body of an OpenAI-compatible request.
///
/// Args:
///     raw: the request body.
///     endpoint: ``"chat"`` (``/v1/chat/completions``; ``messages`` required) or
///         ``"completions"`` (``/v1/completions``; ``prompt`` required).
///
/// Returns:
///     OpenAIBody: the fields a router reads; ``prompt_ids`` is native-endian u32 bytes.
///
/// Raises:
///     InvalidArgumentError: malformed JSON (``argument="body"``), or a field of the wrong type
///         or value (``argument`` = the field).
#[pyfunction]
#[allow(clippy::doc_markdown)] // a Python docstring (it becomes `__doc__`), not rustdoc
fn parse_openai_body(py: Python<'_>, raw: &[u8], endpoint: &str) -> PyResult<PyOpenAIBody> {
    let endpoint = match endpoint {
        "chat" => Endpoint::Chat,
        "completions" => Endpoint::Completions,
        other => {
            let message = format!("endpoint must be 'chat' or 'completions', got {other:?}");
            return Err(python_error(py, "InvalidArgumentError", &message, |k| {
                k.set_item("argument", "endpoint")?;
                k.set_item("reason", &message)
            }));
        }
    };
    // `raw` is an immutable bytes object the caller holds, so its slices outlive the release.
    let parsed = py.detach(|| {
        parse(raw, endpoint).map(|mut body| {
            let (prompt_text, prompt_ids) = match body.prompt.take() {
                Some(Prompt::Text(text)) => (Some(text), None),
                Some(Prompt::Ids(ids)) => (None, Some(ids)),
                None => (None, None),
            };
            (body, prompt_text, prompt_ids)
        })
    });
    let (body, prompt_text, prompt_ids) = parsed.map_err(|e| body_error(py, &e))?;
    let prompt_ids = prompt_ids.map(|ids| {
        PyBytes::new_with(py, ids.len() * 4, |out| {
            for (chunk, id) in out.chunks_exact_mut(4).zip(&ids) {
                chunk.copy_from_slice(&id.to_ne_bytes());
            }
            Ok(())
        })
        .map(Bound::unbind)
    });
    Ok(PyOpenAIBody {
        model: body.model,
        stream: body.stream,
        max_tokens: body.max_tokens,
        user: body.user,
        prompt_cache_key: body.prompt_cache_key,
        cache_salt: body.cache_salt,
        messages_json: body.messages.map(str::to_owned),
        tools_json: body.tools.map(str::to_owned),
        chat_template_kwargs_json: body.chat_template_kwargs.map(str::to_owned),
        add_generation_prompt: body.add_generation_prompt,
        continue_final_message: body.continue_final_message,
        add_special_tokens: body.add_special_tokens,
        prompt_text,
        prompt_ids: prompt_ids.transpose()?,
        stream_options_json: body.stream_options.map(str::to_owned),
        kv_transfer_params: body.kv_transfer_params,
    })
}

/// Whether a JSON body escapes half of a UTF-16 surrogate pair alone (``"\ud800"``).
///
/// Valid JSON, but no Unicode text: an engine decodes such a body, then fails on it. An escaped
/// pair (``"\ud83d\ude00"``) is text, and so is ``"\\ud800"`` (an escaped backslash). One
/// vectorized search for ``\u`` over the body; the GIL is released.
///
/// Args:
///     raw: a body that parsed as JSON.
///
/// Returns:
///     bool: whether it escapes a lone surrogate.
#[pyfunction]
#[allow(clippy::doc_markdown)] // a Python docstring (it becomes `__doc__`), not rustdoc
fn escapes_lone_surrogate(py: Python<'_>, raw: &[u8]) -> bool {
    // `raw` is an immutable bytes object the caller holds, so the slice outlives the release.
    py.detach(|| smetric_vllm::escapes_lone_surrogate(raw))
}

/// Whether a body nests arrays and objects deeper than ``MAX_JSON_NESTING`` levels.
///
/// The limit ``parse_openai_body`` applies to chat and completions bodies, for the APIs whose
/// bodies are decoded in Python (Messages, Responses): CPython's ``json`` would take them to
/// about 950 levels and an engine's decoder may not. Brackets inside strings do not count. One
/// vectorized count of the opening brackets, a walk only past the limit; the GIL is released.
///
/// Args:
///     raw: a request body (any bytes).
///
/// Returns:
///     bool: whether it nests deeper than the limit.
#[pyfunction]
#[allow(clippy::doc_markdown)] // a Python docstring (it becomes `__doc__`), not rustdoc
fn nests_too_deep(py: Python<'_>, raw: &[u8]) -> bool {
    // `raw` is an immutable bytes object the caller holds, so the slice outlives the release.
    py.detach(|| nests_deeper_than(raw, MAX_NESTING))
}

/// The 400 message every API gives a body that is not JSON, when CPython's decoder rejects it
/// too (the Messages and Responses adapters ask after ``json.loads`` failed), else None.
///
/// Args:
///     raw: a request body (any bytes).
///
/// Returns:
///     str | None: ``malformed JSON body: …`` in the parser's words, or None.
#[pyfunction]
#[allow(clippy::doc_markdown)] // a Python docstring (it becomes `__doc__`), not rustdoc
fn json_syntax_error(py: Python<'_>, raw: &[u8]) -> Option<String> {
    // `raw` is an immutable bytes object the caller holds, so the slice outlives the release.
    py.detach(|| smetric_vllm::json_syntax_error(raw))
}

/// Adds `parse_openai_body`, `OpenAIBody`, `escapes_lone_surrogate`, `nests_too_deep`,
/// `json_syntax_error` and `MAX_JSON_NESTING` to `smetric._core`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyOpenAIBody>()?;
    m.add_function(wrap_pyfunction!(parse_openai_body, m)?)?;
    m.add_function(wrap_pyfunction!(escapes_lone_surrogate, m)?)?;
    m.add_function(wrap_pyfunction!(nests_too_deep, m)?)?;
    m.add_function(wrap_pyfunction!(json_syntax_error, m)?)?;
    m.add("MAX_JSON_NESTING", MAX_NESTING)?;
    Ok(())
}
