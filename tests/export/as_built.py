"""The build's ONNX stage for the export tests: what ``aot build`` calls, with a recipe's ``export.onnx`` options.

:class:`aot.builder.onnx_stage.OnnxStage` is the build's one call: ``write_onnx`` with the arguments
the options give it, in a forked child, then ONNX Runtime's transformer optimizer on the
file where ``optimize: transformer`` asks for it. Tests that go through it cover the paths
the build takes, and no other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from aot.builder.onnx_stage import OnnxStage
from aot.inputs import ShapeCase
from aot.recipe.schema import OnnxSpec


def write_as_built(
    gm: torch.fx.GraphModule,
    inputs: dict[str, torch.Tensor],
    dims: dict[str, dict[int, str]] | None,
    path: Path,
    *,
    ranges: dict[str, tuple[int | None, int | None]] | None = None,
    model_spec: Any = None,
    **onnx_options: Any,
) -> dict[str, int]:
    """Write ``path`` from ``gm`` as ``aot build`` would with ``export: {onnx: onnx_options}``; return the fusion counts.

    ``ranges``: the recipe's ``{dim: (min, max)}``; without it, dims are unbounded, as in a recipe
    that gives no ``min`` or ``max``. ``model_spec``: the recipe's ``model`` (its ``config``), which
    only the transformer optimizer reads.
    """
    case = ShapeCase(dims={}, inputs=inputs)
    # The stage's child moves the eager model to the meta device, so that the graph, whose weights
    # are clones of the model's in a build, is their last owner. A test's graph shares its model's
    # weights: the stage gets a stand-in.
    stand_in = torch.nn.Module()
    stage = OnnxStage.start(OnnxSpec(**onnx_options), gm, stand_in, [case], Path(path), dims or {}, ranges or {})
    return stage.finish(Path(path), model_spec)
