"""`strata info PATH`: architecture, tensor counts and bytes by quant type, template, checksum."""

from __future__ import annotations

import argparse

from strata.gguf import GGUFFile
from strata.gguf.names import Keys
from strata.models import registry
from strata.verify import expected_sha256, verify_file


def run_info(args: argparse.Namespace) -> int:
    g = GGUFFile(args.path)
    arch = g.architecture
    supported = arch in registry()
    n_params = sum(int(_numel(t.shape)) for t in g.tensors.values())
    print(f"file:          {g.path} ({g.file_size / 2**20:,.1f} MiB, GGUF v{g.version})")
    print(f"name:          {g.get('general.name', '?')}")
    print(f"architecture:  {arch}{'' if supported else '  (not supported by this Strata)'}")
    print(f"parameters:    {n_params / 1e6:,.1f} M")
    print(f"context:       {g.arch_get(Keys.CONTEXT_LENGTH, '?')}")
    for key in (Keys.BLOCK_COUNT, Keys.EMBEDDING_LENGTH, Keys.EXPERT_COUNT, Keys.EXPERT_USED_COUNT):
        v = g.arch_get(key)
        if v is not None:
            print(f"{key + ':':<15}{v}")
    toks = g.get("tokenizer.ggml.tokens")
    print(f"tokenizer:     {g.get('tokenizer.ggml.model', 'none')} / pre={g.get('tokenizer.ggml.pre', '-')}"
          f", {len(toks) if toks is not None else 0} tokens")
    print(f"chat template: {'yes' if g.get('tokenizer.chat_template') else 'no (per-architecture default)'}")
    print(f"tensors:       {len(g.tensors)}")
    for qname, (count, nbytes) in sorted(g.bytes_by_type().items(), key=lambda kv: -kv[1][1]):
        print(f"  {qname:<8} {count:5d} tensors {nbytes / 2**20:12,.1f} MiB")
    if args.verify is not None:
        expected = args.verify or expected_sha256(g.path)
        digest = verify_file(g, expected)
        print(f"sha256:        {digest} ({'verified' if expected else 'no reference digest to compare'})")
    return 0


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
