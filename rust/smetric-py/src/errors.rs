//! Maps the core's `SmetricError` to the exception classes of `smetric/errors.py`.
//!
//! The classes are defined in Python (so they carry typed attributes and subclass both
//! `SmetricError` and `ValueError`); this module imports them once and instantiates the
//! right one with the variant's fields as keyword arguments. [`python_error`] is the one
//! loader: the simulator's and the vLLM hashing bindings build their exceptions with it too.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyModule};
use smetric_core::SmetricError;

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

fn errors_module(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    ERRORS
        .get_or_try_init(py, || py.import("smetric.errors").map(Bound::unbind))
        .map(|m| m.bind(py))
}

/// `smetric.errors.<class>(message, **kwargs)` with the keyword arguments `fill` sets; a plain
/// `ValueError(message)` if that module or class is unusable.
pub(crate) fn python_error(
    py: Python<'_>,
    class: &str,
    message: &str,
    fill: impl FnOnce(&Bound<'_, PyDict>) -> PyResult<()>,
) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let kwargs = PyDict::new(py);
        fill(&kwargs)?;
        let instance = errors_module(py)?.getattr(class)?.call((message,), Some(&kwargs))?;
        Ok(PyErr::from_value(instance))
    };
    build().unwrap_or_else(|_| PyValueError::new_err(message.to_owned()))
}

/// The class name and keyword arguments of a core error.
fn class_and_kwargs(err: &SmetricError, kwargs: &Bound<'_, PyDict>) -> PyResult<&'static str> {
    let class = match err {
        SmetricError::InvalidBlockSize { block_size } => {
            kwargs.set_item("block_size", block_size)?;
            "InvalidBlockSizeError"
        }
        SmetricError::InvalidToken { position, value } => {
            kwargs.set_item("position", position)?;
            kwargs.set_item("value", value)?;
            "InvalidTokenError"
        }
        SmetricError::UnsupportedDtype { dtype } => {
            kwargs.set_item("dtype", dtype)?;
            "UnsupportedDtypeError"
        }
        SmetricError::NoInstances => "NoInstancesError",
        SmetricError::UnknownInstance { name } => {
            kwargs.set_item("name", name)?;
            "UnknownInstanceError"
        }
        SmetricError::DuplicateInstance { name } => {
            kwargs.set_item("name", name)?;
            "DuplicateInstanceError"
        }
        SmetricError::UnknownPolicy { name, known } => {
            kwargs.set_item("name", name)?;
            kwargs.set_item("known", known.split(", ").collect::<Vec<_>>())?;
            "UnknownPolicyError"
        }
        SmetricError::InvalidConfig { field, reason } => {
            kwargs.set_item("field", field)?;
            kwargs.set_item("reason", reason)?;
            "InvalidConfigError"
        }
        SmetricError::InvalidArgument { argument, reason } => {
            kwargs.set_item("argument", argument)?;
            kwargs.set_item("reason", reason)?;
            "InvalidArgumentError"
        }
        SmetricError::MissingPrompt => "MissingPromptError",
    };
    Ok(class)
}

/// The Python exception for a core error (a plain `ValueError` if the errors module is broken).
pub(crate) fn to_py(err: &SmetricError) -> PyErr {
    Python::attach(|py| {
        let kwargs = PyDict::new(py);
        match class_and_kwargs(err, &kwargs) {
            Ok(class) => python_error(py, class, &err.to_string(), |k| k.update(kwargs.as_mapping())),
            Err(_) => PyValueError::new_err(err.to_string()),
        }
    })
}

/// `Result` conversion used by every binding.
pub(crate) trait IntoPyResult<T> {
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for Result<T, SmetricError> {
    fn py(self) -> PyResult<T> {
        self.map_err(|e| to_py(&e))
    }
}
