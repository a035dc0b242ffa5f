"""The artifacts of a build directory as callables: ONNX Runtime's session, ``module.py`` with torch, or the
AOTInductor package with torch's own loader.

Each takes ``{input name: tensor}`` and returns ``{output name: tensor}`` (:func:`aot.tracing.outputs.flatten_outputs`'s
names), and for a decoder build the first two a greedy ``generate``. Tokenization lives outside: ``module.py``
stays torch-only, and the ONNX model is data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch

RUNTIMES = ("onnx", "torch", "aoti")


class Artifact(Protocol):
    runtime: str

    def __call__(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]: ...

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                 eos_token_id: int | list[int] | None, pad_token_id: int | None) -> torch.Tensor: ...


class OnnxArtifact:
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


class TorchArtifact:
    """``graph_module/module.py`` loaded as users load it, from the very bytes the manifest hashed."""

    runtime = "torch"

    def __init__(self, directory: Path, module_sha256: str | None):
        from aot.export import load_standalone

        self.model = load_standalone(directory, module_sha256)
        self.input_names = _forward_names(self.model)

    @torch.no_grad()
    def __call__(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        from aot.tracing.outputs import flatten_outputs

        wanted = inputs if self.input_names is None else {name: value for name, value in inputs.items() if name in self.input_names}
        return flatten_outputs(self.model(**wanted))

    @torch.no_grad()
    def generate(self, input_ids, attention_mask, max_new_tokens, eos_token_id=None, pad_token_id=None) -> torch.Tensor:
        return self.model.generate(input_ids, attention_mask, max_new_tokens, eos_token_id=eos_token_id, pad_token_id=pad_token_id)


class AotiArtifact:
    """``aoti/model.pt2`` (``export.aoti``) loaded in this process by ``torch._inductor.aoti_load_package``.

    ``package``: the manifest's ``aoti`` entry: the inputs the package takes, and the device it was compiled for
    (a CUDA package takes its inputs there; its outputs come back to the CPU).
    """

    runtime = "aoti"

    def __init__(self, path: Path, package: dict[str, Any]):
        from aot.compat.torch_private import aoti_load_package

        self.run = aoti_load_package(str(path))
        self.input_names = list(package["inputs"])
        self.device = "cuda" if package["compiled_for"].startswith("cuda") else "cpu"

    @torch.no_grad()
    def __call__(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        outputs = self.run(**{name: inputs[name].to(self.device) for name in self.input_names})
        return {name: value.cpu() for name, value in outputs.items()}

    def generate(self, input_ids, attention_mask, max_new_tokens, eos_token_id=None, pad_token_id=None) -> torch.Tensor:
        raise NotImplementedError("the AOTInductor package has no generate(): use runtime 'onnx' or 'torch'")


def _forward_names(model: Any) -> list[str] | None:
    """The forward's parameter names; None where it takes any keyword (CUDA graph buckets pass all on)."""
    import inspect

    parameters = inspect.signature(model.forward).parameters
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters.values()):
        return None
    return [name for name in parameters if name != "self"]
