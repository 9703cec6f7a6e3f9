"""``smetric serve``: the OpenAI-compatible routing proxy (``docs/serve.md``).

The modules import aiohttp (the ``serve`` extra) only where they serve HTTP:
:mod:`smetric.serve.proxy`. ``config``, ``session``, ``request``, ``tokens`` and ``telemetry``
are usable without it (e.g. to route inside another server).
"""
