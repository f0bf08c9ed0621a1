#!/usr/bin/env python3
"""Check that the documentation's links resolve inside the repository.

Reads README.md, ARCHITECTURE.md, CHANGELOG.md and every docs/**/*.md. For each
markdown link or image `[text](target)`, reference definition `[label]: target` and
HTML `<a href>` / `<img src>` whose target has no scheme (http, https, mailto, ...
are skipped: CI has no network; autolinks `<...>` always have one), the file or
directory must exist relative to the markdown file,
and a `#anchor` must match a heading of the target file (or of the same file when the
target is only `#anchor`) under GitHub's slug rules. Links inside code blocks and code
spans are not links. Also fails when README.md has 150 lines or more.

Prints every broken link as FILE:LINE: message and exits 1 if there is any.
Usage: python3 scripts/check-links.py [REPO_ROOT]
"""

import os
import re
import sys
import unicodedata
from urllib.parse import unquote

README_MAX_LINES = 150  # README.md must have fewer lines than this

# [text](target "title") and ![alt](target); the text may hold one level of brackets.
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+[\"'(][^)]*)?\s*\)")
# [label]: target at the start of a line.
REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
# <a href="target"> and <img src="target"> in inline HTML.
HTML_LINK = re.compile(r"<(?:a|img)\s[^>]*?(?:href|src)\s*=\s*[\"']([^\"']*)[\"']", re.I)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SETEXT = re.compile(r"^\s{0,3}(=+|-+)\s*$")
HTML_ANCHOR = re.compile(r"<a\s+[^>]*(?:name|id)\s*=\s*[\"']([^\"']+)[\"']", re.I)


def slug(text):
    """GitHub's anchor for a heading: inline markup dropped, lower case, punctuation
    other than '-' and '_' removed, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links: keep their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "")
    text = text.strip().lower()
    out = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in "-_" or ch.isalnum() or cat.startswith("M"):
            out.append(ch)
        elif ch == " ":
            out.append("-")
        # every other character (punctuation, symbols) is dropped
    return "".join(out)


def strip_code_spans(line):
    """Blank out `code spans` so links inside them are not checked."""
    out, i = [], 0
    while i < len(line):
        if line[i] == "`":
            n = len(line[i:]) - len(line[i:].lstrip("`"))
            ticks = line[i : i + n]
            end = line.find(ticks, i + n)
            if end < 0:
                out.append(line[i:])
                break
            out.append(" " * (end + n - i))
            i = end + n
        else:
            out.append(line[i])
            i += 1
    return "".join(out)


def prose_lines(text):
    """(line number, line) for every line outside fenced code blocks."""
    fence = None
    for no, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
                continue
            yield no, line
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
            fence = None


_anchor_cache = {}


def anchors(path):
    """Every anchor a markdown file offers: heading slugs (with GitHub's -1, -2 for
    repeats) and explicit <a name/id> anchors."""
    if path in _anchor_cache:
        return _anchor_cache[path]
    with open(path, encoding="utf-8") as f:
        text = f.read()
    found, seen = set(), {}
    prev = None
    for _, line in prose_lines(text):
        title = None
        m = HEADING.match(line)
        if m:
            title = m.group(2)
        elif prev is not None and prev.strip() and SETEXT.match(line) and not HEADING.match(prev):
            title = prev.strip()
        if title is not None:
            base = slug(title)
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        for a in HTML_ANCHOR.findall(line):
            found.add(a)
        prev = line
    _anchor_cache[path] = found
    return found


def links(text):
    """(line number, target) for every link outside code."""
    for no, line in prose_lines(text):
        bare = strip_code_spans(line)
        for m in INLINE.finditer(bare):
            yield no, m.group(1)
        m = REFDEF.match(bare)
        if m:
            yield no, m.group(1)
        for m in HTML_LINK.finditer(bare):
            yield no, m.group(1)


def check_file(root, md, problems):
    with open(md, encoding="utf-8") as f:
        text = f.read()
    rel = os.path.relpath(md, root)
    for no, target in links(text):
        if target.startswith("<") and target.endswith(">"):
            target = target[1:-1]
        if SCHEME.match(target) or target.startswith("//"):
            continue  # http(s), mailto, ...: not checked (no network in CI)
        path, _, anchor = target.partition("#")
        path = unquote(path.split("?", 1)[0])
        if path.startswith("/"):
            problems.append(f"{rel}:{no}: {target}: absolute path; use a path relative to {rel}")
            continue
        dest = os.path.normpath(os.path.join(os.path.dirname(md), path)) if path else md
        if not os.path.abspath(dest).startswith(os.path.abspath(root) + os.sep) and dest != root:
            problems.append(f"{rel}:{no}: {target}: points outside the repository")
            continue
        if not os.path.exists(dest):
            problems.append(f"{rel}:{no}: {target}: no such file or directory")
            continue
        if anchor:
            if os.path.isdir(dest) or not dest.endswith((".md", ".markdown")):
                problems.append(f"{rel}:{no}: {target}: an anchor into something that is not a markdown file")
            elif unquote(anchor) not in anchors(dest):
                problems.append(f"{rel}:{no}: {target}: no heading #{anchor} in {os.path.relpath(dest, root)}")


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    files = [os.path.join(root, f) for f in ("README.md", "ARCHITECTURE.md", "CHANGELOG.md")]
    problems = []
    for f in files:
        if not os.path.exists(f):
            problems.append(f"{os.path.relpath(f, root)}: missing")
    files = [f for f in files if os.path.exists(f)]
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, "docs")):
        dirnames.sort()
        files += [os.path.join(dirpath, n) for n in sorted(filenames) if n.endswith(".md")]
    for md in files:
        check_file(root, md, problems)

    readme = os.path.join(root, "README.md")
    if os.path.exists(readme):
        with open(readme, encoding="utf-8") as f:
            n = len(f.read().splitlines())
        if n >= README_MAX_LINES:
            problems.append(f"README.md: {n} lines; keep it under {README_MAX_LINES} and move the rest to docs/")

    for p in problems:
        print(p)
    count = len(files)
    if problems:
        print(f"check-links: {len(problems)} problem(s) in {count} files")
        return 1
    print(f"check-links: every link in {count} files resolves; README.md is under {README_MAX_LINES} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
