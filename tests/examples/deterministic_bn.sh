#!/usr/bin/env bash
# Deterministic mode with BatchNorm: cifar_resnet (ResNet-20) with --deterministic --sync-bn
# --augment crop,flip gives byte-identical parameters and running statistics (its --save file
# holds both) on 1x1, 1x2, 2x1 and 2x2 ranks x threads: the statistics are summed over
# micro-shards, threads and ranks in one fixed tree, and each sample's augmentation depends on
# the sample alone. Without --sync-bn each micro-shard normalises by its own statistics, which
# is layout-independent too. Exits 77 (ctest: skipped) without the CIFAR-10 files.
# Usage: deterministic_bn.sh path/to/cifar_resnet path/to/mpirun [samples]
set -u
bin=$1 mpirun=$2 samples=${3:-512}
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
data=${MINIDL_DATA_DIR:-}
if [ -z "$data" ] || ! ls "$data"/data_batch_1.bin* >/dev/null 2>&1; then
  echo "skipped: no CIFAR-10 files in MINIDL_DATA_DIR='$data' (scripts/fetch-data cifar10)"
  exit 77
fi

launch() {
  local ranks=$1 threads=$2
  shift 2
  on_layout "$ranks" "$threads" "$bin" --threads "$threads" "$@"
}

# check NAME FLAGS...: the four layouts against 1x1.
check() {
  local name=$1
  shift
  for layout in 1x1 1x2 2x1 2x2; do
    local out=$tmp/$name-$layout
    if ! launch "${layout%x*}" "${layout#*x}" --data "$data" --train-limit "$samples" \
      --test-limit 100 --epochs 1 --quiet "$@" --save "$out.safetensors" >"$out.log" 2>&1; then
      fail "$name $layout: the run failed: $(cat "$out.log")"
    elif [ "$layout" != 1x1 ]; then
      if cmp -s "$tmp/$name-1x1.safetensors" "$out.safetensors"; then
        echo "ok   $name $layout: parameters and running statistics identical to 1x1"
      else
        fail "$name $layout: the saved state differs from 1x1"
      fi
    fi
  done
}
check sync-bn --deterministic --sync-bn --augment crop,flip
check per-micro-shard --deterministic --augment crop,flip
exit $((fails > 0))
