"""``smetric serve``: the OpenAI-compatible proxy in front of a vLLM fleet.

* :mod:`smetric.serve.request`: a request body parsed for routing (Rust JSON parse, ids as a
  buffer), with OpenAI-style errors;
* :mod:`smetric.serve.tokens`: the token ids a request is routed on — the client's ids, a local
  ``tokenizer.json`` with the model's chat template, or an approximate byte-chunk hash
  (``docs/routing-tokens.md``).

Importing this package imports no optional dependency; the modules that need the ``serve`` extra
raise :class:`smetric.errors.MissingExtraError` when it is missing.
"""
