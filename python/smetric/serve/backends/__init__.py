"""The deployment modes behind one interface (:mod:`.base`): :mod:`.colocated` (instances that
prefill and decode their own requests) and :mod:`.pd` (disaggregated prefill and decode, vLLM's
protocol). The app picks one at startup (:func:`smetric.serve.proxy.build`); nothing downstream
asks which. May import: the backend modules of this package.
"""

from __future__ import annotations

from smetric.serve.backends.base import NO_INSTANCE, Answered, Backend, NoInstance, OpenOutcome, Unsupported
from smetric.serve.backends.colocated import ColocatedBackend
from smetric.serve.backends.pd import PdBackend

__all__ = [
    "NO_INSTANCE",
    "Answered",
    "Backend",
    "ColocatedBackend",
    "NoInstance",
    "OpenOutcome",
    "PdBackend",
    "Unsupported",
]
