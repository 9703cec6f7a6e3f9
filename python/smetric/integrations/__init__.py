"""Adapters that put :class:`smetric.Router` inside other serving stacks.

Each module imports its framework lazily and, when the framework is missing, raises
:class:`smetric.errors.MissingExtraError` naming the extra that installs it:

* :mod:`smetric.integrations.ray_serve`: a Ray Serve ``RequestRouter`` (extra ``ray``).
* :mod:`smetric.integrations.production_stack`: a vLLM production-stack ``RoutingInterface``
  (production-stack's ``vllm_router``, installed from its repository; see
  ``docs/integrations/production-stack.md``).

What a request carries is read by :mod:`smetric.integrations._prompt`, shared by all of them.
"""
