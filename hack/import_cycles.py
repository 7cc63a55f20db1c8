"""No import cycle between modules (``make lint``): function-level (lazy) imports count, TYPE_CHECKING ones do not.

import-linter's layers catch cycles only where a layers contract applies and only between layers; this
checks every module of the packages we own, with the graph import-linter builds (grimp). A cycle is
printed with the line of each import in it; the exit status is 1 if there is any.
"""

from __future__ import annotations

import sys

import grimp

PACKAGES = ("agentrun", "agentrun_operator", "agentrun_history", "agentrun_dev", "kubesim")


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    edges = {m: sorted(graph.find_modules_directly_imported_by(m) - {m}) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, position = work.pop()
            if position == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            targets = edges.get(node, [])
            if position < len(targets):
                work.append((node, position + 1))
                target = targets[position]
                if target not in index:
                    work.append((target, 0))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def main() -> int:
    """Print each cycle with its imports; 1 if there is one."""
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True, cache_dir=None)
    found = cycles(graph)
    for component in found:
        print("import cycle: " + " <-> ".join(component))
        for importer in component:
            for imported in sorted(graph.find_modules_directly_imported_by(importer) & set(component)):
                lines = ", ".join(
                    str(d["line_number"]) for d in graph.get_import_details(importer=importer, imported=imported)
                )
                print(f"  {importer} -> {imported} (line {lines})")
    print(f"{len(found)} import cycles among {len(graph.modules)} modules")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
