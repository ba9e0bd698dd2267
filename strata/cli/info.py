"""`strata info PATH`: architecture, tensor counts and bytes by quant type, template, checksum."""

from __future__ import annotations

import argparse

from strata.conf.engine import add_override_flag, parse_overrides
from strata.gguf import GGUFFile
from strata.gguf.names import Keys, T, tensor
from strata.hub.verify import expected_sha256, verify_file
from strata.models import registry


def add_info_flags(i: argparse.ArgumentParser) -> None:
    i.add_argument("path")
    i.add_argument(
        "--verify",
        nargs="?",
        const="",
        default=None,
        metavar="SHA256",
        help="hash the file; compare to SHA256, a .sha256 sidecar, or the known digest",
    )
    add_override_flag(i)


def run_info(args: argparse.Namespace) -> int:
    g = GGUFFile(args.path, parse_overrides(args.override_kv))
    arch = g.architecture
    supported = arch in registry()
    n_params = sum(int(_numel(t.shape)) for t in g.tensors.values())
    rows = [
        ("file", f"{g.path} ({g.file_size / 2**20:,.1f} MiB, GGUF v{g.version})"),
        ("name", g.get("general.name", "?")),
        ("architecture", f"{arch}{'' if supported else '  (not supported by this Strata)'}"),
        ("parameters", f"{n_params / 1e6:,.1f} M"),
        ("context", g.arch_get(Keys.CONTEXT_LENGTH, "?")),
    ]
    for key in (Keys.BLOCK_COUNT, Keys.EMBEDDING_LENGTH, Keys.EXPERT_COUNT, Keys.EXPERT_USED_COUNT):
        if (v := g.arch_get(key)) is not None:
            rows.append((key, v))
    toks = g.get("tokenizer.ggml.tokens")
    rows += [
        (
            "tokenizer",
            f"{g.get('tokenizer.ggml.model', 'none')} / pre={g.get('tokenizer.ggml.pre', '-')}, "
            f"{len(toks) if toks is not None else 0} tokens",
        ),
        ("chat template", "yes" if g.get("tokenizer.chat_template") else "no (per-architecture default)"),
        ("tensors", len(g.tensors)),
    ]
    for label, value in rows:
        print(_row(label, value))
    for qname, (count, nbytes) in sorted(g.bytes_by_type().items(), key=lambda kv: -kv[1][1]):
        print(f"  {qname:<8} {count:5d} tensors {nbytes / 2**20:12,.1f} MiB")
    for line in _ple_lines(g):
        print(line)
    if args.verify is not None:
        expected = args.verify or expected_sha256(g.path)
        digest = verify_file(g, expected)
        print(_row("sha256", f"{digest} ({'verified' if expected else 'no reference digest to compare'})"))
    return 0


LABEL = 26  # the longest label (expert_feed_forward_length:) and a space


def _row(label: str, value: object) -> str:
    return f"{label + ':':<{LABEL}}{value}"


def _ple_lines(g: GGUFFile) -> list[str]:
    """qwen4exp's PLE n-gram table: its size, where it lives, and what one token reads from it."""
    layers = g.arch_get(Keys.PLE_LAYERS)
    name = tensor(T.PER_LAYER_TOKEN_EMBD)
    if layers is None or name not in g.tensors:
        return []
    t = g.tensors[name]
    heads = int(g.arch_get(Keys.PLE_HEADS_PER_NGRAM, 0)) * (int(g.arch_get(Keys.PLE_NGRAM_SIZE, 1)) - 1)
    per_token = heads * len(layers)
    size = f"{t.shape[0]:,} rows x {t.shape[-1]} {t.qtype.name} = {t.nbytes / 2**20:,.1f} MiB"
    where = f"{g.path} at byte offset {t.offset:,}; memory-mapped, never loaded whole"
    return [
        _row("PLE table", f"{name} {size} ({t.nbytes / g.file_size:.1%} of the file)"),
        _row("  lives in", f"{where}: rows are read on demand through the OS page cache"),
        _row(
            "  per token",
            f"{per_token} rows = {per_token * t.row_bytes:,} bytes gathered "
            f"(layers {[int(i) for i in layers]}, {heads} hashed n-gram heads)",
        ),
    ]


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
