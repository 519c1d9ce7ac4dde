"""The house's import contracts (STYLE.md, "The shape of the house"), checked on the source.

Rooms and the arrows between them (an arrow is "may import"):

    core (gyre/, incl. gyre/formats, gyre/trajectory)  <- sim, real, analysis, paper_figs
    analysis -> sim         (the theorem check runs simulations)
    real     -> analysis    (a real run draws its own pictures)
    sim  and real never import each other; nothing imports paper_figs.

Purity: the policy core (``gyre/*.py``) and the trajectory package
(``gyre/trajectory``) do no I/O: they import no file, process, thread, network
or plotting module and never call ``open``. ``gyre/formats`` is the one place
in ``gyre`` that reads and writes tables. Heavy stacks (torch, Megatron,
SGLang, Mooncake, Ray, aiohttp, transformers) are imported only under
``real/``. Every package folder is listed in pyproject.toml.

Arrows hold transitively too: a module may not *reach* a room its own room may
not import through a chain of imports (real -> analysis -> sim is a break, although
each arrow alone is allowed). Importing ``a.b.c`` also runs ``a`` and ``a.b``;
lazy imports count. The one chain allowed is listed in ``BRIDGES`` with its reason.

A *seam* is one import across the arrows that the design wants: it is listed in
``SEAMS`` (importing module, imported module) with its reason, so it is a visible,
checked exception rather than an import by name the checker cannot see.

Each rule is checked by ``violations(room, path, source)`` and
``chain_violations(sources)``, which the tests also feed hand-made sources to,
so a broken checker fails here too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROOMS = {"gyre": "core", "sim": "sim", "real": "real", "analysis": "analysis", "paper_figs": "paper_figs"}
ALLOWED = {
    "core": {"core"},
    "sim": {"core", "sim"},
    "real": {"core", "real", "analysis"},
    "analysis": {"core", "sim", "analysis"},
    "paper_figs": {"core", "sim", "analysis", "paper_figs"},
}
IO_MODULES = {"os", "pathlib", "io", "shutil", "tempfile", "threading", "multiprocessing", "subprocess",
              "socket", "asyncio", "concurrent", "urllib", "http", "matplotlib", "simpy", "csv", "sqlite3"}
HEAVY_MODULES = {"torch", "megatron", "sglang", "mooncake", "ray", "aiohttp", "transformers", "tokenizers",
                 "safetensors", "mbridge"}


def room_of_module(name: str) -> str | None:
    """The room a ``gyre...`` module name lives in (None for anything outside the project)."""
    parts = name.split(".")
    if parts[0] != "gyre":
        return None
    if len(parts) > 1 and parts[1] in ("sim", "real", "analysis", "paper_figs"):
        return ROOMS[parts[1]]
    return "core"


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) for every import in a module, at any depth (lazy imports count)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names
                    if node.module in ("gyre", "gyre.sim", "gyre.real", "gyre.analysis")]
    return out


def pure(path: Path) -> bool:
    rel = path.relative_to(ROOT).parts
    return rel[0] == "gyre" and (len(rel) == 2 or rel[1] == "trajectory")


def violations(room: str, path: Path, source: str) -> list[str]:
    tree = ast.parse(source)
    found = []
    seams = {target for importer, target in SEAMS if importer == module_name(path)}
    for line, module in imported_modules(tree):
        target = room_of_module(module)
        top = module.split(".")[0]
        if target is not None and target not in ALLOWED[room] and module not in seams:
            found.append(f"{path}:{line}: {room} imports {module} ({target})")
        if top in HEAVY_MODULES and room != "real":
            found.append(f"{path}:{line}: heavy module {module} imported outside real/")
        if pure(path) and top in IO_MODULES:
            found.append(f"{path}:{line}: pure module imports {module}")
    if pure(path):
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open":
                found.append(f"{path}:{node.lineno}: pure module calls open()")
    return found


#: modules through which a room may reach one it may not import, and why
BRIDGES = {
    "gyre.analysis.sim_vs_real": "a finished real run writes its comparison with the simulator's prediction "
                                 "(lazy import in the job's last step)",
}
#: (importing module, imported module) -> why this one import crosses the arrows (a lazy import in both cases)
SEAMS = {
    ("gyre.analysis.plan", "gyre.real.cluster.task_map"):
        "gyre plan/sweep --ray run their simulations as Ray tasks; Ray placement lives with the real backend "
        "and imports Ray only when a mapper is made",
}
PACKAGE_FOLDERS = {"gyre.sim": "sim", "gyre.real": "real", "gyre.analysis": "analysis", "gyre.paper_figs": "paper_figs"}


def module_name(path: Path) -> str:
    """The import name of a project file: sim/driver.py -> gyre.sim.driver."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    heads = {folder: package for package, folder in PACKAGE_FOLDERS.items()}
    return ".".join([heads.get(parts[0], "gyre"), *parts[1:]])


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """Module -> the project modules its imports run (parent packages included)."""
    graph: dict[str, set[str]] = {}
    for name, source in sources.items():
        named = []
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                named += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                named += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        parts = {".".join(n.split(".")[:i]) for n in named for i in range(1, n.count(".") + 2)}
        graph[name] = {m for m in parts if m in sources and m != name}
    return graph


