"""The typed recipe: one YAML file describes one build.

Every option has a type, a default where one makes sense, and a description
that ends up in the published JSON Schema (``aot schema``). Unknown keys are
errors (``extra="forbid"``); :mod:`aot.recipe.load` turns pydantic's complaints into
one line naming the recipe file, the line and the key.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

DType = Literal["float32", "float16", "bfloat16", "float64", "int64", "int32", "bool"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ModelSpec(_Strict):
    """Where the model comes from: exactly one of ``config``, ``pretrained`` or ``factory``."""

    config: dict[str, Any] | None = Field(
        None,
        description="Inline transformers config: must hold `model_type`; every other key overrides the "
        "architecture's default (e.g. num_hidden_layers). Weights come from `seed`.",
    )
    pretrained: str | None = Field(
        None,
        description="Local pretrained directory (config.json + weights). Relative paths are resolved "
        "against `package`'s install directory when given, else against the recipe file.",
    )
    package: str | None = Field(
        None, description="Python package whose install directory `pretrained` is relative to."
    )
    factory: str | None = Field(
        None, description="`package.module:function` returning an nn.Module; called with `factory_kwargs`."
    )
    factory_kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for `factory`.")
    model_class: str | None = Field(
        None,
        alias="class",
        description="transformers class to build, e.g. BertModel or BertForSequenceClassification. "
        "Defaults to AutoModel for the config.",
    )
    # torch's seeds run from -2**63 to 2**64 - 1, and each shape case's inputs are seeded with seed + the case's index:
    # the signed 64-bit range leaves that room (and takes every seed a recipe could give before it was bounded, but
    # those from 2**63 up).
    seed: int = Field(
        0, ge=-(2**63), le=2**63 - 1, description="Seed for weight initialisation and random inputs, -2**63 to 2**63 - 1."
    )
    dtype: Literal["float32", "float16", "bfloat16"] = Field("float32", description="Parameter dtype.")
    weights_dtype: Literal["float16", "bfloat16"] | None = Field(
        None,
        description="Keep a `pretrained` checkpoint's linear and embedding weights in the dtype it stores them in "
        "(this one) and widen them to `dtype` where they are used: the same computation at half the memory of "
        "float32 weights while the model is traced, validated and quantised. Linear layers no pass replaces are "
        "widened after the passes; embedding tables stay in this dtype in the artifacts. Needs the fx frontend.",
    )
    device: str = Field("cpu", description="Device the model, the trace and the validation run on.")
    attn_implementation: Literal["sdpa", "eager"] | None = Field(
        None, description="transformers attention implementation; the class default when unset."
    )
    image_processor: dict[str, Any] | None = Field(
        None,
        description="An image processor's settings as its preprocessor_config.json holds them (with "
        "`image_processor_type`, e.g. ConvNextImageProcessor), for a vision model that has none of its own "
        "(one built from `config`): shipped in the build directory and checked to give the inputs' pixel shape. "
        "A pretrained directory's own preprocessor_config.json ships without it.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        given = [key for key in ("config", "pretrained", "factory") if getattr(self, key) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of `config`, `pretrained` or `factory`"
                + (f" (got {', '.join(given)})" if given else "")
            )
        if self.config is not None and "model_type" not in self.config:
            raise ValueError("`config` needs a `model_type` key (e.g. bert)")
        return self


class DimSpec(_Strict):
    """A named dimension shared by the inputs, e.g. batch or sequence."""

    size: int = Field(..., ge=1, description="Size at trace time.")
    dynamic: bool = Field(False, description="Whether artifacts accept other sizes (dynamic ONNX axis).")
    min: int | None = Field(None, ge=1, description="Smallest size accepted when dynamic.")
    max: int | None = Field(None, ge=1, description="Largest size accepted when dynamic.")

    @model_validator(mode="after")
    def _size_within_range(self) -> DimSpec:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}")
        if self.min is not None and self.size < self.min:
            raise ValueError(f"size {self.size} is below min {self.min}")
        if self.max is not None and self.size > self.max:
            raise ValueError(f"size {self.size} is above max {self.max}")
        return self


class TensorSpec(_Strict):
    """One model input."""

    name: str = Field(..., description="Keyword argument of the model's forward.")
    shape: list[str | int] = Field(
        default_factory=list, description="Dimension names (from `dims`) or fixed sizes."
    )
    dtype: DType = Field("int64", description="Element type.")
    low: float | None = Field(None, description="Smallest random value (inclusive).")
    high: float | None = Field(
        None,
        description="Largest random value (exclusive for integers). Token ids default to the vocab size.",
    )
    fill: Literal["random", "ones", "zeros"] = Field("random", description="How values are made.")
    last: float | None = Field(
        None,
        description="Value of every row's last element, the end of the sequence axis (the EOS id a tokenizer "
        "appends, which BART-style sequence classifiers pool at; keep `low` above it so it appears once).",
    )


class InputsSpec(_Strict):
    """The example inputs: named dims, tensors, and optionally real texts."""

    dims: dict[str, DimSpec] = Field(default_factory=dict, description="Named dimensions.")
    tensors: list[TensorSpec] = Field(default_factory=list, description="Inputs in forward order.")
    texts: list[str] | None = Field(
        None,
        description="Sample texts tokenised with the model's own tokenizer (pretrained models): tensors "
        "then name the tokenizer outputs to feed, padded to the `sequence` dim.",
    )

    @model_validator(mode="after")
    def _dims_known(self) -> InputsSpec:
        for tensor in self.tensors:
            for dim in tensor.shape:
                if isinstance(dim, str) and dim not in self.dims:
                    raise ValueError(f"input '{tensor.name}' uses dim '{dim}' that `dims` does not define")
        return self


class TraceSpec(_Strict):
    """How the model is captured."""

    frontend: Literal["fx", "export"] = Field(
        "fx", description="`fx`: aot's HF-aware torch.fx tracer (module-level graph); `export`: torch.export."
    )
    leaf_modules: list[str] = Field(
        default_factory=list,
        description="Modules kept as call_module nodes: class names, dotted class paths or qualified names.",
    )
    autowrap_functions: list[str] = Field(
        default_factory=list, description="`package.module:function` kept as call_function leaves."
    )


class Tolerance(_Strict):
    """How far an artifact's outputs may be from eager: |a-b| <= atol + rtol*|b|, element by element."""

    atol: float = Field(description="Absolute tolerance.", ge=0, allow_inf_nan=False)
    rtol: float = Field(description="Relative tolerance.", ge=0, allow_inf_nan=False)


