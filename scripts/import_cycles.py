#!/usr/bin/env python3
"""Import circles among a crate's modules, and among ebpf/'s files.

Rust: an edge A -> B when a file of top-level module A names `crate::B` (in a `use` or a
path); a module's own submodules count as the module, and the crate root (lib.rs, main.rs)
is left out: it declares every module. ebpf/: an edge A -> B for `#include "B"`.
Prints every circle (strongly connected set of two or more) and exits 1 if there is one.
Run: scripts/import_cycles.py [CRATE_DIR ...]   (default: format record analyze inspect)
"""
import os
import re
import sys


def rust_graph(src):
    graph = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), src)
            top = rel.split(os.sep)[0].removesuffix(".rs")
            if top in ("lib", "main"):
                continue
            text = open(os.path.join(dirpath, f), encoding="utf-8").read()
            for m in re.finditer(r"\bcrate::([a-z_][a-z0-9_]*)", text):
                if m.group(1) != top:
                    graph.setdefault(top, set()).add(m.group(1))
            # `use crate::{a, b::c}` groups.
            for m in re.finditer(r"use crate::\{([^}]*)\}", text):
                for name in re.findall(r"(?:^|,)\s*([a-z_][a-z0-9_]*)", m.group(1)):
                    if name != top:
                        graph.setdefault(top, set()).add(name)
            graph.setdefault(top, set())
    modules = set(graph)
    return {a: {b for b in bs if b in modules} for a, bs in graph.items()}


def c_graph(src):
    graph = {}
    for f in os.listdir(src):
        if f.endswith((".h", ".c")):
            text = open(os.path.join(src, f), encoding="utf-8").read()
            graph[f] = set(re.findall(r'#include\s+"([^"]+)"', text))
    return {a: {b for b in bs if b in graph} for a, bs in graph.items()}


def circles(graph):
    """Tarjan's strongly connected components of two or more nodes."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
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
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    crates = sys.argv[1:] or ["format", "record", "analyze", "inspect"]
    found = False
    for crate in crates:
        graph = rust_graph(os.path.join(root, crate, "src"))
        for c in circles(graph):
            found = True
            print(f"{crate}/src: circle among {', '.join(c)}")
        print(f"{crate}/src: {len(graph)} modules, {sum(map(len, graph.values()))} imports")
    graph = c_graph(os.path.join(root, "ebpf"))
    for c in circles(graph):
        found = True
        print(f"ebpf: circle among {', '.join(c)}")
    print(f"ebpf: {len(graph)} files, {sum(map(len, graph.values()))} includes")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
