"""Run the recipe's pass pipeline and, when validation fails, find the culprit pass."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from aot.errors import AotError, PassError
from aot.recipe.schema import PassSpec

log = logging.getLogger(__name__)


@dataclass
class PassRecord:
    name: str
    options: dict
    modified: bool
    matched: int
    changed: int
    preserves_computation: bool
    seconds: float
    notes: list[str]
    findings: dict = field(default_factory=dict)  # what the pass measured and chose; left out of the JSON when empty

    def to_json(self) -> dict:
        described = asdict(self)
        if not self.findings:
            del described["findings"]
        return described


def run_pipeline(
    graph_module: torch.fx.GraphModule,
    specs: list[PassSpec],
    after_each: Callable[[int, torch.fx.GraphModule], None] | None = None,
) -> tuple[torch.fx.GraphModule, list[PassRecord]]:
    """Apply ``specs`` in order; ``after_each(index, gm)`` runs after every pass (bisection uses it).

    A pass that fails raises a one-line PassError naming it, its step and the passes before it.
    """
    from aot.passes import registry
    from aot.passes.base import PassFailure

    records = []
    for index, spec in enumerate(specs):
        transformation = registry.get(spec.name).create(spec.options)
        started = time.perf_counter()
        before = [earlier.name for earlier in specs[:index]]
        try:
            result = transformation.apply(graph_module)
        except PassFailure as error:
            raise error.at_step(index + 1, before) from error.__cause__
        except PassError as error:  # raised by the pass itself, with its own wording
            raise PassFailure(spec.name, str(error)).at_step(index + 1, before) from error
        except AotError:
            raise  # a more specific kind (a recipe or export problem found by the pass) keeps its exit code
        except Exception as error:  # a pass bug must still end as a one-line pass failure
            raise PassFailure(spec.name, f"{type(error).__name__}: {error}").at_step(index + 1, before) from error
        graph_module = result.graph_module
        seconds = time.perf_counter() - started
        log.info("pass %s: matched %d, changed %d in %.2fs", spec.name, result.matched, result.changed, seconds)
        records.append(
            PassRecord(
                name=spec.name,
                options=spec.options,
                modified=result.modified,
                matched=result.matched,
                changed=result.changed,
                preserves_computation=bool(transformation.preserves_computation),
                seconds=round(seconds, 4),
                notes=list(result.notes),
                findings=result.findings,
            )
        )
        if after_each is not None:
            after_each(index, graph_module)
    return graph_module, records
