#!/usr/bin/env bash
# Rank 0's progress output: on a terminal (a pseudo-terminal made by `script`) a live bar
# redrawn in place; piped, only the header and per-epoch lines; --quiet, one final line.
# Usage: progress_display.sh path/to/mnist_mlp
set -u
bin=$1
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
synthetic_idx "$tmp/data" 300 40
args=(--data "$tmp/data" --hidden 32 --epochs 2 --batch-size 16 --threads 1)

# Piped: no carriage return, no escape sequence, the two epoch lines.
"$bin" "${args[@]}" >"$tmp/piped.out" 2>&1 || fail "piped run"
if grep -q $'\r\|\e' "$tmp/piped.out"; then
  fail "piped output has a carriage return or an escape sequence"
fi
[ "$(grep -c '^epoch ' "$tmp/piped.out")" -eq 2 ] || fail "piped output lacks the epoch lines"

# On a terminal: the bar ("epoch 1/2 [###...] ... samples/s  loss ... ETA"), drawn after "\r"
# and ended by erase-to-end-of-line, besides the epoch lines.
if script -qec "$(printf '%q ' "$bin" "${args[@]}")" /dev/null >"$tmp/tty.out" 2>&1; then
  grep -q $'\repoch 1/2 \[[#-]*\] .*samples/s  loss [0-9.]*  ETA [0-9?:]*\e\[K' "$tmp/tty.out" ||
    fail "no live bar on a terminal"
  [ "$(grep -c 'epoch  [12]/2  loss' "$tmp/tty.out")" -eq 2 ] ||
    fail "the epoch lines are missing on a terminal"
else
  fail "the run under script failed"
fi
if [ "$fails" -ne 0 ]; then
  echo "terminal output:"
  cat -v "$tmp/tty.out"
fi

# --quiet: one line, on a terminal too.
"$bin" "${args[@]}" --quiet >"$tmp/quiet.out" 2>&1 || fail "quiet run"
if [ "$(wc -l <"$tmp/quiet.out")" -ne 1 ] || ! grep -q "test acc" "$tmp/quiet.out"; then
  fail "--quiet printed other than one final line: $(cat "$tmp/quiet.out")"
fi
script -qec "$(printf '%q ' "$bin" "${args[@]}" --quiet)" /dev/null >"$tmp/quiet-tty.out" 2>&1
if grep -q $'\e' "$tmp/quiet-tty.out"; then fail "--quiet drew a bar on a terminal"; fi
[ "$fails" -eq 0 ] && echo "ok   bar on a terminal, lines when piped, one line with --quiet"
exit $((fails > 0))
