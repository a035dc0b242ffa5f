"""The build plan: a recipe resolved once, and taken apart into the section each stage takes.

:func:`aot.recipe.load.load_recipe` reads and checks a recipe; :func:`plan_build` then resolves
everything a build needs from it, once: the directories (pretrained, tokenizer), the data
files (accuracy data, fidelity prompts), the shape cases, the decoder step, the passes and
the export options. A stage takes its own section and nothing else:

=================  ===============================================================
section            taken by
=================  ===============================================================
``model``          :func:`aot.models.load_model`, :func:`aot.model_blueprint.model_blueprint`
``inputs``         :mod:`aot.inputs` (shape cases, dynamic axes and ranges)
``trace``          :func:`aot.builder.capture.capture`
``passes``         the pass pipelines (:func:`aot.builder.pipeline.run_pipeline`)
``validation``     :mod:`aot.builder.checks`, the accuracy gate, the decoder's generation check
``deployment``     :mod:`aot.bundle` (config, tokenizer and processor shipped beside the artifacts)
``export``         the artifact writers
=================  ===============================================================

A value that can still be wrong at build time (a tokenizer that does not load, a data file
without the field the recipe names) carries the recipe location it came from: a
:class:`~aot.recipe.locator.Located` path, or the section's
:class:`~aot.recipe.locator.RecipeLocator`, so errors still name the file and line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aot.recipe.load import (LoadedRecipe, fidelity_gate, fidelity_target, is_decoder_with_cache, passes_changing_computation,
                             passes_needing_calibration)
from aot.recipe.locator import Located, RecipeLocator
from aot.recipe.ranges import SequenceDemand, recipe_sequence_demands, shape_case_dims
from aot.recipe.schema import (
    AccuracySpec, AotiSpec, CalibrationSpec, DimSpec, FidelitySpec, GenerationSpec, GraphModuleSpec, InputsSpec, ModelSpec, OnnxSpec,
    PassSpec, TensorSpec, Tolerance, TraceSpec,
)


@dataclass(frozen=True)
class ModelPlan:
    """What :func:`aot.models.load_model` builds: the eager model, or a decoder's KV-cache step around it."""

    spec: ModelSpec
    pretrained: Path | None  # model.pretrained, resolved
    decoder_logits: str | None  # generation.logits when the build is a decoder's KV-cache step; else None
    input_names: tuple[str, ...]  # inputs.tensors' names, which the model's forward must take
    sequence_demands: tuple[SequenceDemand, ...]  # the longest sequence each token input is fed, and each generation
    locator: RecipeLocator

    @property
    def decoder_step(self) -> bool:
        return self.decoder_logits is not None


@dataclass(frozen=True)
class InputsPlan:
    """The example inputs at every shape case, and the dims the artifacts keep dynamic."""

    spec: InputsSpec
    case_dims: tuple[dict[str, int], ...]  # the trace's sizes first, then each validation shape
    texts_tokenizer: Located | None  # the pretrained model's tokenizer, for inputs.texts
    decoder_step: bool  # a KV-cache step makes its own inputs
    device: str
    seed: int
    locator: RecipeLocator


@dataclass(frozen=True)
class TracePlan:
    spec: TraceSpec


@dataclass(frozen=True)
class CalibrationPlan:
    """``generation.calibration``: texts the graph runs on as prefills while a pass fits to them."""

    spec: CalibrationSpec
    texts_path: Path
    tokenizer: Located
    locator: RecipeLocator
    # generation.fidelity's thresholds, for a pass that keeps them while it chooses (quantize_linear_weights' auto):
    # {"kl_mean": max_kl_mean, "kl_max": max_kl, "top1_agreement": min_top1_agreement}, those the recipe sets
    fidelity_target: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class PassesPlan:
    passes: tuple[PassSpec, ...]
    compute_dtype: str  # what narrow weights (model.weights_dtype) no pass replaced are widened to
    calibration: CalibrationPlan | None = None  # where a pass needs it (load_recipe has checked that one does)


