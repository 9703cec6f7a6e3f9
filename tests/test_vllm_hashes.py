"""smetric.vllm against golden block hashes generated with the real vLLM 0.33.0.

The vectors live in tests/data/vllm/golden_hashes.json (scripts/vllm_golden/generate.py); vLLM itself
is not needed here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

_core = pytest.importorskip("smetric._core")
if not hasattr(_core, "vllm_block_hashes"):
    pytest.skip("smetric._core was built without the vLLM hashing functions", allow_module_level=True)

from smetric import vllm  # noqa: E402 - after the skip checks above
from smetric.errors import InvalidArgumentError, InvalidBlockSizeError, InvalidTokenError  # noqa: E402

GOLDEN = json.loads((Path(__file__).parent / "data" / "vllm" / "golden_hashes.json").read_text())
VECTORS: list[dict[str, Any]] = GOLDEN["vectors"]
# Multimodal keys and explicit per-block keys are beyond the block_hashes() contract; the Rust
# tests cover them, and test_event_hash_of_every_digest still checks their digests here.
REQUEST_VECTORS = [v for v in VECTORS if v["kind"] == "request" and not v["mm"]]


def _tokens(vector: dict[str, Any]) -> list[int]:
    if "tokens" in vector:
        tokens: list[int] = vector["tokens"]
        return tokens
    r = vector["tokens_range"]
    return [r["start"] + i * r["step"] for i in range(r["count"])]


def test_golden_file_is_from_vllm_0_33() -> None:
    assert GOLDEN["vllm_version"] == "0.33.0"
    assert len(VECTORS) >= 200
    assert {v["algo"] for v in REQUEST_VECTORS} == set(vllm.HASH_ALGOS)


@pytest.mark.parametrize("vector", REQUEST_VECTORS, ids=[v["id"] for v in REQUEST_VECTORS])
def test_request_vector(vector: dict[str, Any]) -> None:
    lora = vector["lora"]
    digests = vllm.block_hashes(
        _tokens(vector),
        block_size=vector["block_size"],
        algo=vector["algo"],
        seed=vector["seed"],
        lora=None if lora is None else (lora["name"], lora["path"]),
        cache_salt=vector["cache_salt"],
    )
    assert [d.hex() for d in digests] == vector["hashes"]
    assert [vllm.event_hash(d) for d in digests] == vector["event_hashes"]


def test_event_hash_of_every_digest() -> None:
    for vector in VECTORS:
        digests = vector["hashes"] if vector["kind"] == "request" else [vector["digest"]]
        expected_ints = vector["event_hashes"] if vector["kind"] == "request" else [vector["event_hash"]]
        for digest, expected in zip(digests, expected_ints, strict=True):
            assert vllm.event_hash(bytes.fromhex(digest)) == expected, vector["id"]


def test_integer_seed_is_its_decimal_string() -> None:
    tokens = list(range(32))
    assert vllm.block_hashes(tokens, algo="xxhash", seed=0) == vllm.block_hashes(tokens, algo="xxhash", seed="0")


def test_accepts_any_iterable_of_ints() -> None:
    tokens = list(range(40))
    assert vllm.block_hashes(tuple(tokens)) == vllm.block_hashes(iter(tokens)) == vllm.block_hashes(tokens)
    assert len(vllm.block_hashes(tokens)) == 2


def test_errors_are_value_errors_with_attributes() -> None:
    with pytest.raises(InvalidBlockSizeError) as block_size:
        vllm.block_hashes([1, 2], block_size=0)
    assert block_size.value.block_size == 0
    with pytest.raises(InvalidTokenError) as token:
        vllm.block_hashes([1, -5, 3])
    assert (token.value.position, token.value.value) == (1, -5)
    with pytest.raises(InvalidTokenError):
        vllm.block_hashes([2**32])
    with pytest.raises(InvalidArgumentError) as algo:
        vllm.block_hashes([1], algo="builtin")  # type: ignore[arg-type]
    assert algo.value.argument == "algo"
    with pytest.raises(InvalidArgumentError) as seed:
        vllm.block_hashes([1], algo="xxhash_cbor")
    assert seed.value.argument == "seed"
    for err in (block_size, token, algo, seed):
        assert isinstance(err.value, ValueError)
    with pytest.raises(TypeError):
        vllm.block_hashes(["a"])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        vllm.event_hash("00")  # type: ignore[arg-type]
