#!/usr/bin/env python3
"""The library's file-level import graph, and the circles in it.

An edge A -> B means code in file A names an item (type, function, trait,
constant...) that file B defines. Names reached through `use` and `pub use` are
followed to the file that defines them, so a module that only re-exports is not
a hop, and a `pub use` is an edge only when the re-exporting file's own code uses
the name too (a re-export is the module's public face, not a dependency). Test
code (`#[cfg(test)]` modules, inline or in their own files) is left out: it may
reach any layer. Macros are not followed.

    scripts/import-graph.py            # circles spanning more than one file; exit 1 if any
    scripts/import-graph.py --layers   # also each directory's edges to other directories
    scripts/import-graph.py --edges A  # what file A imports, and from where
    scripts/import-graph.py --src DIR  # another checkout's src/ (before and after)

Approximations: an item defined twice in one module under `cfg` is one item;
enum variants and associated items resolve to the enum's or type's file.
"""
import os
import re
import sys
from collections import defaultdict

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
ITEM = re.compile(r"\b(?:struct|enum|trait|fn|type|const|static|union|mod)\s+([A-Za-z_]\w*)")
MACRO = re.compile(r"\bmacro_rules!\s*([A-Za-z_]\w*)")


def strip(text):
    """Comments, strings and char literals replaced by spaces (lines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'":
            m = re.match(r"'(\\.[^']*|[^\\'])'", text[i:])
            if m:
                out.append("' '")
                i += len(m.group(0))
            else:  # a lifetime
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching_brace(text, i):
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(text) - 1


TEST_ATTR = re.compile(r"#\[cfg\(\s*(?:test|all\(test[^\]]*|any\(test[^\]]*)\)\]\s*(?:#\[[^\]]*\]\s*)*")


def drop_test_code(text):
    """Remove `#[cfg(test)]` items; return (text, names of test-only modules declared)."""
    test_mods = set()
    while True:
        m = TEST_ATTR.search(text)
        if not m:
            return text, test_mods
        rest = text[m.end():]
        mm = re.match(r"(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", rest)
        if mm:
            test_mods.add(mm.group(1))
            end = m.end() + mm.end()
        else:
            semi, brace = rest.find(";"), rest.find("{")
            if brace >= 0 and (semi < 0 or brace < semi):
                end = matching_brace(text, m.end() + brace) + 1
            else:
                end = m.end() + semi + 1
        text = text[:m.start()] + "\n" * text.count("\n", m.start(), end) + text[end:]


def split_top(s, sep=","):
    parts, depth, cur = [], 0, []
    for c in s:
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        if c == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def expand_use(tree, prefix=()):
    """`a::{b, c::d as e, *}` -> [(segments, alias)], alias None for globs."""
    tree = re.sub(r"\s+", " ", tree).strip()
    if tree.startswith("::"):
        tree = tree[2:]
    if "{" in tree:
        head, body = tree.split("{", 1)
        body = body[: body.rfind("}")]
        segs = prefix + tuple(s for s in head.strip().rstrip(":").split("::") if s.strip())
        res = []
        for part in split_top(body):
            res += expand_use(part, segs)
        return res
    alias = None
    m = re.match(r"(.*?)\s+as\s+(\w+)$", tree)
    if m:
        tree, alias = m.group(1), m.group(2)
    segs = prefix + tuple(s.strip() for s in tree.split("::") if s.strip())
    if segs and segs[-1] == "self":
        segs = segs[:-1]
    if segs and segs[-1] == "*":
        return [(segs[:-1], None)]
    if not segs:
        return []
    return [(segs, alias or segs[-1])]


class Crate:
    def __init__(self, root):
        self.root = root
        self.files = {}  # module path (tuple) -> file
        self.code = {}  # file -> stripped, test-free text
        self.children = defaultdict(set)  # module -> child names
        self.items = defaultdict(set)  # module -> names defined there
        self.uses = defaultdict(list)  # module -> [(segments, alias)]
        self.reexports = defaultdict(set)  # module -> names its `pub use` re-exports
        self.code_without_uses = {}
        self.load(("crate",), os.path.join(root, "lib.rs"))

    def load(self, module, path):
        self.files[module] = path
        text, test_mods = drop_test_code(strip(open(path).read()))
        # inline (non-test) modules belong to this file: flatten their items
        self.code[path] = text
        for m in re.finditer(r"(?:#\[path\s*=\s*\"\"\]\s*)?(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text):
            name = m.group(1)
            if name in test_mods:
                continue
            base = os.path.dirname(path) if os.path.basename(path) in ("lib.rs", "mod.rs") else path[:-3]
            for cand in (os.path.join(base, name + ".rs"), os.path.join(base, name, "mod.rs")):
                if os.path.exists(cand):
                    self.children[module].add(name)
                    self.load(module + (name,), cand)
                    break
        for m in re.finditer(r"\bmod\s+(\w+)\s*\{", text):
            self.children[module].add(m.group(1))
            self.files[module + (m.group(1),)] = path
        for m in ITEM.finditer(text):
            self.items[module].add(m.group(1))
        for m in MACRO.finditer(text):
            self.items[module].add(m.group(1))
        for m in re.finditer(r"(\bpub(?:\s*\([^)]*\))?\s+)?\buse\s+([^;]+);", text):
            for segs, alias in expand_use(m.group(2)):
                self.uses[module].append((segs, alias))
                if m.group(1):
                    self.reexports[module].add(alias)
        # a re-exported name counts as used here only if this file's code names it
        self.code_without_uses[path] = re.sub(r"\b(?:use|mod)\s+[^;{]+;", " ", text)

    def file_module(self, module):
        """The module whose file holds `module` (itself, or the parent of an inline one)."""
        while len(module) > 1 and self.files.get(module[:-1]) == self.files[module]:
            module = module[:-1]
        return module

    def absolute(self, module, segs):
        """Turn a path written in `module` into (module, rest) or None when external."""
        if not segs:
            return None
        head = segs[0]
        if head == "crate":
            return ("crate",), segs[1:]
        if head in ("super", "self"):
            cur = module
            while segs and segs[0] in ("super", "self"):
                if segs[0] == "super":
                    cur = cur[:-1]
                segs = segs[1:]
            return cur, segs
        if head in self.children[module]:
            return module, segs
        return None

    def resolve(self, module, segs, seen=None):
        """The file that defines what `segs` (written in `module`) names, or None."""
        seen = seen or set()
        key = (module, segs)
        if key in seen:
            return None
        seen.add(key)
        ab = self.absolute(module, segs)
        if ab is None:
            return None
        cur, rest = ab
        while rest:
            name = rest[0]
            if name in self.children[cur] and cur + (name,) in self.files:
                cur, rest = cur + (name,), rest[1:]
                continue
            home = self.file_module(cur)
            if name in self.items[home]:
                return self.files[cur]
            for usegs, alias in self.uses[home]:
                if alias == name:
                    target = self.resolve(home, usegs + tuple(rest[1:]), seen)
                    return target
            for usegs, alias in self.uses[home]:
                if alias is None:  # glob
                    target = self.resolve(home, usegs + tuple(rest), seen)
                    if target:
                        return target
            return self.files[cur]
        return self.files[cur]

    def names_module(self, module, segs):
        """Whether `segs` (written in `module`) names a module, not an item."""
        ab = self.absolute(module, segs)
        if ab is None:
            return False
        cur = ab[0]
        for s in ab[1]:
            if s in self.children[cur] and cur + (s,) in self.files:
                cur = cur + (s,)
            else:
                return False
        return True

    def edges(self):
        out = defaultdict(lambda: defaultdict(set))
        for module, path in self.files.items():
            if module[:-1] in self.files and self.files[module[:-1]] == path:
                continue  # an inline module: its parent's text covers it
            text = self.code_without_uses[path]  # `use` lines are in self.uses
            names = []
            for segs, alias in self.uses[module]:
                if alias in self.reexports[module] and not re.search(
                    r"(?<![\w:])" + alias + r"\b", self.code_without_uses[path]
                ):
                    continue  # only re-exported: the module's public face, not its code
                names.append((segs, alias))
            for m in re.finditer(r"(?<![\w:])((?:crate|super|self)(?:::\w+)+)", text):
                names.append((tuple(m.group(1).split("::")), None))
            # paths through a module brought in by `use`: `transport::TransportKind`
            aliases = {}
            for segs, alias in self.uses[module]:
                if alias and self.absolute(module, segs):
                    ab = self.absolute(module, segs)
                    cur, ok = ab[0], True
                    for s in ab[1]:
                        if s in self.children[cur] and cur + (s,) in self.files:
                            cur = cur + (s,)
                        else:
                            ok = False
                    if ok:
                        aliases[alias] = segs
            for child in self.children[module]:
                aliases.setdefault(child, (child,))
            for alias, segs in aliases.items():
                for m in re.finditer(r"(?<![\w:])" + alias + r"((?:::\w+)+)", text):
                    names.append((segs + tuple(m.group(1).split("::")[1:]), None))
            for segs, _ in names:
                if self.names_module(module, segs):
                    continue  # `use crate::x;` alone: the items named through it count
                target = self.resolve(module, segs)
                if target and target != path:
                    out[path][target].add("::".join(segs))
        return out


def sccs(nodes, edges):
    index, low, stack, on, result, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            result.append(comp)

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return result


def main():
    global ROOT
    if "--src" in sys.argv:  # another checkout's src/, e.g. a worktree of an older commit
        ROOT = os.path.normpath(os.path.abspath(sys.argv[sys.argv.index("--src") + 1]))
    crate = Crate(ROOT)
    edges = crate.edges()
    rel = lambda p: os.path.relpath(p, os.path.join(ROOT, ".."))
    if "--edges" in sys.argv:
        want = sys.argv[sys.argv.index("--edges") + 1]
        for src, dsts in edges.items():
            if rel(src) == want:
                for dst, why in sorted(dsts.items()):
                    print(f"{rel(dst)}: {', '.join(sorted(why))}")
        return 0
    nodes = set(crate.code)
    graph = {k: set(v) for k, v in edges.items()}
    circles = [sorted(rel(f) for f in c) for c in sccs(nodes, graph) if len(c) > 1]
    print(f"{len(nodes)} library files, {sum(len(v) for v in graph.values())} edges")
    if "--layers" in sys.argv:
        layer = lambda p: os.path.dirname(rel(p)) if os.path.basename(p) != "mod.rs" else os.path.dirname(os.path.dirname(rel(p))) + "/" + os.path.basename(os.path.dirname(p))
        dirs = defaultdict(set)
        for src, dsts in graph.items():
            for dst in dsts:
                a, b = top(rel(src)), top(rel(dst))
                if a != b:
                    dirs[a].add(b)
        print("\nlayer -> layers it imports from")
        for a in sorted(dirs):
            print(f"  {a} -> {', '.join(sorted(dirs[a]))}")
    for c in sorted(circles, key=len, reverse=True):
        print(f"\ncircle of {len(c)} files:")
        for f in c:
            print(f"  {f}")
            src = os.path.join(ROOT, "..", f)
            for dst in sorted(graph.get(os.path.normpath(src), ()) if False else ()):
                pass
        if "--why" in sys.argv:
            members = {os.path.normpath(os.path.join(ROOT, "..", f)) for f in c}
            for s in sorted(members):
                for d, why in sorted(edges.get(s, {}).items()):
                    if d in members:
                        print(f"    {rel(s)} -> {rel(d)}: {', '.join(sorted(why))[:200]}")
    if not circles:
        print("no import circle spans more than one file")
    return 1 if circles else 0


def top(rel_path):
    """`src/executor/stream/mod.rs` -> `executor`; `src/config.rs` -> `config`."""
    parts = rel_path.split("/")[1:]
    return parts[0][:-3] if len(parts) == 1 else parts[0]


if __name__ == "__main__":
    sys.exit(main())