class AccuracyMetrics(_Strict):
    """Task metrics of an artifact against the float32 eager model, each a threshold the artifact must reach."""

    cosine_mean: float | None = Field(
        None, ge=-1, le=1, allow_inf_nan=False,
        description="Smallest mean, over the examples, of the cosine similarity between the artifact's and "
        "eager's vector for an example (after `pooling`): embeddings.",
    )
    cosine_min: float | None = Field(
        None, ge=-1, le=1, allow_inf_nan=False, description="Smallest cosine similarity allowed for any one example."
    )
    top1_agreement: float | None = Field(
        None, ge=0, le=1, allow_inf_nan=False,
        description="Smallest share of examples (of tokens, where the output has a sequence axis and the inputs "
        "an attention_mask) whose arg-max over the last axis is eager's: classifiers.",
    )
    spearman: float | None = Field(
        None, ge=-1, le=1, allow_inf_nan=False,
        description="Smallest Spearman correlation between the pairwise cosine similarities of all examples "
        "under the artifact and under eager: what sentence-embedding users rank by.",
    )

    @model_validator(mode="after")
    def _at_least_one(self) -> AccuracyMetrics:
        if all(value is None for value in self.model_dump().values()):
            raise ValueError("name at least one metric threshold (cosine_mean, cosine_min, top1_agreement, spearman)")
        return self


