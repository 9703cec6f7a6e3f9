#!/usr/bin/env python3
"""Generate golden vLLM block-hash vectors with the real vLLM 0.33.0.

Writes ``tests/data/vllm/golden_hashes.json``, which smetric's Rust and Python tests check without vLLM.

The parent process builds a deterministic list of cases and runs one worker process per
``PYTHONHASHSEED`` value inside the vLLM venv (the seed only takes effect at interpreter start, and the
xxhash algorithms need it for a reproducible ``NONE_HASH``). Each worker calls vLLM's own functions:

* ``request`` cases: ``vllm.v1.request.Request`` with ``block_hasher=get_request_block_hasher(...)``, so
  vLLM itself builds the extra keys (LoRA, cache salt, multimodal items) and chains the blocks;
* ``block`` cases: ``hash_block_tokens(hash_fn, parent, tokens, extra_keys)`` with explicit tagged keys;
* event ints: ``maybe_convert_block_hash`` (vLLM's default ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``).

Usage (see README.md): ``python3.11 scripts/vllm_golden/generate.py --venv /tmp/vllm-venv``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "tests" / "data" / "vllm" / "golden_hashes.json"

# (PYTHONHASHSEED or None for unset, algorithms run under it). xxhash needs an explicit seed.
SEED_GROUPS: tuple[tuple[str | None, tuple[str, ...]], ...] = (
    (None, ("sha256", "sha256_cbor")),
    ("0", ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")),
    ("4294967295", ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")),
)

# Token ids where pickle switches int opcodes (BININT1/2, BININT, LONG1) and CBOR head sizes.
BOUNDARY_TOKENS = (0, 1, 23, 24, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1)

LORA = {"name": "sql-adapter", "path": "/adapters/sql-lora"}
DIGEST_LEN = {"sha256": 32, "sha256_cbor": 32, "xxhash": 16, "xxhash_cbor": 16}


def _cases_for(algo: str, seed: str | None) -> list[dict[str, Any]]:
    """The case suite for one algorithm and seed; deterministic for a given (algo, seed)."""
    rng = random.Random(f"smetric-golden/{algo}/{seed}")
    cases: list[dict[str, Any]] = []
    prefix = f"{algo}/{'default' if seed is None else 'seed' + seed}"

    def toks(n: int, lo: int = 0, hi: int = 151_936) -> list[int]:
        return [rng.randrange(lo, hi) for _ in range(n)]

    def request(name: str, tokens: list[int] | None = None, block_size: int = 16, **extra: Any) -> None:
        case: dict[str, Any] = {"id": f"{prefix}/{name}", "kind": "request", "algo": algo, "seed": seed}
        case["block_size"] = block_size
        if tokens is not None:
            case["tokens"] = tokens
        case.update({"lora": None, "cache_salt": None, "mm": []})
        case.update(extra)
        cases.append(case)

    def block(name: str, tokens: list[int], parent: bytes | None, extra_keys: list[list[Any]] | None) -> None:
        cases.append(
            {
                "id": f"{prefix}/{name}",
                "kind": "block",
                "algo": algo,
                "seed": seed,
                "parent": None if parent is None else parent.hex(),
                "tokens": tokens,
                "extra_keys": extra_keys,
            }
        )

    for t in BOUNDARY_TOKENS:
        request(f"boundary-{t}-bs1", [t], 1)
    request("boundary-chain-bs1", list(BOUNDARY_TOKENS), 1)
    request("boundary-pairs-bs2", [255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 0], 2)
    request("boundary-triples-bs3", [2**32 - 1, 0, 1, 65536, 65535, 256, 255, 2**31, 2**31 - 1, 7], 3)
    request("no-full-block-bs4", [1, 2, 3], 4)
    request("random-bs3", toks(8, 0, 2**17), 3)
    request("bs16-3-blocks-plus-tail", toks(53))
    request("bs16-exact-2-blocks", toks(32))
    request("bs16-ids-below-256", toks(32, 0, 256))
    request("bs16-4-byte-ids", toks(32, 2**16, 2**31))
    request("bs16-5-byte-ids", toks(32, 2**31, 2**32))
    request("bs16-mixed-boundaries", [rng.choice(BOUNDARY_TOKENS) for _ in range(48)])
    request("bs32-2-blocks", toks(70), 32)
    # One 100 KB pickle: frames split at 64 KiB.
    request("bs20000-frame-split", None, 20_000, tokens_range={"start": 70_000, "step": 1, "count": 20_000})
    # Exactly 3-byte ints: 21846 * 3 bytes crosses 64 KiB inside the token tuple.
    request("bs21846-3-byte-ids", None, 21_846, tokens_range={"start": 256, "step": 2, "count": 21_846})
    request("lora", toks(40), lora=dict(LORA))
    request("lora-bs1", [5, 6], 1, lora=dict(LORA))
    request("lora-name-equals-path", toks(32), lora={"name": "adapter", "path": "adapter"})
    request("lora-names-equal-tags", toks(16), lora={"name": "lora", "path": "mm"})
    request("lora-unicode", toks(16), lora={"name": "adaptér-ü", "path": "/lora/ключ"})
    request("cache-salt", toks(40), cache_salt="tenant-42")
    request("cache-salt-bs2", [1, 2, 3, 4, 5], 2, cache_salt="s")
    request("cache-salt-unicode", toks(20), cache_salt="sälz-🔑-ключ")
    request("cache-salt-300-bytes", toks(17), cache_salt="x" * 300)
    request("empty-cache-salt", toks(16), cache_salt="")
    request("lora-and-salt", toks(48), lora=dict(LORA), cache_salt="tenant-7")
    image = {"identifier": "img-9f2c41", "offset": 5, "length": 20}
    request("mm-one-image", toks(48), mm=[image])
    two = [{"identifier": "a1", "offset": 2, "length": 3}, {"identifier": "b2", "offset": 8, "length": 4}]
    request("mm-two-items-one-block", toks(32), mm=two)
    request("mm-lora-salt", toks(48), mm=[image], lora=dict(LORA), cache_salt="tenant-7")

    digest_len = DIGEST_LEN[algo]
    block("explicit-parent", toks(16), rng.randbytes(digest_len), None)
    block("one-byte-parent", toks(2), b"\xab", None)
    embeds = hashlib.sha256(rng.randbytes(64)).hexdigest()
    block("prompt-embeds", toks(4), None, [["prompt_embeds", {"hex": embeds}]])
    block("mm-negative-offset", toks(16), rng.randbytes(digest_len), [["mm", "img-x", -7]])
    block(
        "all-key-kinds",
        toks(16),
        None,
        [
            ["lora", "n", "/p"],
            ["mm", "img-a", 0],
            ["mm", "img-b", 3],
            ["cache_salt", "salt"],
            ["prompt_embeds", {"hex": embeds}],
        ],
    )
    return cases


def build_cases() -> list[dict[str, Any]]:
    """Every case, grouped by seed in SEED_GROUPS order."""
    return [case for seed, algos in SEED_GROUPS for algo in algos for case in _cases_for(algo, seed)]


def _tokens(case: dict[str, Any]) -> list[int]:
    if "tokens" in case:
        tokens: list[int] = case["tokens"]
        return tokens
    r = case["tokens_range"]
    return [r["start"] + i * r["step"] for i in range(r["count"])]


def _worker(cases_path: Path, out_path: Path) -> None:
    """Runs inside the vLLM venv: hash every case with vLLM's own code."""
    import vllm
    from vllm.lora.request import LoRARequest
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils as kcu
    from vllm.v1.request import Request

    cases: list[dict[str, Any]] = json.loads(cases_path.read_text())
    env_seed = os.environ.get("PYTHONHASHSEED")
    none_hashes: dict[str, str] = {}
    out: list[dict[str, Any]] = []
    for case in cases:
        assert case["seed"] == env_seed, (case["id"], env_seed)
        fn = get_hash_fn_by_name(case["algo"])
        kcu.init_none_hash(fn)
        none_hashes[case["algo"]] = kcu.NONE_HASH.hex()
        tokens = _tokens(case)
        if case["kind"] == "request":
            lora = case["lora"]
            mm = [
                MultiModalFeatureSpec(
                    data=None,
                    modality="image",
                    identifier=item["identifier"],
                    mm_position=PlaceholderRange(offset=item["offset"], length=item["length"]),
                )
                for item in case["mm"]
            ]
            request = Request(
                request_id=case["id"],
                prompt_token_ids=tokens,
                sampling_params=SamplingParams(max_tokens=1),
                pooling_params=None,
                lora_request=None if lora is None else LoRARequest(lora["name"], 1, lora["path"]),
                cache_salt=case["cache_salt"],
                mm_features=mm or None,
                block_hasher=kcu.get_request_block_hasher(case["block_size"], fn),
            )
            hashes = list(request.block_hashes)
            assert len(hashes) == len(tokens) // case["block_size"], case["id"]
            case = dict(case, hashes=[h.hex() for h in hashes])
            case["event_hashes"] = [kcu.maybe_convert_block_hash(h) for h in hashes]
        else:
            keys = case["extra_keys"]
            extra = None if keys is None else tuple(_extra_key(k) for k in keys)
            parent = None if case["parent"] is None else bytes.fromhex(case["parent"])
            digest = kcu.hash_block_tokens(fn, parent, tokens, extra)
            case = dict(case, digest=digest.hex(), event_hash=kcu.maybe_convert_block_hash(digest))
        out.append(case)
    result = {
        "vllm_version": vllm.__version__,
        "pythonhashseed": env_seed,
        "none_hashes": none_hashes,
        "vectors": out,
    }
    out_path.write_text(json.dumps(result))


