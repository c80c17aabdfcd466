#!/usr/bin/python3
"""Checks the relative links of README.md and docs/*.md: every target file must exist and every
#anchor must name a heading of its file (GitHub's slugs). Prints each broken link with its file
and line, and exits 1 if there is one. Links to web addresses are not followed."""
import os
import re
import sys
import unicodedata

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def markdown_files():
    files = [os.path.join(ROOT, "README.md")]
    docs = os.path.join(ROOT, "docs")
    files += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    return files


def prose_lines(path):
    """(line number, text) of the lines outside fenced code blocks."""
    fence = None
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            marker = re.match(r"\s*(```|~~~)", line)
            if marker:
                if fence is None:
                    fence = marker.group(1)
                elif marker.group(1) == fence:
                    fence = None
                continue
            if fence is None:
                yield number, line


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link keeps its text
    kept = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in " -_" or cat[0] in "LMN":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        seen = {}
        found = set()
        for _, line in prose_lines(path):
            m = re.match(r"(#{1,6})\s+(.*?)\s*#*\s*$", line)
            if not m:
                continue
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        cache[path] = found
    return cache[path]


def main():
    broken = 0
    checked = 0
    for path in markdown_files():
        for number, line in prose_lines(path):
            line = re.sub(r"`[^`]*`", "", line)  # code spans are not links
            for target in LINK.findall(line):
                if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                    continue
                checked += 1
                file_part, _, anchor = target.partition("#")
                dest = path if not file_part else os.path.normpath(
                    os.path.join(os.path.dirname(path), file_part))
                where = f"{os.path.relpath(path, ROOT)}:{number}"
                if not os.path.exists(dest):
                    print(f"{where}: {target}: no file {os.path.relpath(dest, ROOT)}")
                    broken += 1
                elif anchor and (not dest.endswith(".md") or anchor not in anchors(dest)):
                    print(f"{where}: {target}: no heading with anchor #{anchor} in "
                          f"{os.path.relpath(dest, ROOT)}")
                    broken += 1
    print(f"{checked} relative links checked, {broken} broken")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
