//! `SessionAdmission`: a thin wrapper over `smetric_core::session_admission::SessionAdmission`,
//! the stage after the policy that admits, moves or holds a session's request when its
//! instance's resident sessions would overflow the KV cache.
//!
//! Every call is O(resident sessions) and keeps the GIL (no call is long enough to release it);
//! the state sits behind a mutex so the frozen class can be shared between threads.

use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use smetric_core::SmetricError;
use smetric_core::session_admission::{
    Admission, AdmissionConfig, AdmissionMode, AdmitRequest, DEFAULT_IDLE_WINDOW_S, DEFAULT_MAX_SESSIONS_PER_INSTANCE,
    DEFAULT_OUTPUT_RESERVE_TOKENS, SessionAdmission,
};

use crate::errors::to_py;

/// Session admission over a fleet's instance slots (``smetric_core::session_admission``).
#[pyclass(frozen, module = "smetric._core", name = "SessionAdmission")]
pub(crate) struct PySessionAdmission {
    inner: Mutex<SessionAdmission>,
}

fn invalid(field: &'static str, reason: String) -> PyErr {
    to_py(&SmetricError::InvalidConfig { field, reason })
}

impl PySessionAdmission {
    fn lock(&self) -> std::sync::MutexGuard<'_, SessionAdmission> {
        // A panic cannot happen while the lock is held (the core's calls do not panic), so a
        // poisoned lock still holds a consistent table.
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[pymethods]
impl PySessionAdmission {
    /// A stage over ``instances`` slots whose KV caches hold ``capacity_tokens`` tokens each.
    ///
    /// Args:
    ///     instances: instance slots, ``0..instances``.
    ///     mode: ``"off"``, ``"pause"`` (hold at the policy's instance) or ``"smetric"`` (place
    ///         on another instance with room and the cheapest source, else hold).
    ///     capacity_tokens: KV capacity of one instance, tokens.
    ///     idle_window_s: a session idle this long is no longer resident.
    ///     output_reserve_tokens: tokens reserved for an in-flight request's output.
    ///     max_sessions_per_instance: most resident sessions tracked per instance.
    ///     max_hold_s: the longest a request is held before it is admitted at its policy's
    ///         instance anyway; ``None``: the mode's default (``"pause"`` holds until there is
    ///         room).
    ///
    /// Raises:
    ///     InvalidConfigError: an unknown mode, a non-finite or negative window, or a negative
    ///         or NaN maximum hold.
    #[new]
    #[pyo3(signature = (
        instances,
        *,
        mode,
        capacity_tokens,
        idle_window_s = DEFAULT_IDLE_WINDOW_S,
        output_reserve_tokens = DEFAULT_OUTPUT_RESERVE_TOKENS,
        max_sessions_per_instance = DEFAULT_MAX_SESSIONS_PER_INSTANCE,
        max_hold_s = None,
    ))]
    fn new(
        instances: u32,
        mode: &str,
        capacity_tokens: u64,
        idle_window_s: f64,
        output_reserve_tokens: u64,
        max_sessions_per_instance: usize,
        max_hold_s: Option<f64>,
    ) -> PyResult<Self> {
        let mode = AdmissionMode::parse(mode).ok_or_else(|| {
            invalid(
                "mode",
                format!("{mode:?} is not one of \"off\", \"pause\", \"smetric\""),
            )
        })?;
        if !(idle_window_s.is_finite() && idle_window_s >= 0.0) {
            return Err(invalid(
                "idle_window_s",
                format!("must be finite and >= 0, got {idle_window_s}"),
            ));
        }
        let max_hold_s = max_hold_s.unwrap_or(mode.default_max_hold_s());
        if max_hold_s.is_nan() || max_hold_s < 0.0 {
            return Err(invalid("max_hold_s", format!("must be >= 0, got {max_hold_s}")));
        }
        let config = AdmissionConfig {
            mode,
            capacity_tokens,
            idle_window_s,
            output_reserve_tokens,
            max_sessions_per_instance,
            max_hold_s,
        };
        Ok(Self {
            inner: Mutex::new(SessionAdmission::new(instances, config)),
        })
    }

    /// The mode's name.
    #[getter]
    fn mode(&self) -> &'static str {
        self.lock().mode().name()
    }

    /// Admits, places elsewhere or holds a request of ``session`` that the policy sent to slot
    /// ``chosen``.
    ///
    /// Args:
    ///     session: the session key; ``None`` is admitted untouched.
    ///     chosen: the policy's instance slot.
    ///     prompt_tokens: the request's prompt length.
    ///     now: time in seconds.
    ///     costs: per slot, the prefix's cost there in prefill-equivalent tokens (read only by
    ///         ``"smetric"`` when ``chosen`` has no room; ``None``: no other instance qualifies).
    ///     held_since: when this request was first held (``None`` on its first ask): once
    ///         ``held_since + max_hold_s <= now`` it is admitted at ``chosen``.
    ///
    /// Returns:
    ///     ``(verdict, instance, paused)``: ``verdict`` is ``"admit"``, ``"elsewhere"`` or
    ///     ``"hold"``; ``instance`` the slot to serve it on (``chosen`` when held); ``paused``
    ///     the idle sessions paused for it.
    #[pyo3(signature = (session, chosen, prompt_tokens, now, costs = None, held_since = None))]
    fn decide(
        &self,
        session: Option<u64>,
        chosen: u32,
        prompt_tokens: u64,
        now: f64,
        costs: Option<Vec<f64>>,
        held_since: Option<f64>,
    ) -> (&'static str, u32, u32) {
        let req = AdmitRequest {
            session,
            chosen,
            prompt_tokens,
            held_since,
        };
        match self.lock().decide(&req, now, || costs.unwrap_or_default()) {
            Admission::Admit { instance, paused } => ("admit", instance, paused),
            Admission::Elsewhere { instance, paused } => ("elsewhere", instance, paused),
            Admission::Hold => ("hold", chosen, 0),
        }
    }

    /// When a request first held at ``held_since`` is admitted anyway (``None``: holds are
    /// unbounded).
    fn release_at(&self, held_since: f64) -> Option<f64> {
        self.lock().release_at(held_since)
    }

    /// ``session``'s request on slot ``instance`` finished at ``now`` with ``context_tokens``
    /// (prompt + output): the session is idle there with that working set.
    fn on_finished(&self, session: u64, instance: u32, context_tokens: u64, now: f64) {
        self.lock().on_finished(session, instance, context_tokens, now);
    }

    /// Slot ``instance``'s working set at ``now``: its resident sessions' context tokens.
    fn working_set(&self, instance: u32, now: f64) -> u64 {
        self.lock().working_set(instance, now)
    }

    /// The decision counters: ``admitted`` (``released`` among them: admitted without room
    /// once their hold ran out), ``moved``, ``held``, ``paused``.
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.lock().counters();
        let d = PyDict::new(py);
        d.set_item("admitted", c.admitted)?;
        d.set_item("moved", c.moved)?;
        d.set_item("held", c.held)?;
        d.set_item("released", c.released)?;
        d.set_item("paused", c.paused)?;
        Ok(d)
    }
}
