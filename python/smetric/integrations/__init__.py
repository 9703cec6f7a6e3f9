"""Adapters between smetric's router and the systems around a vLLM fleet.

Each module wires one outside system to :class:`smetric.Router`, imports it lazily and, when it
is missing, raises :class:`smetric.errors.MissingExtraError` naming the extra that installs it:

* :mod:`smetric.integrations.lmcache`: the LMCache controller as the global KV$ tier's truth;
* :mod:`smetric.integrations.mooncake`: a Mooncake store written by vLLM's Mooncake store
  connector, probed as the global tier;
* :mod:`smetric.integrations.ray_serve`: a Ray Serve ``RequestRouter`` (extra ``ray``);
* :mod:`smetric.integrations.production_stack`: a vLLM production-stack ``RoutingInterface``
  (production-stack's ``vllm_router``, installed from its repository; see
  ``docs/integrations/production-stack.md``).

What a request carries is read by :mod:`smetric.integrations._prompt`. One page per integration
in ``docs/integrations/``, with the versions tested.
"""
