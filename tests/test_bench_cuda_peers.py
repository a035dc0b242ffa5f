"""aot bench's CUDA peers: which builds take them, what each runs, and (where CUDA is) that each times."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from aot.bench.cuda_peers import build_cuda_peer
from aot.bench.peer_groups import BUILD_PEERS, CUDA_PEERS, KNOWN_PEERS, peer_names
from aot.bench.request import check_request
from aot.errors import RecipeError
from aot.recipe.load import load_recipe
from aot.recipe.plan import plan_build
from tests.export.test_cuda_graph_buckets import RECIPE

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def test_the_cuda_group_is_every_cuda_peer_and_each_is_known() -> None:
    assert CUDA_PEERS, "no CUDA peer registered"
    assert peer_names("cuda") == CUDA_PEERS
    assert set(CUDA_PEERS) <= set(KNOWN_PEERS)
    assert set(BUILD_PEERS) <= set(CUDA_PEERS)


def test_the_uncaptured_graph_module_is_for_a_build_with_buckets() -> None:
    with_buckets, without = (plan_build(load_recipe(RECIPES / name)) for name in ("bert_cuda_graphs.yaml", "bert_cuda.yaml"))
    assert with_buckets.export.graph_module.cuda_graphs and not without.export.graph_module.cuda_graphs
    assert check_request(with_buckets, peers=CUDA_PEERS).peers == CUDA_PEERS
    with pytest.raises(RecipeError, match="--peers graph_module_uncaptured: this build's GraphModule has no CUDA graph buckets"):
        check_request(without, peers=("graph_module_uncaptured",))
    others = tuple(peer for peer in CUDA_PEERS if peer not in BUILD_PEERS)
    assert check_request(without, peers=others).peers == others
    # named by the group, it is skipped with a note: the group's other peers still run
    request = check_request(without, peers=("cuda",))
    assert request.peers == others
    assert "no CUDA graph buckets" in request.skipped_peers["graph_module_uncaptured"], request.skipped_peers
    assert "--peers cuda" in request.skipped_peers["graph_module_uncaptured"], request.skipped_peers


@pytest.mark.parametrize("peer", [peer for peer in CUDA_PEERS if peer not in BUILD_PEERS])
def test_a_peer_made_from_the_eager_model_refuses_a_model_off_the_gpu(peer: str) -> None:
    with pytest.raises(RuntimeError, match=f"{peer} is a CUDA peer, and this model is on cpu"):
        build_cuda_peer(peer, torch.nn.Linear(2, 2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_every_peer_is_timed_beside_the_buckets(tmp_path: Path) -> None:
    from aot.bench import bench
    from aot.builder.spine import build

    (tmp_path / "cuda.yaml").write_text(RECIPE.replace("DEVICE", "cuda"))
    built = Path(build(tmp_path / "cuda.yaml", tmp_path / "out").output)
    report = bench(built, grid={"batch": [1], "sequence": [16]}, runs=3, peers=CUDA_PEERS)
    timed = {runner.runner: runner.median_ms for runner in report.shapes[0].runners}
    assert set(CUDA_PEERS) | {"eager", "graph_module"} <= set(timed)
    assert all(ms > 0 for ms in timed.values())