class TokenizerSource(_Strict):
    """A local pretrained directory whose tokenizer turns text data into the model's inputs."""

    pretrained: str = Field(
        ..., description="Directory holding the tokenizer files; relative to `package`'s install directory when "
        "given, else to the recipe file (as model.pretrained)."
    )
    package: str | None = Field(None, description="Python package whose install directory `pretrained` is relative to.")


class AccuracySpec(_Strict):
    """An accuracy gate: task metrics on real data, for graphs whose passes change the computation."""

    data: str = Field(
        "texts",
        description="`texts` (the recipe's inputs.texts), or a file relative to the recipe: .txt (one example a "
        "line), .jsonl (the `text_field` of each line), both tokenised with the pretrained model's tokenizer (or `tokenizer`'s), or "
        ".safetensors (one tensor per recipe input, examples along the first axis).",
    )
    text_field: str = Field("text", description="The field holding the text in a .jsonl data set.")
    tokenizer: TokenizerSource | None = Field(
        None, description="Where text data's tokenizer comes from when not from model.pretrained (a model built "
        "from a config has none)."
    )
    output: str | None = Field(None, description="The output the metrics read (a name `aot` gives outputs); default the first.")
    pooling: Literal["mean", "cls", "none"] = Field(
        "mean",
        description="How an example's vector is made from an output with a sequence axis: `mean` over the tokens "
        "its attention_mask keeps, `cls` the first token, `none` the whole output flattened.",
    )
    batch_size: int = Field(32, ge=1, description="Examples per call.")
    metrics: AccuracyMetrics = Field(..., description="The thresholds; every one given must be reached by every artifact.")


class ValidateSpec(_Strict):
    """Numerical comparison of every artifact against the eager model."""

    # Finite: an infinite tolerance (`.inf`) would pass any output, so it is refused like a negative one.
    atol: float = Field(1e-4, ge=0, allow_inf_nan=False, description="Absolute tolerance.")
    rtol: float = Field(1e-4, ge=0, allow_inf_nan=False, description="Relative tolerance: |a-b| <= atol + rtol*|b|.")
    float16: Tolerance = Field(
        default_factory=lambda: Tolerance(atol=2e-2, rtol=1e-2),
        description="Tolerances for a float16 artifact (`export.onnx.precision`) against the float32 eager model: "
        "float16 keeps 11 significant bits, so each op rounds by up to ~5e-4 of its result, and a deep "
        "model accumulates that (BERT-base, random weights, max abs error on outputs up to ~4.5: 3e-3 in "
        "ONNX Runtime on CPU, 1.0e-2 on an H100).",
    )
    shapes: list[dict[str, int]] = Field(
        default_factory=list,
        description="Extra shapes to check beside the trace-time one, as {dim: size}. Defaults to two shapes "
        "derived from the dynamic dims.",
    )
    bisect: bool = Field(True, description="On failure, re-run the pipeline pass by pass to name the culprit.")
    accuracy: AccuracySpec | None = Field(
        None,
        description="Accuracy gate, required once a pass does not preserve the computation (precision, activation "
        "changes): every artifact is then held to these task metrics on real data instead of atol/rtol.",
    )


def _pass_entry(item: Any) -> Any:
    """One ``passes`` entry's form, said in the recipe's terms (pydantic would say which union member it failed)."""
    if isinstance(item, dict):
        for name, options in item.items():
            if options is not None and not isinstance(options, dict):
                raise ValueError(f"the options of '{name}' are a mapping {{option: value}}, not {type(options).__name__} {options!r}")
    elif not isinstance(item, str):
        raise ValueError("a pass is a name or a one-key mapping {name: {option: value}}")
    return item


