//! `smetric._core`: the PyO3 bindings of `smetric-core`. Only conversion and error mapping
//! live here; every decision is made by the core.

// PyO3 hands extracted arguments over by value; borrowing them instead is not an option.
#![allow(clippy::needless_pass_by_value)]

use pyo3::prelude::*;
use pyo3::types::PyTuple;

mod admission;
mod config;
mod convert;
mod engine;
mod engine_load;
mod errors;
mod events;
mod gateway;
mod names;
mod openai_body;
mod pd;
mod router;
mod sessions;
mod sim;
mod vllm;

/// The compiled core of smetric. Import the public API from ``smetric`` instead.
#[pymodule(gil_used = false)]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<router::PyRouter>()?;
    m.add_class::<engine_load::PyEngineLoadScrape>()?;
    m.add_class::<engine_load::PyEngineSample>()?;
    m.add_class::<engine_load::PyEngineScrapeStats>()?;
    m.add_function(wrap_pyfunction!(engine_load::engine_sample, m)?)?;
    m.add_function(wrap_pyfunction!(engine_load::parse_prometheus, m)?)?;
    m.add_class::<gateway::PyGateway>()?;
    m.add_class::<gateway::PyGatewayNative>()?;
    m.add_class::<gateway::PyGatewayTokenSource>()?;
    m.add_class::<gateway::PyGatewayRecord>()?;
    m.add_class::<sessions::PySessionTable>()?;
    m.add_function(wrap_pyfunction!(sessions::session_digest, m)?)?;
    m.add("SESSION_ENTRY_BYTES", smetric_gateway::session_table::ENTRY_BYTES)?;
    m.add_function(wrap_pyfunction!(gateway::gateway_routing_ids, m)?)?;
    {
        use smetric_gateway::handoff as n;
        m.add("GATEWAY_HEADER", n::GATEWAY_HEADER)?;
        m.add("GATEWAY_ADMITTED_HEADER", n::ADMITTED_HEADER)?;
        m.add("GATEWAY_REFUSED_HEADER", n::REFUSED_HEADER)?;
        m.add("GATEWAY_TURN_HEADER", n::TURN_HEADER)?;
        m.add("GATEWAY_SESSION_END_RECORD", n::SESSION_END_RECORD)?;
    }
    {
        use smetric_gateway::shared as s;
        m.add("SHARED_HOP_BY_HOP", PyTuple::new(m.py(), s::HOP_BY_HOP)?)?;
        m.add("SHARED_SESSION_HEADERS", PyTuple::new(m.py(), s::SESSION_HEADERS)?)?;
        m.add("SHARED_PARENT_HEADERS", PyTuple::new(m.py(), s::PARENT_HEADERS)?)?;
        m.add("SHARED_END_HEADERS", PyTuple::new(m.py(), s::END_HEADERS)?)?;
        m.add("SHARED_CUT_MESSAGE", s::CUT_MESSAGE)?;
        m.add("SHARED_MAX_SESSION_ID_BYTES", s::MAX_SESSION_ID_BYTES)?;
        m.add("SHARED_ECHOED_CHARS", s::ECHOED_CHARS)?;
        m.add("SHARED_REFUSED_AT_CAPACITY", s::REFUSED_AT_CAPACITY)?;
        m.add("SHARED_REFUSED_QUEUE_TIMEOUT", s::REFUSED_QUEUE_TIMEOUT)?;
        m.add("SHARED_REFUSED_DRAINING", s::REFUSED_DRAINING)?;
        m.add(
            "SHARED_USAGE_OPTION",
            pyo3::types::PyBytes::new(m.py(), s::USAGE_OPTION),
        )?;
        m.add("SHARED_WAIT_BUCKETS_S", PyTuple::new(m.py(), s::WAIT_BUCKETS_S)?)?;
        m.add("SHARED_PIN_TAG_HEX", s::PIN_TAG_HEX)?;
        m.add("SHARED_PIN_MAC_HEX", s::PIN_MAC_HEX)?;
        m.add("SHARED_BYTE_CHUNK_BYTES", s::BYTE_CHUNK_BYTES)?;
        m.add("SHARED_AFFINITY_COOKIE", s::AFFINITY_COOKIE)?;
        m.add("SHARED_AFFINITY_ATTRIBUTES", s::AFFINITY_ATTRIBUTES)?;
        m.add("SHARED_BILLING_HEADER_PREFIX", s::BILLING_HEADER_PREFIX)?;
        m.add("SHARED_ROUTES", PyTuple::new(m.py(), s::ROUTES)?)?;
        m.add("SHARED_NO_ROUTE", s::NO_ROUTE)?;
        m.add("SHARED_WRONG_METHOD", s::WRONG_METHOD)?;
        m.add("SHARED_BAD_END_HEADER", s::BAD_END_HEADER)?;
        m.add("SHARED_END_WITHOUT_SESSION", s::END_WITHOUT_SESSION)?;
        m.add("SHARED_IDS_ONLY", s::IDS_ONLY)?;
        m.add("SHARED_LOST_STATE", s::LOST_STATE)?;
        m.add("SHARED_LOST_STATE_LEFT", s::LOST_STATE_LEFT)?;
        m.add("SHARED_LOST_STATE_FAILED", s::LOST_STATE_FAILED)?;
        m.add("SHARED_SESSION_ID_EMPTY", s::SESSION_ID_EMPTY)?;
        m.add("SHARED_SESSION_ID_TOO_LONG", s::SESSION_ID_TOO_LONG)?;
        m.add("SHARED_SESSION_ID_CONTROL", s::SESSION_ID_CONTROL)?;
    }
    m.add_class::<router::PyDecision>()?;
    m.add_class::<router::PyIndexHits>()?;
    m.add_class::<config::PyRouterConfig>()?;
    m.add_class::<admission::PySessionAdmission>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("DEFAULT_BLOCK_SIZE", smetric_core::DEFAULT_BLOCK_SIZE)?;
    m.add("L_EQ_QWEN3_CODER_30B_A3B", smetric_core::L_EQ_QWEN3_CODER_30B_A3B)?;
    m.add("L_EQ_QWEN3_235B_A22B", smetric_core::L_EQ_QWEN3_235B_A22B)?;
    // The policy names, generated from the core's list so Python never restates them.
    let policies = smetric_core::PolicyKind::ALL.map(smetric_core::PolicyKind::name);
    m.add("POLICIES", PyTuple::new(m.py(), policies)?)?;
    vllm::register(m)?;
    events::register(m)?;
    sim::register(m)?;
    engine::register(m)?;
    openai_body::register(m)?;
    pd::register(m)?;
    Ok(())
}
