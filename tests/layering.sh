#!/usr/bin/env bash
# Arrows point down: a file under minidl/<layer>/ may include only its own layer and the layers
# it builds on (docs/architecture.md). Prints every upward include and fails if there is one.
# Then the other direction of the same fact: each layer's CMake target links (the DEPS of its
# minidl_add_library call) exactly the layers its files include, no fewer and no more.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
# The build enforces the first check too (each layer's include root holds only what it links);
# this is the second check, and names every offending line at once.
declare -A allowed=(
  [core]="core"
  [io]="core io"
  [ir]="core ir"
  [ops]="core ir ops"
  [autograd]="core ir ops autograd"
  [runtime]="core ir runtime"
  [parallel]="core ir ops runtime parallel"
  [train]="core ir ops autograd runtime parallel train"
  [frontend]="core io ir ops autograd runtime parallel train frontend"
  [app]="core io ir ops autograd runtime parallel train frontend app"
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

# The layers a layer's files include, and the minidl:: targets its minidl_add_library call links.
for layer in "${!allowed[@]}"; do
  cmakelists=$root/minidl/$layer/CMakeLists.txt
  [ -f "$cmakelists" ] || continue
  included=$(grep -rhoE --include='*.hpp' --include='*.cpp' '#include "minidl/[a-z_]+/' \
               "$root/minidl/$layer" | sed -E 's|.*minidl/([a-z_]+)/|\1|' | grep -vx "$layer" |
               sort -u)
  linked=$(awk -v l="$layer" '$0 ~ "minidl_add_library\\(" l "([ )]|$)" { on = 1 }
                              on { print } on && /\)/ { exit }' "$cmakelists" |
             sed -n '/DEPS/,$p' | grep -oE 'minidl::[a-z_]+' | sed 's/minidl:://' | sort -u)
  for l in $(comm -23 <(echo "$included") <(echo "$linked")); do
    echo "minidl/$layer/ includes minidl/$l/ but ${cmakelists#"$root"/} does not list minidl::$l in DEPS"
    bad=1
  done
  for l in $(comm -13 <(echo "$included") <(echo "$linked")); do
    echo "${cmakelists#"$root"/} lists minidl::$l in DEPS but nothing under minidl/$layer/ includes minidl/$l/"
    bad=1
  done
done
[ $bad -eq 0 ] && echo "layering ok"
exit $bad
