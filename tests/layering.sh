#!/usr/bin/env bash
# Arrows point down: a file under minidl/<layer>/ may include only its own layer and the layers
# it builds on (docs/architecture.md). Prints every upward include and fails if there is one.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
# The build enforces the same (each layer's include root holds only what it links); this is the
# second check, and names every offending line at once.
declare -A allowed=(
  [core]="core"
  [io]="core io"
  [ir]="core ir"
  [ops]="core ir ops"
  [autograd]="core ir ops autograd"
  [runtime]="core ir ops runtime"
  [parallel]="core ir ops autograd runtime parallel"
  [train]="core ir ops autograd runtime parallel train"
  [frontend]="core io ir ops autograd runtime parallel train frontend"
)
bad=0
for layer in "${!allowed[@]}"; do
  [ -d "$root/minidl/$layer" ] || continue
  while IFS=: read -r file _ inc; do
    target=$(sed -E 's|.*"minidl/([a-z_]+)/.*|\1|' <<<"$inc")
    if [[ " ${allowed[$layer]} " != *" $target "* ]]; then
      echo "upward include in ${file#"$root"/}: $inc"
      bad=1
    fi
  done < <(grep -rn --include='*.hpp' --include='*.cpp' -E '#include "minidl/' "$root/minidl/$layer")
done
[ $bad -eq 0 ] && echo "layering ok"
exit $bad
