//! `Gateway`: the compiled data plane's door (`smetric_gateway`), started and stopped from
//! `smetric serve`. Conversion and error mapping only: a bad limit is `InvalidConfigError`, an
//! address that cannot be bound `OSError`, a thread or runtime that cannot start
//! `RuntimeError`. Starting and stopping release the GIL (`stop` waits for the drain).

use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::Duration;

use pyo3::exceptions::{PyOSError, PyRuntimeError};
use pyo3::prelude::*;
use smetric_gateway::{Gateway, GatewayConfig, GatewayError, Limits};

use crate::errors::python_error;

#[pyclass(frozen, module = "smetric._core", name = "Gateway")]
pub(crate) struct PyGateway {
    inner: Mutex<Option<Gateway>>,
    address: SocketAddr,
}

fn to_py_err(py: Python<'_>, err: &GatewayError) -> PyErr {
    match err {
        GatewayError::Config { field, reason } => python_error(py, "InvalidConfigError", &err.to_string(), |k| {
            k.set_item("field", field)?;
            k.set_item("reason", reason)
        }),
        GatewayError::Bind { .. } => PyOSError::new_err(err.to_string()),
        GatewayError::Start(_) | GatewayError::Exited => PyRuntimeError::new_err(err.to_string()),
    }
}

#[pymethods]
impl PyGateway {
    #[new]
    #[pyo3(signature = (
        host, port, control_plane_port, *, max_head_bytes, head_timeout_s, drain_timeout_s, max_connections, retry_after_s
    ))]
    #[allow(clippy::too_many_arguments)] // the constructor's keyword arguments, one per limit
    fn new(
        py: Python<'_>,
        host: &str,
        port: u16,
        control_plane_port: u16,
        max_head_bytes: usize,
        head_timeout_s: f64,
        drain_timeout_s: f64,
        max_connections: usize,
        retry_after_s: u64,
    ) -> PyResult<Self> {
        let ip: IpAddr = host.parse().map_err(|_| {
            python_error(
                py,
                "InvalidConfigError",
                &format!("invalid gateway setting host: not an IP address: {host}"),
                |k| {
                    k.set_item("field", "host")?;
                    k.set_item("reason", "not an IP address")
                },
            )
        })?;
        let seconds = |field: &'static str, value: f64| {
            Duration::try_from_secs_f64(value).map_err(|_| {
                let reason = format!("must be a non-negative number of seconds, got {value}");
                python_error(
                    py,
                    "InvalidConfigError",
                    &format!("invalid gateway setting {field}: {reason}"),
                    |k| {
                        k.set_item("field", field)?;
                        k.set_item("reason", &reason)
                    },
                )
            })
        };
        let config = GatewayConfig {
            listen: SocketAddr::new(ip, port),
            control_plane: SocketAddr::from(([127, 0, 0, 1], control_plane_port)),
            limits: Limits {
                max_head_bytes,
                head_timeout: seconds("head_timeout_s", head_timeout_s)?,
                drain_timeout: seconds("drain_timeout_s", drain_timeout_s)?,
                max_connections,
                retry_after_s,
            },
        };
        let gateway = py.detach(|| Gateway::start(config)).map_err(|e| to_py_err(py, &e))?;
        Ok(Self {
            address: gateway.address(),
            inner: Mutex::new(Some(gateway)),
        })
    }

    /// The port it listens on (the one the system chose for port 0).
    #[getter]
    fn port(&self) -> u16 {
        self.address.port()
    }

    /// What the door refused or cut so far: ``{kind: count}`` under the proxy's kind names.
    fn client_errors(&self) -> Vec<(&'static str, u64)> {
        self.inner.lock().map_or_else(
            |_| Vec::new(),
            |inner| inner.as_ref().map_or_else(Vec::new, Gateway::client_errors),
        )
    }

    /// Stops accepting, lets requests in flight finish (at most the drain time); idempotent.
    fn stop(&self, py: Python<'_>) {
        let gateway = self.inner.lock().map_or(None, |mut inner| inner.take());
        if let Some(mut gateway) = gateway {
            py.detach(move || gateway.stop());
        }
    }
}
