"""``smetric serve``: the OpenAI-compatible proxy in front of a vLLM fleet.

* :mod:`smetric.serve.request`: a request body parsed for routing (Rust JSON parse, ids as a
  buffer), with OpenAI-style errors;
* :mod:`smetric.serve.tokens`: the token ids a request is routed on — the client's ids, a local
  ``tokenizer.json`` with the model's chat template, or an approximate byte-chunk hash
  (``docs/routing-tokens.md``).

Importing this package imports no optional dependency; the modules that need the ``serve`` extra
raise :class:`smetric.errors.MissingExtraError` when it is missing;
* :mod:`smetric.serve.config`, :mod:`smetric.serve.session`: settings and session hints;
* :mod:`smetric.serve.proxy`: the aiohttp data plane, failover, the lifecycle (``docs/serve.md``);
  :mod:`smetric.serve.disagg`: vLLM's disaggregated-prefill protocol;
  :mod:`smetric.serve.telemetry`: the proxy's Prometheus families.
"""
