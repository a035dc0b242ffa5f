"""``aot check``: everything a build would reject about a recipe, without building it.

The stages run from cheapest to dearest, each only once the one before has
passed: the YAML and the schema (no torch: a typo in a key is reported in a
fraction of a second), then the pass registry (imports torch), the sizes and
the files, and last the model's config and class (imports transformers), which
say whether the inputs exist and fit, without creating a single weight. A
factory model is only known once its factory has run, so its inputs are left
to the build. The library returns a report; printing it is the CLI's job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aot.recipe.load import load_recipe
from aot.recipe.plan import BuildPlan, GenerationPlan, ModelPlan, plan_build


@dataclass(frozen=True)
class DimRange:
    """A named dim: its trace-time size and, when dynamic, the sizes the artifacts accept."""

    size: int
    dynamic: bool
    min: int | None
    max: int | None


@dataclass
class CheckReport:
    """What a build of the recipe would do, as far as it can be told without building."""

    path: str
    name: str
    model: str  # e.g. "config: bert", "pretrained: /abs/dir", "factory: pkg.mod:fn"
    model_class: str | None  # the class whose forward the inputs were checked against; None when unknown
    passes: list[str]
    graph_module_passes: list[str]
    dims: dict[str, DimRange]
    validation_shapes: list[dict[str, int]]  # the trace-time shape first; none for a decoder (see generation)
    not_checked: list[str] = field(default_factory=list)  # what only a build can tell
    generation: dict[str, Any] | None = None  # a decoder's: its prompts' lengths and the tokens generated after each

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        dims = ", ".join(
            f"{name}={dim.size}" + (f" ({dim.min or 1}..{dim.max if dim.max is not None else 'any'})" if dim.dynamic else "")
            for name, dim in self.dims.items()
        )
        model = self.model + (f" -> {self.model_class}" if self.model_class else "")
        text = f"{self.name}: {model}; {len(self.passes)} passes + {len(self.graph_module_passes)} for the GraphModule; "
        if self.generation is not None:  # a decoder is validated by generating, not at the input dims' shapes
            lengths = ", ".join(str(length) for length in self.generation["prompt_lengths"])
            text += f"validated by generating {self.generation['new_tokens']} tokens after prompts of {lengths} tokens"
        else:
            text += f"dims {dims}; validated at {len(self.validation_shapes)} shapes"
        return text + (f"; left to the build: {'; '.join(self.not_checked)}" if self.not_checked else "")


def check_recipe(path: str | Path, overrides: Sequence[str] = ()) -> CheckReport:
    """Raises :class:`aot.errors.RecipeError` on the first fault, exactly as ``aot build`` would (with the same
    ``overrides``: :func:`aot.recipe.load.load_recipe`)."""
    plan = plan_build(load_recipe(path, overrides=overrides))
    from aot.model_blueprint import model_blueprint  # transformers: only once the recipe itself is sound

    blueprint = model_blueprint(plan.model)
    if blueprint is not None:  # the tokenizer and image processor the build ships, as the build checks them
        from aot.bundle import check_deployment_files

        check_deployment_files(plan.deployment, blueprint.config)
    _check_data_files(plan)
    not_checked = ["numerical validation (needs the weights)"]
    if plan.model.spec.device != "cpu":
        not_checked.append(f"whether this machine has device '{plan.model.spec.device}'")
    if blueprint is None:
        not_checked.insert(0, "input names and sizes against the model (a factory model is known only once built)")
    elif blueprint.forward_class is None:
        not_checked.insert(0, f"input names (transformers cannot tell which class {blueprint.model_class.__name__} builds)")
    return CheckReport(
        path=str(plan.recipe.path),
        name=plan.name,
        model=_model_source(plan.model),
        model_class=blueprint.forward_class.__name__ if blueprint and blueprint.forward_class else None,
        passes=[step.name for step in plan.passes.passes],
        graph_module_passes=[step.name for step in plan.export.graph_module_passes],
        dims={
            name: DimRange(size=dim.size, dynamic=dim.dynamic, min=dim.min, max=dim.max)
            for name, dim in plan.inputs.spec.dims.items()
        },
        validation_shapes=[] if plan.validation.generation is not None else list(plan.inputs.case_dims),
        not_checked=not_checked,
        generation=_generation(plan.validation.generation),
    )


def _check_data_files(plan: BuildPlan) -> None:
    """The data the build reads beside the model, read as the build reads it: the accuracy gate's data set (its fields,
    tensors and examples, through the tokenizer), and a decoder's fidelity prompts and calibration texts (at least
    one text of two tokens each)."""
    from aot.builder.prompts import calibration_prompts, fidelity_prompts
    from aot.gates.accuracy import accuracy_data

    accuracy_data(plan.validation.gate, None)
    if plan.validation.fidelity is not None:
        fidelity_prompts(plan.validation.fidelity)
    if plan.passes.calibration is not None:
        calibration_prompts(plan.passes.calibration)


def _generation(plan: GenerationPlan | None) -> dict[str, Any] | None:
    if plan is None:
        return None
    return {"prompt_lengths": list(plan.spec.prompt_lengths), "new_tokens": plan.spec.new_tokens}


def _model_source(plan: ModelPlan) -> str:
    spec = plan.spec
    if spec.factory is not None:
        return f"factory: {spec.factory}"
    if spec.config is not None:
        return f"config: {spec.config['model_type']}"
    return f"pretrained: {plan.pretrained}"
