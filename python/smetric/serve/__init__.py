"""``smetric serve``: the OpenAI-compatible proxy in front of a vLLM fleet (``docs/serve.md``).

Split along a request's path (``docs/architecture.md`` draws it; ``tests/test_architecture.py``
keeps the layering acyclic):

* :mod:`smetric.serve.proxy`: the app and its lifecycle — the routes table, the request's
  preparation, startup, drain (:func:`~smetric.serve.proxy.run`, :class:`~smetric.serve.proxy.ProxyServer`);
* :mod:`smetric.serve.apis`: one adapter per client API (body parsing, routing tokens, stream
  format and continuation, error shape): chat completions, completions;
* :mod:`smetric.serve.failover`: the attempt loop (retries, stream continuation);
* :mod:`smetric.serve.backends`: the deployment modes behind one interface — co-located and
  disaggregated prefill/decode (vLLM's PD protocol);
* :mod:`smetric.serve.relay`: the answer to the client, whole or streamed;
* :mod:`smetric.serve.fleet`: discovery, health, ejection, models, sizing, the feeds;
* :mod:`smetric.serve.upstream`, :mod:`smetric.serve.attempt`: the HTTP client to the engines,
  an attempt's once-only lifecycle;
* :mod:`smetric.serve.telemetry`, :mod:`smetric.serve.labels`: the proxy's Prometheus families,
  the decision labels derived from the core's reasons;
* below them: :mod:`smetric.serve.request` (a body parsed for routing, Rust JSON parse),
  :mod:`smetric.serve.tokens` (the routed token ids, ``docs/routing-tokens.md``),
  :mod:`smetric.serve.config`, :mod:`smetric.serve.session`, :mod:`smetric.serve.errors`.

Importing this package imports no optional dependency; the modules that need the ``serve`` extra
raise :class:`smetric.errors.MissingExtraError` (``chat_template``, ``piecewise``) or need
``aiohttp`` (the data plane) when it is missing.
"""