@dataclass(frozen=True)
class GatePlan:
    """``validate.accuracy``: task metrics on real data, resolved."""

    spec: AccuracySpec
    data_path: Path | None  # None: the data is inputs.texts
    texts: tuple[str, ...]  # inputs.texts
    tokenizer: Located | None
    tensors: tuple[TensorSpec, ...]  # the inputs the batches are made for
    dims: dict[str, DimSpec]
    device: str
    locator: RecipeLocator


@dataclass(frozen=True)
class FidelityPlan:
    """``generation.fidelity``: a decoder's next-token distributions on real prompts."""

    spec: FidelitySpec
    prompts_path: Path
    tokenizer: Located
    locator: RecipeLocator


@dataclass(frozen=True)
class GenerationPlan:
    """A decoder step's check: each artifact generates eager's tokens, through its KV cache."""

    spec: GenerationSpec
    seed: int
    tolerance: Tolerance
    fidelity: FidelityPlan | None


@dataclass(frozen=True)
class BisectPlan:
    """What re-running the pipeline pass by pass needs, to name the pass after which a check first fails."""

    model: ModelPlan
    inputs: InputsPlan  # the dims torch.export keeps dynamic
    trace: TracePlan
    passes: PassesPlan


@dataclass(frozen=True)
class ValidationPlan:
    tolerance: Tolerance  # validate.atol, validate.rtol
    onnx_tolerance: Tolerance  # validate.float16 for a float16 ONNX model, else the same
    device: str
    changes_computation: bool  # a pass does not preserve the computation: a gate judges the artifacts
    gate: GatePlan | None
    generation: GenerationPlan | None
    bisect: BisectPlan | None  # None: validate.bisect is off

    @property
    def fidelity(self) -> FidelityPlan | None:
        return self.generation.fidelity if self.generation is not None else None


@dataclass(frozen=True)
class DeploymentPlan:
    """The files a deployment needs beside the artifacts: config, tokenizer, image processor."""

    tokenizer: Located | None
    pretrained: Path | None
    image_processor: dict[str, Any] | None
    decoder_step: bool
    pixel_values: TensorSpec | None  # the image input, when the model reads images
    dims: dict[str, DimSpec]
    texts: tuple[str, ...]  # inputs.texts, checked against the shipped tokenizer
    gate: GatePlan | None  # its text data is checked too
    locator: RecipeLocator


@dataclass(frozen=True)
class ExportPlan:
    graph_module: GraphModuleSpec
    graph_module_passes: tuple[PassSpec, ...]
    onnx: OnnxSpec
    aoti: AotiSpec
    model: ModelSpec  # its dtype and device, for ONNX Runtime's optimizer and the CUDA graph buckets


@dataclass(frozen=True)
class RecipeRecord:
    """What the manifest records of the recipe."""

    path: Path
    text: str  # the file's, as its sha256
    sha256: str
    resolved: dict[str, Any]  # every default filled in, the overrides applied
    overrides: tuple[str, ...] = ()  # --set KEY=VALUE, as given

    def to_manifest(self) -> dict[str, Any]:
        """The manifest's ``recipe`` section; ``overrides`` only when there are some, so a build without keeps its bytes."""
        section: dict[str, Any] = {"path": str(self.path), "sha256": self.sha256, "resolved": self.resolved}
        if self.overrides:
            section["overrides"] = list(self.overrides)
        return section


@dataclass(frozen=True)
class BuildPlan:
    name: str
    output: Path | None  # the recipe's `output`
    recipe: RecipeRecord
    model: ModelPlan
    inputs: InputsPlan
    trace: TracePlan
    passes: PassesPlan
    validation: ValidationPlan
    deployment: DeploymentPlan
    export: ExportPlan