def chain_violations(sources: dict[str, str]) -> list[str]:
    """Every module that reaches a room it may not import, with the shortest chain that does."""
    graph, found = import_graph(sources), []
    for origin in sorted(graph):
        room = room_of_module(origin)
        came_from: dict[str, str | None] = {origin: None}
        queue, reported = [origin], set()
        while queue:
            module = queue.pop(0)
            for dep in sorted(graph[module] - came_from.keys() - _seam_targets(module)):
                came_from[dep] = module
                target = room_of_module(dep)
                if target not in ALLOWED[room] and target not in reported:
                    reported.add(target)
                    chain, step = [dep], module
                    while step is not None:
                        chain.append(step)
                        step = came_from[step]
                    found.append(f"{' -> '.join(reversed(chain))}: {room} reaches {target}")
                if dep not in BRIDGES:
                    queue.append(dep)
    return found


def _seam_targets(module: str) -> set[str]:
    """What ``module`` may import across the arrows (``SEAMS``), with the packages importing it runs."""
    targets = {target for importer, target in SEAMS if importer == module}
    return {".".join(t.split(".")[:i]) for t in targets for i in range(2, t.count(".") + 2)}


def project_modules() -> list[tuple[str, Path]]:
    return [(room, path) for folder, room in ROOMS.items() for path in sorted((ROOT / folder).rglob("*.py"))]


def test_every_module_keeps_its_rooms_contracts():
    problems = [v for room, path in project_modules() for v in violations(room, path, path.read_text())]
    assert not problems, "\n".join(problems)


def test_no_module_reaches_a_forbidden_room_through_a_chain():
    sources = {module_name(path): path.read_text() for _, path in project_modules()}
    assert "gyre.sim.driver" in sources and "gyre.real.runtime.job" in sources
    problems = chain_violations(sources)
    assert not problems, "\n".join(problems)


def test_the_chain_checker_catches_a_planted_transitive_break():
    planted = {
        "gyre.real.runtime.job": "from gyre.analysis import plots\n",  # real -> analysis: allowed
        "gyre.analysis.plots": "def f():\n    import gyre.sim.runner\n",  # analysis -> sim: allowed
        "gyre.sim.runner": "from gyre import scheduler\n",
        "gyre.scheduler": "",
    }
    direct = [v for name, source in planted.items()
              for v in violations(room_of_module(name) or "", ROOT / "x.py", source)]
    assert direct == []  # each arrow alone is allowed
    assert chain_violations(planted) == [
        "gyre.real.runtime.job -> gyre.analysis.plots -> gyre.sim.runner: real reaches sim"]


