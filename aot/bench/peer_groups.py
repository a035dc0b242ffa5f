"""The names ``aot bench --peers`` takes: every peer's, and the groups that stand for several.

Names only, with nothing to import: the command line's help is written from :data:`PEER_GROUPS` (``aot bench --help``),
and a peer is built by :mod:`aot.bench.peers`, :mod:`aot.bench.decoder_peers` or :mod:`aot.bench.cuda_peers`.
"""

from __future__ import annotations

from collections.abc import Iterable

ONNX_PEERS = ("ort_torchscript", "ort_torchscript_fused", "ort_dynamo", "ort_dynamo_fused", "hf_onnx")
INT8_PEERS = ("ort_quantize_dynamic", "torch_ao_dynamic")
ALL_PEERS = ONNX_PEERS + INT8_PEERS + ("torch_compile_freezing",)
DECODER_PEERS = ("eager_bf16", "ort_genai", "llama_cpp")  # a decoder build's only peers (aot.bench.decoder_peers)
CUDA_PEERS = ("eager_float16", "eager_float32", "graph_module_uncaptured", "torch_compile", "torch_compile_cuda_graphs")
BUILD_PEERS = ("graph_module_uncaptured",)  # CUDA peers loaded from the build directory, not made from the eager model
# The decoder peers that convert the recipe's pretrained checkpoint, and what each makes of it: a recipe built from
# model.config has no checkpoint to convert.
CHECKPOINT_PEERS = {"ort_genai": "builds its model", "llama_cpp": "writes its GGUF file"}

# The names ``--peers`` takes besides the peers' own; a decoder build's peers are its own, and so are a CUDA build's.
PEER_GROUPS = {"": (), "onnx": ONNX_PEERS, "int8": INT8_PEERS, "all": ALL_PEERS, "decoder": DECODER_PEERS, "cuda": CUDA_PEERS}
KNOWN_PEERS = ALL_PEERS + DECODER_PEERS + CUDA_PEERS

# What each group is, for the help; its members are read from PEER_GROUPS.
GROUP_ABOUT = {
    "onnx": "other exporters' ONNX models in ONNX Runtime",
    "int8": "dynamic int8 quantisation",
    "all": "an encoder's CPU peers",
    "decoder": "a decoder build's",
    "cuda": "a CUDA build's",
}


def peer_items(text: str) -> tuple[str, ...]:
    """The peers and groups ``--peers text`` names (a comma list), in order, once each; ValueError for an unknown name."""
    items = tuple(dict.fromkeys(item.strip() for item in text.split(",") if item.strip()))
    unknown = [name for name in expand_peers(items, check=False) if name not in KNOWN_PEERS]
    if unknown:
        groups = ", ".join(group for group in PEER_GROUPS if group)
        raise ValueError(f"unknown peer(s) {', '.join(unknown)}; known: {', '.join(KNOWN_PEERS)} (groups: {groups})")
    return items


def peer_names(text: str) -> tuple[str, ...]:
    """The peers ``--peers text`` names, in order, once each: a comma list of peers and groups of :data:`PEER_GROUPS`."""
    return tuple(expand_peers(peer_items(text)))


def expand_peers(items: Iterable[str], check: bool = True) -> dict[str, str | None]:
    """Each peer ``items`` name, in order, with the group that named it, or None where it was named itself (a peer named
    both ways counts as named itself: the user asked for it by name)."""
    named: dict[str, str | None] = {}
    for item in items:
        group = item if item in PEER_GROUPS else None
        for peer in PEER_GROUPS.get(item, (item,)):
            if check and peer not in KNOWN_PEERS:
                raise ValueError(f"unknown peer {peer} (known: {', '.join(KNOWN_PEERS)})")
            if peer not in named or group is None:
                named[peer] = group
    return named


def without_checkpoint(peer: str) -> str:
    """Why ``peer`` (one of :data:`CHECKPOINT_PEERS`) cannot run for a recipe without ``model.pretrained``."""
    return f"{peer} {CHECKPOINT_PEERS[peer]} from the recipe's model.pretrained checkpoint, which this recipe has not"


def peers_help() -> str:
    """``--peers``' help: every group, what it is, and its members, as :data:`PEER_GROUPS` has them."""
    described = []
    for group, members in PEER_GROUPS.items():
        if not group:
            continue
        inner = [other for other, theirs in PEER_GROUPS.items() if theirs and other != group and set(theirs) < set(members)]
        rest = [peer for peer in members if not any(peer in PEER_GROUPS[other] for other in inner)]
        listed = ([f"the {' and '.join(inner)} groups"] if inner else []) + rest
        described.append(f"'{group}' ({GROUP_ABOUT[group]}, {len(members)}: {', '.join(listed)})")
    return ("Also time other tools' runners of the same model, each in its own process: a comma list of peers' names and "
            "groups: " + "; ".join(described) + ".")
