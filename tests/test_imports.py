"""No import cycles in trainer_backend/ or gui/, function-local imports included: the graph is built
from the sources (relative imports resolved; importing a.b.c imports the packages a and a.b).
Imports under `if TYPE_CHECKING:` never run and are left out."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def modules() -> dict[str, tuple[Path, bool]]:
    found = {}
    for pkg in ("trainer_backend", "gui"):
        for p in (ROOT / pkg).rglob("*.py"):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_pkg else parts)] = (p, is_pkg)
    return found


def _runtime_nodes(tree: ast.AST):
    """Every node but those inside `if TYPE_CHECKING:` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph() -> dict[str, set[str]]:
    mods = modules()

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, (path, is_pkg) in mods.items():
        for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[:len(base) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in mods else source for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for target in targets:
                target = known(target)
                if not target:
                    continue
                parts = target.split(".")
                for i in range(1, len(parts) + 1):  # the packages on the way are imported too
                    step = ".".join(parts[:i])
                    if step in mods and step != mod and not mod.startswith(step + "."):
                        graph[mod].add(step)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_function_local_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    # and the real graph sees function-local imports: the loop imports the plan inside train()
    assert "trainer_backend.launch.plan" in import_graph()["trainer_backend.training.loop"]


def test_the_launcher_process_imports_no_torch():
    """`trainer_backend launch` only checks the config and starts `accelerate launch`: importing torch
    there would add seconds to every run's start (the trainer process imports it anyway)."""
    import subprocess
    import sys
    code = ("import sys, trainer_backend.__main__, trainer_backend.config.checks, trainer_backend.methods.checks, "
            "trainer_backend.launch.argv, trainer_backend.run.stop_signals, trainer_backend.run.run_folder; "
            "print(sorted(m for m in ('torch', 'diffusers', 'transformers') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]", r.stdout


def test_packages_are_layered_below_the_loop():
    """training/ imports methods/, methods/ imports diffusion/ and compute/, never back: the shared pieces
    (loss, sampling, validation, devices, low-bit weights) have one home below both (DEVELOPERS.md)."""
    graph = import_graph()
    lower = {"trainer_backend.methods": {"trainer_backend.training"},
             "trainer_backend.diffusion": {"trainer_backend.training", "trainer_backend.methods"},
             "trainer_backend.compute": {"trainer_backend.training", "trainer_backend.methods",
                                         "trainer_backend.diffusion"}}
    wrong = [f"{mod} imports {target}" for mod, targets in graph.items() for pkg, banned in lower.items()
             if mod == pkg or mod.startswith(pkg + ".")
             for target in targets for b in banned if target == b or target.startswith(b + ".")]
    assert not wrong, "\n".join(sorted(wrong))
