"""How much faster BERT-base's optimised GraphModule runs than eager transformers, on this CPU.

    python benchmarks/graph_module_speed.py [--rounds 15] [--batches 1 8] [--sequence 128]
        [--variants cleanup prepack ...] [--attn sdpa|eager] [--threads N]

Builds BERT-base (``BertModel(BertConfig(attn_implementation=...))``, seed 0),
traces it with ``aot.tracing.symbolic_trace`` and applies each variant's passes
to its own trace. Then, per batch size, every variant and eager run one after
the other in each round (interleaved, after warm-up, under
``torch.inference_mode``) and the script prints the median and p10/p90 time per
variant, its speedup over eager in the same run (``x eager``: ratio of the
medians; ``paired``: median of the per-round ratios; ``best``: ratio of the
fastest runs, the least disturbed by other load), and its largest absolute
difference from eager's ``last_hidden_state``/``pooler_output``.

The machine's cores may be shared with other processes: absolute times move
with the load, the interleaved ratios much less, but repeat a run before
trusting a difference of a few percent.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import BertConfig, BertModel

import aot.passes  # noqa: F401  (registers the passes)
from aot.passes import registry
from aot.tracing import symbolic_trace
from aot.tracing.outputs import flatten_outputs

CLEANUP = ["remove_dropout", "dead_code_elimination"]
VARIANTS: dict[str, list] = {
    "cleanup": ["merge_linears", *CLEANUP],
    "prepack": ["merge_linears", *CLEANUP, "prepack_linear_weights"],
    "prepack_unmerged": [*CLEANUP, "prepack_linear_weights"],
    "prepack_no_fusion": ["merge_linears", *CLEANUP, ("prepack_linear_weights", {"fuse_activation": False})],
    "prepack_hint_1024": ["merge_linears", *CLEANUP, ("prepack_linear_weights", {"batch_size_hint": 1024})],
}
INPUT_NAMES = ["input_ids", "attention_mask", "token_type_ids"]


def build(model: torch.nn.Module, passes: list) -> torch.fx.GraphModule:
    graph_module = symbolic_trace(model, input_names=INPUT_NAMES)
    for spec in passes:
        name, options = spec if isinstance(spec, tuple) else (spec, {})
        graph_module = registry.get(name).create(options)(graph_module)
    return graph_module


def inputs(batch: int, sequence: int, vocab: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(batch * 1000 + sequence)
    mask = torch.ones(batch, sequence, dtype=torch.long)
    mask[0, sequence * 3 // 4 :] = 0  # some padding, as real batches have
    return {
        "input_ids": torch.randint(0, vocab, (batch, sequence), generator=generator),
        "attention_mask": mask,
        "token_type_ids": torch.zeros(batch, sequence, dtype=torch.long),
    }


def max_difference(expected, actual) -> float:
    expected, actual = flatten_outputs(expected), flatten_outputs(actual)
    return max((expected[name] - actual[name]).abs().max().item() for name in expected)


def measure(runners: dict, example: dict, rounds: int, warmup: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(warmup):
        for run in runners.values():
            run(**example)
    for _ in range(rounds):
        for name, run in runners.items():
            started = time.perf_counter()
            run(**example)
            times[name].append(time.perf_counter() - started)
    return times


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--sequence", type=int, default=128)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads; default: torch's choice")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    config = BertConfig(attn_implementation=args.attn)
    model = BertModel(config).eval()
    runners = {"eager": model}
    for name in args.variants:
        runners[name] = build(model, VARIANTS[name])
    print(f"BERT-base ({args.attn} attention), seq {args.sequence}, {torch.get_num_threads()} threads, "
          f"{args.rounds} interleaved rounds after {args.warmup} warm-up; torch {torch.__version__}")

    with torch.inference_mode():
        for batch in args.batches:
            example = inputs(batch, args.sequence, config.vocab_size)
            reference = model(**example)
            differences = {name: max_difference(reference, run(**example)) for name, run in runners.items() if name != "eager"}
            times = measure(runners, example, args.rounds, args.warmup)
            eager = statistics.median(times["eager"])
            print(f"\nbatch {batch}:")
            print(f"  {'variant':<20} {'median ms':>10} {'p10':>8} {'p90':>8} {'x eager':>8} {'paired':>7} {'best':>6} {'max |diff|':>11}")
            for name, values in times.items():
                median = statistics.median(values)
                paired = statistics.median(e / v for e, v in zip(times["eager"], values))
                best = min(times["eager"]) / min(values)
                difference = f"{differences[name]:.1e}" if name in differences else "-"
                print(f"  {name:<20} {median * 1e3:>10.1f} {percentile(values, 0.1) * 1e3:>8.1f} "
                      f"{percentile(values, 0.9) * 1e3:>8.1f} {eager / median:>8.3f} {paired:>7.3f} {best:>6.3f} {difference:>11}")


if __name__ == "__main__":
    main()
