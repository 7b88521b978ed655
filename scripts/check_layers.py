#!/usr/bin/env python3
"""Checks the layering of kvidx's C sources from their #include lines.

Layers, lowest first; a file may include its own layer and the ones below,
never one above:

    lib/                 libkvidx: pure C, no I/O, no daemon library
    daemon/util/         config, log, sd_notify, metrics, JSON reader/writer
    daemon/net/          server, connections, HTTP request/response, router
    daemon/state/        key store, prefetch glue, layouts, persistence
    daemon/sources/      outside stores that feed the key store
    daemon/api/          one handler file per resource
    daemon/ (top)        main.c and app.c: the composition root

Also fails on an include cycle between modules (a module is a .c and the
.h of the same name in the same folder), on lib/ including uv.h, llhttp.h,
cJSON.h or hiredis.h, and on a source file of more than 900 lines.

Usage: scripts/check_layers.py [ROOT]   (default: the repository root)
Prints one line per problem and a summary; exits 1 when there is any.
"""
import os
import re
import sys

MAX_LINES = 900
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
DAEMON_LIBS = re.compile(r'^\s*#\s*include\s*<(uv|llhttp|cjson/cJSON|cJSON|hiredis/[^>]+|hiredis)\.h>', re.M)
LAYERS = [
    ("lib/", 0),
    ("daemon/util/", 1),
    ("daemon/net/", 2),
    ("daemon/state/", 3),
    ("daemon/sources/", 3),
    ("daemon/api/", 4),
    ("daemon/", 5),
]


def layer(path):
    for prefix, rank in LAYERS:
        if path.startswith(prefix):
            return prefix, rank
    return None, None


def sources(root):
    out = {}
    for top in ("lib", "daemon"):
        for d, _, names in os.walk(os.path.join(root, top)):
            for n in names:
                if n.endswith((".c", ".h")):
                    p = os.path.relpath(os.path.join(d, n), root)
                    with open(os.path.join(root, p), encoding="utf-8", errors="replace") as f:
                        out[p] = f.read()
    return out


def resolve(files, src, inc):
    """The file an include names: next to the includer, then from daemon/
    (the daemon's include root), then from lib/include/."""
    for base in (os.path.dirname(src), "daemon", "lib/include", "lib"):
        p = os.path.normpath(os.path.join(base, inc))
        if p in files:
            return p
    return None


def cycles(edges):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
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
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def check(root):
    files = sources(root)
    problems = []
    edges = {}
    for src, text in sorted(files.items()):
        src_layer, src_rank = layer(src)
        for inc in INCLUDE.findall(text):
            dst = resolve(files, src, inc)
            if dst is None:
                continue  # a system or generated header
            dst_layer, dst_rank = layer(dst)
            if src_rank is not None and dst_rank is not None and dst_rank > src_rank:
                problems.append(f"upward include: {src} ({src_layer}) includes {dst} ({dst_layer})")
            a, b = os.path.splitext(src)[0], os.path.splitext(dst)[0]
            if a != b:
                edges.setdefault(a, set()).add(b)
        if src.startswith("lib/") and DAEMON_LIBS.search(text):
            problems.append(f"lib includes a daemon library: {src}")
        n = text.count("\n")
        if n > MAX_LINES:
            problems.append(f"{src}: {n} lines (more than {MAX_LINES})")
    for comp in cycles(edges):
        problems.append("include cycle: " + " <-> ".join(comp))
    return files, problems


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    files, problems = check(os.path.abspath(root))
    for p in problems:
        print(p)
    print(f"layers: {len(problems)} problem(s) in {len(files)} source files")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
