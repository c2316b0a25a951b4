"""The package's shape: no import cycles (function-level imports included), no private name used across modules,
no module over 500 lines, and the deployable router free of training code. Read from the source with `ast`, so
nothing is imported and every edge is seen, whichever branch would run."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "rivet_jax"
MAX_LINES = 500
TRAINING = {"rivet_jax.train", "rivet_jax.engine", "rivet_jax.stage_run", "rivet_jax.learner", "rivet_jax.losses",
            "rivet_jax.online", "rivet_jax.corpus"}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


DYNAMIC_IMPORTS = {"import_module", "__import__"}  # importlib.import_module(name), __import__(name)


def dynamic_import(node: ast.AST) -> str | None:
    """The module a call `importlib.import_module("...")` / `import_module("...")` / `__import__("...")` names
    (its first argument, if a string literal; "<computed>" if not), else None."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name not in DYNAMIC_IMPORTS:
        return None
    first = node.args[0] if node.args else None
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else "<computed>"


def imported(path: Path) -> list[tuple[str, str | None, int]]:
    """(module, name or None, line) for every import of a rivet_jax module anywhere in the file, dynamic imports
    (`importlib.import_module`, `__import__`) included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (module := dynamic_import(node)) is not None and module.startswith("rivet_jax"):
            found.append((module, None, node.lineno))
        elif isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names if alias.name.startswith("rivet_jax")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("rivet_jax"):
            found += [(node.module, alias.name, node.lineno) for alias in node.names]
    return found


def dependencies(name: str) -> set[str]:
    """The rivet_jax modules importing `name` runs: `from a.b import c` depends on a.b, and on a.b.c if c is one."""
    deps = set()
    for module, member, _ in imported(MODULES[name]):
        if member is not None and f"{module}.{member}" in MODULES:
            deps.add(f"{module}.{member}")
            if module == "rivet_jax":  # the root's own imports are lazy (its __getattr__): `from rivet_jax import
                continue               # deploy` runs no module but deploy
        deps.add(module)
    return deps - {name}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of `graph` as a path that ends where it starts, or None (depth-first, three colours)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_cycles_and_only_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set(), "d": {"d"}}) == ["d", "d"]


def test_every_import_names_a_module_that_exists():
    missing = [f"{MODULES[name].relative_to(REPO)}:{line}: {module}" for name in MODULES
               for module, _, line in imported(MODULES[name]) if module not in MODULES]
    assert not missing, missing


def test_dynamic_imports_are_edges_of_the_graph(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import importlib\nfrom importlib import import_module\n"
                     "def late():\n    importlib.import_module('rivet_jax.online')\n"
                     "    import_module('rivet_jax.train')\n    __import__('rivet_jax.engine')\n"
                     "    importlib.import_module('numpy')\n")
    assert imported(probe) == [("rivet_jax.online", None, 4), ("rivet_jax.train", None, 5),
                               ("rivet_jax.engine", None, 6)]


def test_the_package_imports_nothing_dynamically():
    """Every dependency between the package's modules is an import statement the graph (and a reader) sees."""
    calls = [f"{path.relative_to(REPO)}:{node.lineno}: {dynamic_import(node)}" for path in MODULES.values()
             for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if dynamic_import(node) is not None]
    assert not calls, calls


def test_no_import_cycles():
    graph = {name: dependencies(name) & set(MODULES) for name in MODULES}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def private_uses(path: Path) -> list[str]:
    """`from rivet_jax.x import _y`, and `x._y` where x names a rivet_jax module, in the file at `path`."""
    tree, offences = ast.parse(path.read_text(encoding="utf-8")), []
    modules_here = set()  # local names bound to a rivet_jax module: `from rivet_jax import train [as t]`
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("rivet_jax"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    offences.append(f"{path.name}:{node.lineno}: from {node.module} import {alias.name}")
                if f"{node.module}.{alias.name}" in MODULES:
                    modules_here.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules_here
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            offences.append(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}")
    return offences


def test_the_private_name_check_sees_both_forms(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from rivet_jax.data.schema import _hidden, Episode\nfrom rivet_jax import train as t\n"
                     "t._secret\nt.train\nEpisode.__name__\n")
    assert private_uses(probe) == ["probe.py:1: from rivet_jax.data.schema import _hidden", "probe.py:3: t._secret"]


def test_no_private_name_crosses_a_module_boundary():
    offences = [offence for path in MODULES.values() for offence in private_uses(path)]
    assert not offences, offences


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_is_at_most_500_lines(name):
    lines = len(MODULES[name].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{MODULES[name].relative_to(REPO)} has {lines} lines"


def test_router_imports_no_training_code():
    """The deployable router reads parameters; it never builds an optimizer or touches a training stage."""
    def closure(name: str, seen: set[str]) -> set[str]:
        for dep in dependencies(name) & set(MODULES):
            if dep not in seen:
                seen.add(dep)
                closure(dep, seen)
        return seen

    reached = closure("rivet_jax.router", set())
    training = TRAINING
    assert not reached & training, sorted(reached & training)
    assert not {m for m in reached if m.startswith(("rivet_jax.experiments", "rivet_jax.bench"))}


def test_the_proxy_imports_no_training_code():
    """The serving proxy deploys the router: what it reaches is the router's closure and the data readers."""
    reached: set[str] = set()
    pending = [name for name in MODULES if name.startswith("rivet_jax.serve")]
    while pending:
        for dep in dependencies(pending.pop()) & set(MODULES):
            if dep not in reached:
                reached.add(dep)
                pending.append(dep)
    training = TRAINING
    assert not reached & training, sorted(reached & training)


def test_the_package_root_holds_only_the_method():
    """Experiments and benchmarks live in their own subpackages, not beside the method's modules."""
    root = {p.stem for p in PACKAGE.glob("*.py")}
    assert not root & {"experiments", "mint_experiment", "pipelines", "benchmark", "torch_reference"}, root


PRODUCT = sorted(name for name in MODULES if not name.startswith(("rivet_jax.experiments", "rivet_jax.bench")))


def closure(names, seen: set[str] | None = None) -> set[str]:
    """Every module importing `names` can run (function-level imports included)."""
    seen = set() if seen is None else seen
    for name in names:
        for dep in dependencies(name) & set(MODULES):
            if dep not in seen:
                seen.add(dep)
                closure([dep], seen)
    return seen


def test_the_product_never_imports_the_paper_experiments():
    """Data, encoders, networks, losses, training, deploy, OPE, calibrate, router, serve and the baselines run
    without `rivet_jax.experiments` (the paper's tables and figures)."""
    reached = {m for m in closure(PRODUCT) if m.startswith("rivet_jax.experiments")}
    assert not reached, sorted(reached)


def third_party_imports(path: Path) -> list[tuple[str, int, bool]]:
    """(top-level package, line, at module level) of every import in the file."""
    tree, found = ast.parse(path.read_text(encoding="utf-8")), []
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name.split(".")[0], node.lineno, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module.split(".")[0], node.lineno, id(node) in top))
    return found


def test_matplotlib_is_an_extra_of_the_product():
    """Plots are optional for the product: only `rivet_jax.plots` imports matplotlib, and only inside a function."""
    offences = [f"{MODULES[name].relative_to(REPO)}:{line}" for name in PRODUCT
                for package, line, module_level in third_party_imports(MODULES[name])
                if package == "matplotlib" and (name != "rivet_jax.plots" or module_level)]
    assert not offences, offences