def test_the_chain_checker_follows_parent_packages_and_stops_at_a_bridge():
    via_package = {"gyre.real.a": "import gyre.analysis.b\n", "gyre.analysis": "from gyre.sim import c\n",
                   "gyre.analysis.b": "", "gyre.sim": "", "gyre.sim.c": ""}
    assert chain_violations(via_package) == ["gyre.real.a -> gyre.analysis -> gyre.sim: real reaches sim"]
    bridged = {"gyre.real.a": "from gyre.analysis.sim_vs_real import w\n",
               "gyre.analysis.sim_vs_real": "import gyre.sim.c\n", "gyre.sim.c": ""}
    assert chain_violations(bridged) == []
    assert chain_violations({**bridged, "gyre.analysis.sim_vs_real": "import gyre.sim.c\nimport gyre.real.a\n"}) == [
        "gyre.analysis.sim_vs_real -> gyre.real.a: analysis reaches real"]


def test_a_declared_seam_is_the_only_import_across_the_arrows_it_allows():
    seam = "def f():\n    from gyre.real.cluster.task_map import ray_mapper\n"
    assert violations("analysis", ROOT / "analysis/plan.py", seam) == []
    assert violations("analysis", ROOT / "analysis/sweep.py", seam)  # another module: a break
    other = "def f():\n    from gyre.real.cluster.launch import x\n"
    assert violations("analysis", ROOT / "analysis/plan.py", other)  # another target: a break
    sources = {"gyre.analysis.sweep": "from gyre.analysis.plan import evaluation_mapper\n",
               "gyre.analysis.plan": seam, "gyre.real": "", "gyre.real.cluster": "",
               "gyre.real.cluster.task_map": "", "gyre.real.cluster.launch": ""}
    assert chain_violations(sources) == []
    sources["gyre.analysis.plan"] = seam + "import gyre.real.cluster.launch\n"
    assert chain_violations(sources) == [
        "gyre.analysis.plan -> gyre.real.cluster.launch: analysis reaches real",
        "gyre.analysis.sweep -> gyre.analysis.plan -> gyre.real.cluster.launch: analysis reaches real"]


@pytest.mark.parametrize("room, relpath, source, expected", [
    ("core", "gyre/scheduler.py", "from gyre.sim.driver import Simulation\n", "core imports gyre.sim.driver"),
    ("core", "gyre/scheduler.py", "def f():\n    import gyre.real.runtime.job\n", "core imports gyre.real"),
    ("sim", "sim/driver.py", "from gyre.real import runtime\n", "sim imports gyre.real.runtime"),
    ("real", "real/runtime/job.py", "from gyre.sim.runner import run_simulation\n", "real imports gyre.sim"),
    ("analysis", "analysis/runs.py", "import torch\n", "heavy module torch"),
    ("core", "gyre/trajectory/tree.py", "import threading\n", "pure module imports threading"),
    ("core", "gyre/scheduler.py", "x = open('f').read()\n", "pure module calls open()"),
    ("core", "gyre/trajectory/groups.py", "from pathlib import Path\n", "pure module imports pathlib"),
])
def test_the_checker_catches_each_kind_of_break(room, relpath, source, expected):
    found = violations(room, ROOT / relpath, source)
    assert any(expected in v for v in found), found


def test_formats_may_touch_files_but_the_core_may_not():
    assert violations("core", ROOT / "gyre/formats/eventlog.py", "import csv\nopen('x')\n") == []
    assert violations("core", ROOT / "gyre/loop.py", "import csv\n")


def test_every_package_is_listed_in_pyproject():
    text = (ROOT / "pyproject.toml").read_text()
    listed = set(re.findall(r'"(gyre(?:\.[a-z_]+)*)"', text.split("packages = [", 1)[1].split("]", 1)[0]))
    folders = {"gyre": "gyre", "sim": "gyre.sim", "real": "gyre.real", "analysis": "gyre.analysis",
               "paper_figs": "gyre.paper_figs"}
    found = {folders[init.relative_to(ROOT).parts[0]] + "".join("." + p for p in init.relative_to(ROOT).parts[1:-1])
             for folder in folders for init in (ROOT / folder).rglob("__init__.py")}
    assert found == listed


def test_real_has_rooms_not_loose_modules():
    loose = sorted(p.name for p in (ROOT / "real").glob("*.py") if p.name != "__init__.py")
    assert loose == []