def plan_build(loaded: LoadedRecipe) -> BuildPlan:
    """Resolve ``loaded`` once into the sections of a build."""
    recipe, locator = loaded.recipe, loaded.locator
    spec = recipe.model
    decoder = is_decoder_with_cache(loaded)
    pretrained_tokenizer = Located(loaded.pretrained_directory, ("model", "pretrained"), locator) if spec.pretrained else None
    model = ModelPlan(
        spec=spec,
        pretrained=loaded.pretrained_directory,
        decoder_logits=recipe.generation.logits if decoder else None,
        input_names=tuple(tensor.name for tensor in recipe.inputs.tensors),
        sequence_demands=tuple(recipe_sequence_demands(recipe)),
        locator=locator,
    )
    inputs = InputsPlan(
        spec=recipe.inputs,
        case_dims=tuple(shape_case_dims(recipe.inputs.dims, recipe.validate_.shapes)),
        texts_tokenizer=pretrained_tokenizer,
        decoder_step=decoder,
        device=spec.device,
        seed=spec.seed,
        locator=locator,
    )
    trace = TracePlan(recipe.trace)
    passes = PassesPlan(tuple(loaded.passes), compute_dtype=spec.dtype, calibration=_calibration_plan(loaded))
    gate = _gate_plan(loaded)
    validate = recipe.validate_
    tolerance = Tolerance(atol=validate.atol, rtol=validate.rtol)
    validation = ValidationPlan(
        tolerance=tolerance,
        onnx_tolerance=validate.float16 if recipe.export.onnx.float16 else tolerance,
        device=spec.device,
        changes_computation=bool(passes_changing_computation(loaded)),
        gate=gate,
        generation=_generation_plan(loaded, tolerance) if decoder else None,
        bisect=BisectPlan(model, inputs, trace, passes) if validate.bisect else None,
    )
    deployment = DeploymentPlan(
        tokenizer=loaded.tokenizer,
        pretrained=loaded.pretrained_directory,
        image_processor=spec.image_processor,
        decoder_step=decoder,
        pixel_values=next((tensor for tensor in recipe.inputs.tensors if tensor.name == "pixel_values"), None),
        dims=recipe.inputs.dims,
        texts=tuple(recipe.inputs.texts or ()),
        gate=gate,
        locator=locator,
    )
    export = ExportPlan(
        graph_module=recipe.export.graph_module,
        graph_module_passes=tuple(loaded.graph_module_passes),
        onnx=recipe.export.onnx,
        aoti=recipe.export.aoti,
        model=spec,
    )
    record = RecipeRecord(path=loaded.path, text=loaded.text, sha256=loaded.sha256, resolved=loaded.resolved(),
                          overrides=loaded.overrides)
    output = Path(recipe.output) if recipe.output else None
    return BuildPlan(loaded.name, output, record, model, inputs, trace, passes, validation, deployment, export)


def _gate_plan(loaded: LoadedRecipe) -> GatePlan | None:
    accuracy = loaded.recipe.validate_.accuracy
    if accuracy is None:
        return None
    inputs = loaded.recipe.inputs
    return GatePlan(
        spec=accuracy,
        data_path=loaded.accuracy_data_path,
        texts=tuple(inputs.texts or ()),
        tokenizer=loaded.tokenizer,
        tensors=tuple(inputs.tensors),
        dims=inputs.dims,
        device=loaded.recipe.model.device,
        locator=loaded.locator,
    )


def _calibration_plan(loaded: LoadedRecipe) -> CalibrationPlan | None:
    if not passes_needing_calibration(loaded):
        return None  # texts no pass fits to are not even tokenised
    return CalibrationPlan(loaded.recipe.generation.calibration, loaded.calibration_texts_path, loaded.tokenizer, loaded.locator,
                           fidelity_target(loaded))


def _generation_plan(loaded: LoadedRecipe, tolerance: Tolerance) -> GenerationPlan:
    fidelity = fidelity_gate(loaded)
    fidelity_plan = None
    if fidelity is not None:  # load_recipe has checked the prompts file and that a tokenizer reads it
        fidelity_plan = FidelityPlan(fidelity, loaded.fidelity_prompts_path, loaded.tokenizer, loaded.locator)
    return GenerationPlan(loaded.recipe.generation, loaded.recipe.model.seed, tolerance, fidelity_plan)


__all__ = [
    "BisectPlan", "BuildPlan", "CalibrationPlan", "DeploymentPlan", "ExportPlan", "FidelityPlan", "GatePlan", "GenerationPlan", "InputsPlan",
    "ModelPlan", "PassesPlan", "RecipeRecord", "TracePlan", "ValidationPlan", "plan_build",
]