PassList = list[Annotated[str | dict[str, dict[str, Any] | None], BeforeValidator(_pass_entry)]]


class ToggleSection(_Strict):
    """An artifact section that also accepts a bare `true` / `false` for `enabled`."""

    @model_validator(mode="before")
    @classmethod
    def _enabled_shorthand(cls, value: Any) -> Any:
        return {"enabled": value} if isinstance(value, bool) else value


class GraphModuleSpec(ToggleSection):
    """The saved GraphModule artifact."""

    enabled: bool = Field(True, description="Write graph_module/ (code + safetensors + meta).")
    passes: PassList = Field(
        default_factory=list,
        description="Passes for this artifact only, run after the ONNX export (e.g. CPU weight prepacking, "
        "which ONNX cannot express). Same form as the top-level `passes`.",
    )
    cuda_graphs: dict[str, list[Annotated[int, Field(ge=1)]]] | None = Field(
        None,
        description="Shape buckets per dynamic dim, e.g. {batch: [1, 8, 32], sequence: [64, 128, 256]}: module.py "
        "replays one CUDA graph per bucket (captured at its first call, or all at load with load(capture='all')), "
        "padding a call up to the smallest bucket that holds it (the attention mask 0 over the padding) and slicing "
        "the outputs back; beyond the largest bucket it runs uncaptured. The build validates the padded path at "
        "every validation shape. Off CUDA the buckets only pad (nothing to capture).",
    )


class OnnxSpec(ToggleSection):
    """The ONNX artifact."""

    enabled: bool = Field(True, description="Write model.onnx.")
    opset: int = Field(18, ge=13, le=23, description="ONNX opset version.")
    exporter_optimize: bool = Field(
        False,
        description="Run the torch.onnx exporter's onnxscript optimiser (constant folding, Conv+BN folding). "
        "ONNX Runtime folds constants itself at load; off, the export is ~30% faster and the graph shows "
        "exactly what aot's passes did.",
    )
    external_data: Literal["always", "auto"] = Field(
        "always",
        description="`always`: weights in model.onnx.data beside model.onnx (faster export, half the peak "
        "memory); `auto`: only past protobuf's 2 GiB limit.",
    )
    optimize: Literal["none", "ort_fusions", "transformer"] = Field(
        "none",
        description="ONNX-level stage after export, validated like any pass: `ort_fusions` fuses the graph, in memory "
        "before it is written, into ONNX Runtime's contrib ops for `target` (attention, bias-gelu); `transformer` applies ONNX "
        "Runtime's own transformer optimizer fusions.",
    )
    target: Literal["cpu", "cuda"] = Field(
        "cpu",
        description="Where ONNX Runtime will run the model: `ort_fusions` picks the rewrites that are faster there "
        "(cpu: feed-forward blocks split in two half-width blocks, norms fed from a Sum so ONNX Runtime keeps "
        "them unfused; cuda: SkipLayerNormalization), and "
        "`precision: auto` the number format.",
    )
    precision: Literal["auto", "float32", "float16"] = Field(
        "auto",
        description="Number format of the ONNX model's weights and arithmetic; inputs and outputs keep their "
        "types. `float16` halves the file and runs on GPU tensor cores; it is validated with "
        "`validate.float16`'s tolerances. `auto`: float16 for `target: cuda`, float32 for `cpu`.",
    )

    int4_prompts: Literal["matmul_nbits", "int8_gemm"] = Field(
        "matmul_nbits",
        description="How int4 weight-only layers (activations int8) run a call of more than 8 rows, a prompt: "
        "`matmul_nbits`, ONNX Runtime's MatMulNBits as every call; `int8_gemm`, its int8 GEMM (MatMulInteger) on an "
        "int8 per-channel copy of the weights stored beside the int4 codes (a byte a weight more in the file), with "
        "each row of activations rounded to int8, as the GraphModule runs prompts. Decode steps keep MatMulNBits. "
        "Needs opset 18 or later.",
    )

    @model_validator(mode="after")
    def _int8_prompts_need_opset_18(self) -> OnnxSpec:
        if self.int4_prompts == "int8_gemm" and self.opset < 18:
            raise ValueError(f"`int4_prompts: int8_gemm` needs opset 18 or later (got {self.opset}): its ReduceMax takes axes as an input")
        return self

    @property
    def float16(self) -> bool:
        return self.precision == "float16" or (self.precision == "auto" and self.target == "cuda")


