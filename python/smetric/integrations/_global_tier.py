"""Records an outside store's answer for one prompt into the router's global tier, just before routing it.

The global KV$ tier (LMCache, a Mooncake store) is asked about a prompt at route time and answers
"the first ``hit_tokens`` tokens are stored"; :func:`record_prefix` turns that into the router's own
block chain: ``hashes = router.hash_tokens(tokens)``, the first ``hit_tokens // block_size`` blocks are
stored in the global tier and the rest of *this prompt's* chain is removed from it.

Invariant: after the call, the router's global tier agrees with the store on every block of this
prompt's chain (as of the store's answer), so the decision that follows credits exactly the prefix the
store holds. Blocks of other prompts are untouched; they are corrected when a prompt that contains them
is looked up (or age out of the tier's LRU, ``RouterConfig.global_capacity_blocks``).

Complexity: one hash of the prompt (O(n) in Rust), one store and one remove call of O(n / block_size)
blocks under the router's index lock. The route that follows hashes the prompt again: from a token
buffer that is cheaper than passing the hash list back (32K tokens: ``route(array)`` 12 µs,
``route(hashes=list)`` 39 µs; docs/integrations/lmcache.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from smetric import Router

if TYPE_CHECKING:
    from smetric._core import _Tokens  # a list of ints or a token buffer (numpy int32/uint32/int64 array)


def record_prefix(router: Router, tokens: _Tokens, hit_tokens: int, *, namespace: str | None = None) -> None:
    """Makes the router's global tier hold exactly the first ``hit_tokens`` tokens of ``tokens``' chain.

    Args:
        router: the router whose global tier is fed.
        tokens: the prompt's token ids.
        hit_tokens: how many leading tokens the store holds (clipped to ``len(tokens)``).
        namespace: the namespace the prompt is routed under (LoRA name, cache salt).
    """
    hashes = router.hash_tokens(tokens, namespace)
    held = min(max(hit_tokens, 0), len(tokens)) // router.block_size
    if held:
        router.store_blocks(None, hashes[:held], tier="global")
    if held < len(hashes):
        router.remove_blocks(None, hashes[held:], tier="global")
