"""The ONNX artifact (``export.onnx``) as a unit: ``model.onnx`` (+ its external weights), checked in ONNX Runtime,
opened by users in an ONNX Runtime session; beside a decoder's, the ``genai_config.json`` that makes the directory
an onnxruntime-genai model folder (:mod:`aot.export.genai_folder`).

Its writer is :func:`write_onnx` (``aot.export.write_onnx``), which the build runs in a forked child beside the other
stages (:mod:`aot.builder.onnx_stage`): :func:`aot.export.onnx_export.write_onnx`'s model, then the genai config, so
that the build hashes both with the kind's other files. Its post-write rewrites are :mod:`aot.export.onnx_optimize`'s;
they keep the model's inputs and outputs, which are all the genai config reads of it. What the manifest's deployment
section says of the genai config (written, or why not) is read again from the directory when the manifest is
written (:meth:`OnnxKind.deployment_notes`): the child that decided cannot hand it back.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch

from aot.recipe.schema import OnnxSpec

from .genai_folder import GENAI_CONFIG, NOTE_KEY, deployment_note, write_genai_config
from .kinds import ArtifactKind, OpenOptions

ONNX_FILE = "model.onnx"


def write_onnx(gm: torch.fx.GraphModule, path: Path, *args: Any, **options: Any) -> Any:
    """:func:`aot.export.onnx_export.write_onnx` (same arguments, same files), then ``genai_config.json`` beside a
    decoder's model (:func:`aot.export.genai_folder.write_genai_config`); its ``paths`` name the config too."""
    from .onnx_export import write_onnx as write_model

    written = write_model(gm, path, *args, **options)
    path = Path(path)
    folder = write_genai_config(path.parent, path.name)
    if folder.config is not None:
        written.paths.append(path.parent / GENAI_CONFIG)
    return written



def float16_in_export(spec: OnnxSpec) -> bool:
    """Whether the export itself narrows to float16. The transformer optimizer matches float32 patterns: with it,
    the file-level optimizer converts after its fusions instead (:func:`aot.export.onnx_optimize.optimize_onnx`)."""
    return spec.float16 and spec.optimize != "transformer"


def float16_after_writing(spec: OnnxSpec) -> bool:
    """Whether the file-level optimizer narrows to float16 (the other half of :func:`float16_in_export`)."""
    return spec.float16 and optimizes_after_writing(spec)


def writer_options(spec: OnnxSpec) -> dict[str, Any]:
    """The recipe's ``export.onnx`` section as :func:`aot.export.onnx_export.write_onnx`'s options: each option is
    translated here and nowhere else."""
    return {
        "opset": spec.opset,
        "optimize": spec.exporter_optimize,
        "external_data": True if spec.external_data == "always" else None,
        "ort_fusions": spec.target if spec.optimize == "ort_fusions" else None,
        # int4 layers' prompt rows through int8 GEMMs (their codes widened to int8 in the file): the writer's name for it
        "int8_prompts": spec.int4_prompts == "int8_gemm",
        "float16": float16_in_export(spec),
    }


def optimizes_after_writing(spec: OnnxSpec) -> bool:
    """Whether ONNX Runtime's file-level optimizer runs on the written file (it loads the weights whole)."""
    return spec.optimize == "transformer"


class OnnxRunnable:
    """``model.onnx`` in an ONNX Runtime session on the CPU (or a decoder step's greedy loop over it)."""

    runtime = "onnx"

    def __init__(self, path: Path, decoder: bool, threads: int | None = None):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3  # errors only: ORT's warnings would reach stderr, which a library leaves alone
        if threads:
            options.intra_op_num_threads = threads
        if decoder:
            from aot.decoding.onnx_step import OnnxStep

            self.step = OnnxStep(path, session_options=options)
            self.session = self.step.session
        else:
            self.step = None
            self.session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.input_names = [value.name for value in self.session.get_inputs()]

    def __call__(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        feed = {name: inputs[name].detach().cpu().numpy() for name in self.input_names if name in inputs}
        names = [value.name for value in self.session.get_outputs()]
        return {name: torch.from_numpy(array) for name, array in zip(names, self.session.run(None, feed))}

    def generate(self, input_ids, attention_mask, max_new_tokens, eos_token_id=None, pad_token_id=None) -> torch.Tensor:
        from aot.decoding.greedy import greedy_generate

        return greedy_generate(self.step, input_ids, attention_mask, max_new_tokens, past_layout=self.step.past_layout,
                               eos_token_id=eos_token_id, pad_token_id=pad_token_id)


class OnnxKind(ArtifactKind):
    title = "ONNX model"
    name = "onnx"
    runtime = "onnx"
    main_file = ONNX_FILE
    runs_code = False  # data: ONNX Runtime interprets it
    written_beside = True  # the longest write: forked at the export's start, joined after the others (onnx_stage)

    tolerance = "onnx_tolerance"  # ONNX Runtime's kernels: the recipe may hold them to their own atol/rtol

    def deployment_notes(self, directory: Path) -> dict[str, str]:
        return {NOTE_KEY: deployment_note(directory)}  # the genai config: written, or why not

    def open(self, directory: Path, options: OpenOptions) -> OnnxRunnable:
        return OnnxRunnable(directory / ONNX_FILE, options.decoder, options.threads)

    @contextlib.contextmanager
    def checked_runner(self, directory: Path, options: OpenOptions, input_names: dict[str, str]):
        from .onnx_runtime import release_sessions, run_onnx

        path = directory / ONNX_FILE
        named = lambda inputs: {input_names.get(name, name): value for name, value in inputs.items()}  # noqa: E731
        run = lambda inputs: run_onnx(path, named(inputs))  # noqa: E731
        try:
            yield run, run, f"{ONNX_FILE} in onnxruntime"
        finally:
            release_sessions()  # the session's copy of the weights, before the next artifact loads its own


ONNX = OnnxKind()