class AotiSpec(ToggleSection):
    """The AOTInductor package, an optional third artifact."""

    enabled: bool = Field(
        False,
        description="Write aoti/model.pt2: the graph after the passes, exported with the recipe's dynamic dims and "
        "compiled ahead of time by torch's Inductor (torch._inductor.aoti_compile_and_package) for the build's "
        "device; loaded with torch alone (torch._inductor.aoti_load_package), it returns {output name: tensor}. "
        "Validated like the other artifacts, in a process of its own. Its bytes are not reproducible and it runs "
        "on the build's kind of processor or GPU only (the manifest's `aoti` says so).",
    )


class ExportSpec(_Strict):
    """Which artifacts to write."""

    graph_module: GraphModuleSpec = Field(default_factory=GraphModuleSpec, description="Saved GraphModule options.")
    onnx: OnnxSpec = Field(default_factory=OnnxSpec, description="ONNX artifact options.")
    aoti: AotiSpec = Field(default_factory=AotiSpec, description="AOTInductor package options.")


class PassSpec(_Strict):
    """One step of the pass pipeline, after parsing: a registered name and its options."""

    name: str
    options: dict[str, Any] = Field(default_factory=dict)


class FidelitySpec(_Strict):
    """A decoder's fidelity gate: its artifacts' next-token distributions against the float32 eager model's."""

    prompts: str = Field(
        ..., description="A text file relative to the recipe, one prompt a line (e.g. data/prompts.txt), tokenised "
        "with the tokenizer the build ships (generation.tokenizer, or the pretrained model's).",
    )
    max_prompt_tokens: int = Field(48, ge=2, description="Each prompt is cut to this many tokens: the positions scored.")
    max_prompts: int | None = Field(
        None, ge=1, description="Score only the file's first this many prompts (all when left out): the gate's time "
        "grows with each, and a large decoder's eager reference is most of its build.",
    )
    new_tokens: int = Field(16, ge=1, description="Tokens each artifact generates greedily per prompt for `min_greedy_agreement`.")
    max_kl_mean: float | None = Field(
        None, gt=0, allow_inf_nan=False,
        description="Largest mean, over every prompt position (teacher-forced), of KL(eager || artifact) of the "
        "next-token distributions, in nats; held twice: with the prompts fed one token a call (decode steps) and "
        "prefilled (each position given its prefix in one call).",
    )
    max_kl: float | None = Field(None, gt=0, allow_inf_nan=False, description="Largest KL divergence allowed at any one position, fed either way.")
    min_top1_agreement: float | None = Field(
        None, ge=0, le=1, allow_inf_nan=False, description="Smallest share of positions whose most likely next token is eager's, fed either way.",
    )
    min_greedy_agreement: float | None = Field(
        None, ge=0, le=1, allow_inf_nan=False,
        description="Smallest mean, over the prompts, of the share of `new_tokens` greedy tokens made before the "
        "first that differs from eager's.",
    )

    @model_validator(mode="after")
    def _at_least_one(self) -> FidelitySpec:
        if all(getattr(self, name) is None for name in ("max_kl_mean", "max_kl", "min_top1_agreement", "min_greedy_agreement")):
            raise ValueError("name at least one threshold (max_kl_mean, max_kl, min_top1_agreement, min_greedy_agreement)")
        return self