def _extra_key(key: list[Any]) -> tuple[Any, ...]:
    # vLLM's tags are code constants, hence one (interned) object each; sys.intern returns that
    # object, so pickle's memo sees repeated tags exactly as in vLLM. Values stay fresh objects.
    tag, *values = key
    return (sys.intern(tag), *(bytes.fromhex(v["hex"]) if isinstance(v, dict) else v for v in values))


def _run_workers(python: Path, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed, _ in SEED_GROUPS:
            group = [c for c in cases if c["seed"] == seed]
            cases_path = Path(tmp) / "cases.json"
            out_path = Path(tmp) / "out.json"
            cases_path.write_text(json.dumps(group))
            env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
            if seed is not None:
                env["PYTHONHASHSEED"] = seed
            cmd = [str(python), str(Path(__file__).resolve()), "--worker", str(cases_path), str(out_path)]
            print(f"worker PYTHONHASHSEED={seed}: {len(group)} cases", file=sys.stderr)
            subprocess.run(cmd, check=True, env=env)
            results.append(json.loads(out_path.read_text()))
    return results


def dump_json(doc: dict[str, Any]) -> str:
    """JSON with one line per top-level key and per element of top-level lists (diff-friendly)."""
    parts = []
    for key, value in doc.items():
        if isinstance(value, list):
            items = ",\n  ".join(json.dumps(v, ensure_ascii=False) for v in value)
            parts.append(f"{json.dumps(key)}: [\n  {items}\n ]")
        else:
            parts.append(f"{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}")
    return "{\n " + ",\n ".join(parts) + "\n}\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--venv", type=Path, help="vLLM venv to create or reuse (e.g. /tmp/vllm-venv)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--worker", nargs=2, type=Path, metavar=("CASES", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(*args.worker)
        return
    if args.venv is None:
        parser.error("--venv is required")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _venv import ensure_venv, package_versions

    python = ensure_venv(args.venv)
    results = _run_workers(python, build_cases())
    versions = {r["vllm_version"] for r in results}
    assert versions == {"0.33.0"}, versions
    vectors = [v for r in results for v in r["vectors"]]
    doc = {
        "description": (
            "vLLM prefix-cache block hashes computed by the real vLLM; 'request' vectors come from "
            "vllm.v1.request.Request with get_request_block_hasher, 'block' vectors from hash_block_tokens "
            "with explicit tagged extra keys; event_hashes from maybe_convert_block_hash. "
            "seed is PYTHONHASHSEED (null = unset)."
        ),
        "generator": "scripts/vllm_golden/generate.py",
        "vllm_version": versions.pop(),
        "packages": package_versions(python, ("vllm", "torch", "cbor2", "xxhash", "msgspec")),
        "python_version": subprocess.run(
            [str(python), "-c", "import platform; print(platform.python_version())"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip(),
        "none_hashes": [
            {"algo": algo, "seed": r["pythonhashseed"], "digest": digest}
            for r in results
            for algo, digest in r["none_hashes"].items()
        ],
        "vectors": vectors,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(dump_json(doc))
    counts: dict[str, int] = {}
    for v in vectors:
        counts[v["algo"]] = counts.get(v["algo"], 0) + 1
    print(f"wrote {len(vectors)} vectors to {args.out}: {counts}", file=sys.stderr)


if __name__ == "__main__":
    main()
