"""How long the fx frontend takes to trace BERT-base (12 layers, hidden 768).

    python benchmarks/trace_speed.py [--repeat 3] [--attn sdpa|eager]

Prints the best and median wall time of ``aot.tracing.symbolic_trace`` over the
repeats (model construction is not timed). Target: well under 2 s.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import BertConfig, BertModel

from aot.tracing import symbolic_trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    args = parser.parse_args()
    torch.manual_seed(0)
    model = BertModel(BertConfig(attn_implementation=args.attn)).eval()  # bert-base-uncased sizes
    times = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        gm = symbolic_trace(model, ["input_ids", "attention_mask", "token_type_ids"])
        times.append(time.perf_counter() - started)
    nodes = len(gm.graph.nodes)
    print(
        f"BERT-base ({args.attn}) symbolic_trace: best {min(times):.3f} s, median {statistics.median(times):.3f} s "
        f"over {args.repeat} runs; {nodes} nodes; report duration_s {gm.meta['trace_report']['duration_s']}"
    )


if __name__ == "__main__":
    main()
