"""Adapters between smetric's router and the systems around a vLLM fleet.

Each module wires one outside system to :class:`smetric.Router` and imports nothing of it at
``import smetric`` time: ``lmcache`` (the LMCache controller as the global KV$ tier's truth) and
``mooncake`` (a Mooncake store written by vLLM's Mooncake store connector, probed as the global
tier). One page per integration in ``docs/integrations/``, with the versions tested.
"""
