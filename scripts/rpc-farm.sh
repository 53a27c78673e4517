#!/usr/bin/env bash
# A farm of GPUs for searches and linear layers (tvm_explorer/farm.py, tuning/farm.py): on the
# first host, a tracker and one RPC server per GPU; on any other host, `--tracker
# FIRST_HOST:9190` joins it. Stop it with Ctrl-C.
#   scripts/rpc-farm.sh --key h200
#   python runner.py --tune metaschedule --rpc-tracker FIRST_HOST:9190 --rpc-key h200 ...
#   tvm-explorer linear --shape 4096x4096 --rpc-tracker FIRST_HOST:9190 --rpc-key h200
cd "$(dirname "$0")/.." && exec python3 -m tvm_explorer.farm "$@"
