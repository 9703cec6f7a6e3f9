"""Records an outside store's answer for one prompt into the router's global tier, just before routing it.

The global KV$ tier (LMCache, a Mooncake store) is asked about a prompt at route time and answers
"the first ``hit_tokens`` tokens are stored"; :func:`record_prefix` turns that into the router's own
block chain: ``hashes = router.hash_tokens(tokens)``, the first ``hit_tokens // block_size`` blocks are
stored in the global tier and the rest of *this prompt's* chain is removed from it.

Invariant: after the call, the router's global tier agrees with the store on every block of this
prompt's chain (as of the store's answer), so the decision that follows credits exactly the prefix the
store holds. Blocks of other prompts are untouched; they are corrected when a prompt that contains them
is looked up (or age out of the tier's LRU, ``RouterConfig.global_capacity_blocks``).

Complexity: one hash of the prompt (O(n) in Rust, reused for the route), one store and one remove call
of O(n / block_size) blocks under the router's index lock.
"""

from __future__ import annotations

from collections.abc import Sequence

from smetric import Router


def record_prefix(router: Router, tokens: Sequence[int], hit_tokens: int, *, namespace: str | None = None) -> list[int]:
    """Makes the router's global tier hold exactly the first ``hit_tokens`` tokens of ``tokens``' chain.

    Args:
        router: the router whose global tier is fed.
        tokens: the prompt's token ids.
        hit_tokens: how many leading tokens the store holds (clipped to ``len(tokens)``).
        namespace: the namespace the prompt is routed under (LoRA name, cache salt).

    Returns:
        The prompt's chained block hashes, to pass to ``router.route(hashes=..., num_tokens=len(tokens))``
        so the prompt is not hashed twice.
    """
    hashes = router.hash_tokens(tokens, namespace)
    held = min(max(hit_tokens, 0), len(tokens)) // router.block_size
    if held:
        router.store_blocks(None, hashes[:held], tier="global")
    if held < len(hashes):
        router.remove_blocks(None, hashes[held:], tier="global")
    return hashes
