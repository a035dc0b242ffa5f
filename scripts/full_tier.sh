#!/usr/bin/env bash
# The full tier: every test, the fast and artifact tiers' included, and those marked `full` (the shipped recipes built
# at their full size and rebuilt for byte-reproducibility, the model zoos, tests that build full-size models). CI runs
# `--tier artifact`; run this before a release, after a change to the build's core, or when the canary asks
# (scripts/canary.py --full runs the same selection against the newest releases). About an hour on 2 cores.
# Extra arguments go to pytest (e.g. -x, -k bert, --junitxml=FILE).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pytest -q --tier full --durations=25 "$@"