class CalibrationSpec(_Strict):
    """Texts a pass fits its choices to (``quantize_linear_weights`` with ``method: gptq``): each a prefill of the decoder."""

    texts: str = Field(
        ..., description="A text file relative to the recipe, one text a line (e.g. data/sentences.txt), tokenised "
        "with the tokenizer the build ships. Keep it apart from the fidelity prompts, which judge the result.",
    )
    max_tokens: int = Field(128, ge=2, description="Each text is cut to this many tokens; texts under 2 tokens are left out.")
    max_texts: int | None = Field(None, ge=1, description="Use only the first this many texts (all when left out).")


class GenerationSpec(_Strict):
    """A decoder that generates: the build's artifacts are one KV-cache step, validated by greedy generation."""

    cache: bool = Field(
        False,
        description="Build the decoder-with-past step (Optimum's convention): inputs input_ids, attention_mask, "
        "position_ids (where the model takes it), past_key_values.{i}.key/value; outputs logits, present.{i}.key/value. "
        "One model serves the prefill (a past of length 0) and every decode step. The inputs come from the model: "
        "`inputs` must be left out. Either frontend traces it.",
    )
    logits: Literal["all", "last"] = Field(
        "all",
        description="`all`: logits for every position, (batch, sequence, vocab), as Optimum's decoders give them; "
        "`last`: the last position's only, (batch, 1, vocab), as generate computes them: a prefill then skips the "
        "vocabulary projection of every other prompt token. Greedy loops read the last position either way.",
    )
    new_tokens: int = Field(
        32, ge=1, description="Tokens each artifact generates per validation prompt; they must equal eager generate's."
    )
    tokenizer: TokenizerSource | None = Field(
        None, description="The tokenizer the build ships for a decoder built from a config, so that `aot run` and "
        "`aot.load` turn text into token ids and back; its vocabulary must fit the model's (vocab_size).",
    )
    prompt_lengths: list[int] = Field(
        default_factory=lambda: [5, 11],
        min_length=1,
        description="Validation prompt lengths; each is generated at batch 1 and at batch 2 with its second row left "
        "padded. A sliding-window model must generate past its window.",
    )
    fidelity: FidelitySpec | None = Field(
        None,
        description="Fidelity gate, required once a pass does not preserve the computation (quantize_linear_weights): "
        "each artifact's teacher-forced next-token distributions on real prompts against the float32 eager model's "
        "(KL divergence, top-1 agreement) and its greedy tokens. The exact-token generation check is then recorded, "
        "not required.",
    )

    calibration: CalibrationSpec | None = Field(
        None,
        description="Texts for passes that fit to data (quantize_linear_weights with method: gptq): the graph runs each "
        "as a prefill while the pass works. Required by such a pass, unused otherwise.",
    )

    @model_validator(mode="after")
    def _prompts_long_enough(self) -> GenerationSpec:
        short = [length for length in self.prompt_lengths if length < 2]
        if short:
            raise ValueError(f"prompt length {short[0]} is too short: batch 2 pads its second row by one token, so at least 2")
        return self


class Recipe(_Strict):
    """One build."""

    name: str | None = Field(None, description="Build name; defaults to the recipe file's stem.")
    description: str | None = Field(None, description="Free text for people.")
    model: ModelSpec
    inputs: InputsSpec = Field(default_factory=InputsSpec)
    trace: TraceSpec = Field(default_factory=TraceSpec)
    passes: PassList = Field(
        default_factory=list,
        description="Pass pipeline: a registered pass name, or a one-key mapping {name: {option: value}}.",
    )
    validate_: ValidateSpec = Field(default_factory=ValidateSpec, alias="validate")
    export: ExportSpec = Field(default_factory=ExportSpec)
    generation: GenerationSpec | None = Field(
        None, description="For causal LMs: KV-cache artifacts validated by generating eager's exact tokens."
    )
    output: str | None = Field(None, description="Output directory; defaults to out/<name> under the cwd.")
