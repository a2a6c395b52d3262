"""The package layout shows the architecture, and imports keep to it.

``trainer_adapter``'s top level is the model-agnostic core; ``trainer_adapter.hf`` (Hugging Face
models) and ``trainer_adapter.train`` (the reference pipelined trainer) are wings built on it: a
wing never imports the other wing, and the core imports neither (its package ``__init__`` only
re-exports them). Every import statement counts, those inside functions too. The vision policies
are one module per family behind one registry, and the numba kernels one module per algorithm.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TA = REPO / "trainer_adapter"
WINGS = ("trainer_adapter.hf", "trainer_adapter.train")


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module imported) of every import in ``path``; ``from P import name`` gives
    ``P.name`` too, so importing a wing as a name of its parent is seen."""
    this = _module_name(path)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            out.append((node.lineno, base))
            out += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return out


def _wing_exports() -> dict[str, str]:
    """Names the package re-exports from a wing -> that wing (``from trainer_adapter import
    balance_model`` in the core is an import of the HF wing)."""
    out = {}
    for wing in WINGS:
        init = REPO / wing.replace(".", "/") / "__init__.py"
        for node in ast.parse(init.read_text()).body:
            if isinstance(node, ast.Assign) and node.targets[0].id == "__all__":
                out.update(dict.fromkeys(ast.literal_eval(node.value), wing))
    return out


def _wing_of(module: str, exports: dict[str, str]) -> str | None:
    for wing in WINGS:
        if module == wing or module.startswith(wing + "."):
            return wing
    head, _, name = module.rpartition(".")
    if head == "trainer_adapter" and name in exports:
        return exports[name]
    return None


def _violations(files, allowed: set[str | None], exports) -> list[str]:
    bad = []
    for path in files:
        for line, module in _imports(path):
            wing = _wing_of(module, exports)
            if wing not in allowed:
                bad.append(f"{path.relative_to(REPO)}:{line} imports {module} ({wing})")
    return bad


def test_the_core_imports_no_wing():
    core = [p for p in TA.glob("*.py") if p.name != "__init__.py"]
    assert len(core) >= 5
    assert _violations(core, {None}, _wing_exports()) == []


@pytest.mark.parametrize("wing", WINGS)
def test_a_wing_never_imports_the_other(wing):
    files = sorted((REPO / wing.replace(".", "/")).rglob("*.py"))
    assert files
    assert _violations(files, {None, wing}, _wing_exports()) == []


def test_the_checker_sees_every_form_of_import(tmp_path, monkeypatch):
    """Planted: each way a core module could reach a wing is reported."""
    forms = [
        "import trainer_adapter.hf.balance",
        "from trainer_adapter.train import Trainer",
        "from trainer_adapter import hf",
        "from trainer_adapter import balance_model",
        "from .train.model import VLMConfig",
        "def f():\n    from trainer_adapter.hf.inputs import HFPacker",
    ]
    exports = _wing_exports()
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (tmp_path / "trainer_adapter").mkdir()
    for i, form in enumerate(forms):
        path = tmp_path / "trainer_adapter" / f"core{i}.py"
        path.write_text(form + "\n")
        assert _violations([path], {None}, exports), form
    clean = tmp_path / "trainer_adapter" / "clean.py"
    clean.write_text("from trainer_adapter.exchange import gather_tables\nimport torch\n")
    assert _violations([clean], {None}, exports) == []


def test_every_policy_module_is_registered():
    """One module per vision-policy family, each reachable by name through the registry."""
    from dataprep.policies import POLICIES, parse_vision_policy

    registered = {f.cls.__module__ for f in POLICIES.values()}
    modules = {
        _module_name(p)
        for p in (REPO / "dataprep" / "policies").glob("*.py")
        if p.stem not in ("__init__", "base", "registry", "fixed")
    }
    assert modules == registered
    for name, family in POLICIES.items():
        assert isinstance(parse_vision_policy(name), family.cls)


def test_kernel_modules_hold_only_kernels():
    """``balancing._kernels`` modules import numpy, numba and each other only (no balancing
    logic inside the kernels), and the package re-exports every kernel."""
    import balancing._kernels as kernels

    defined = set()
    for path in (REPO / "balancing" / "_kernels").glob("*.py"):
        for _, module in _imports(path):
            top = module.split(".")[0]
            assert top in ("numpy", "numba", "__future__") or module.startswith(
                "balancing._kernels"
            ), f"{path.name} imports {module}"
        tree = ast.parse(path.read_text())
        defined |= {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert defined <= set(kernels.__all__)


@pytest.mark.parametrize("pkg", ["dataprep", "shards"])
def test_every_public_name_resolves_to_its_module(pkg):
    """The packages import their names on first use: each name of ``__all__`` has an entry,
    and each entry gives the object of the module it names (a wrong module fails here)."""
    mod = importlib.import_module(pkg)
    assert sorted(mod.__all__) == sorted(mod._LAZY)
    for name, where in mod._LAZY.items():
        assert getattr(mod, name) is getattr(importlib.import_module(where), name), name


def test_balancing_names_resolve_and_the_runtime_balancer_loads_no_planner():
    """``balancing`` imports its runtime balancer now and every other name on first use: each
    name of ``__all__`` is the object of its module (``post_balance`` the function, even after
    its submodule of the same name was imported again), and a training process that takes the
    runtime names loads neither the offline planner nor pyarrow (0.09 s of its first plan)."""
    code = (
        "import sys, importlib, balancing\n"
        "from balancing import post_balance, nodewise_permutation, locality_balance, prewarm\n"
        "heavy = ['balancing.plan', 'balancing.cost_model', 'equishard.contracts.cost_table', "
        "'pyarrow', 'pandas', 'scipy.optimize']\n"
        "print([m for m in heavy if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
    import balancing

    eager = set(balancing.__all__) - set(balancing._LAZY)
    assert eager == {"METHODS", "MemoryCapError", "PostBalance", "batch_loads", "post_balance"}
    for name in balancing.__all__:
        where = balancing._LAZY.get(name, "balancing.post_balance")
        assert getattr(balancing, name) is getattr(importlib.import_module(where), name), name
    assert callable(balancing.post_balance) and balancing.post_balance.__name__ == "post_balance"


def test_the_loader_imports_neither_the_writer_nor_the_prep_pipeline():
    """A training process that streams shards: importing the loader must not load the writer,
    the prep pipeline, numba or pyarrow's dataset layer (it took 0.7 s before the first sample)."""
    code = (
        "import sys, torch\n"
        "from shards import GroupDataset, RankInfo\n"
        "heavy = ['shards.write.writer', 'dataprep.prep', 'equishard.contracts.cost_table', 'numba', "
        "'balancing', 'webdataset']\n"
        "print([m for m in heavy if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


# -- the floors: the ground floor and the contracts under every stage ---------------------------

FLOOR = ("equishard.common", "equishard.contracts")
# each package -> what its modules may import (itself, and what lies below it); the command line
# (equishard.cli) stands on everything and is not listed
BELOW = {
    "equishard.common": (),
    "equishard.contracts": ("equishard.common",),
    "dataprep": FLOOR,
    "balancing": FLOOR,
    "shards": (*FLOOR, "dataprep", "balancing"),
    "trainer_adapter": (*FLOOR, "dataprep", "balancing", "shards"),
}
PRODUCT = ("equishard", "dataprep", "balancing", "shards", "trainer_adapter")


def _package_of(module: str) -> str | None:
    """The floor or stage ``module`` belongs to (``equishard.cli`` and the bare ``equishard``
    package are the command line's; None: not equishard's)."""
    for name in (*FLOOR, "equishard.cli", "dataprep", "balancing", "shards", "trainer_adapter"):
        if module == name or module.startswith(name + "."):
            return name
    return "equishard.cli" if module.split(".")[0] == "equishard" else None


def _floor_violations(files) -> list[str]:
    bad = []
    for path in files:
        mine = _package_of(_module_name(path))
        for line, module in _imports(path):
            theirs = _package_of(module)
            if theirs not in (None, mine, *BELOW[mine]):
                bad.append(f"{path.relative_to(REPO)}:{line} imports {module} ({theirs})")
    return bad


def _product_files(package: str):
    return sorted((REPO / package.replace(".", "/")).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(BELOW))
def test_each_package_imports_only_itself_and_what_lies_below(package):
    """The ground floor (value checks, local files, workers, Ray, the error base) and the
    contracts import no stage; balancing stands on the floor only (before, it imported prep's
    value checks and file reading, so a reader concluded that balancing depends on prep); a stage
    never imports one above it."""
    files = _product_files(package)
    if package == "equishard.contracts" and not files:
        pytest.skip("no contracts package yet")
    assert files
    assert _floor_violations(files) == []


def test_the_floor_checker_sees_an_import_running_up(tmp_path, monkeypatch):
    """Planted: a balancing module importing prep's helpers, the floor importing a stage, and a
    stage importing the command line are each reported; floor imports are not."""
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    cases = {
        "balancing/a.py": "from dataprep.values import check_count\n",
        "equishard/common/b.py": "def f():\n    import shards.read.reader\n",
        "dataprep/c.py": "from equishard.cli import main\n",
        "shards/d.py": "from trainer_adapter import exchange\n",
        "equishard/contracts/e.py": "from balancing.plan import PLAN\n",
    }
    for rel, code in cases.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)
        assert _floor_violations([path]), rel
    ok = tmp_path / "shards" / "ok.py"
    ok.write_text("from equishard.common.values import check_count\nimport dataprep.records\n")
    assert _floor_violations([ok]) == []


def _import_graph() -> dict[str, set[str]]:
    """module -> the product modules it imports (any import statement, those under
    ``TYPE_CHECKING`` too: a circle there is a circle in the design)."""
    paths = {_module_name(p): p for pkg in PRODUCT for p in _product_files(pkg)}
    graph = {}
    for name, path in paths.items():
        deps = set()
        for _, module in _imports(path):
            parts = module.split(".")
            for k in range(len(parts), 0, -1):
                target = ".".join(parts[:k])
                if target in paths:
                    # a module importing its own package's __init__ is how Python runs it
                    if target != name and not name.startswith(target + "."):
                        deps.add(target)
                    break
        graph[name] = deps
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
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
    return out


def test_no_two_modules_import_each_other():
    """No circle of imports anywhere in the product (``shards.store.manifest`` and
    ``shards.manifest_structure`` imported each other)."""
    assert _circles(_import_graph()) == []


def test_the_circle_finder_finds_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"} - {"e"}}
    assert _circles(graph) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def _error_classes() -> dict[str, tuple[str, list[str]]]:
    """Every class the product defines whose bases name an exception: name -> (where, bases)."""
    import builtins

    out = {}
    for pkg in PRODUCT:
        for path in _product_files(pkg):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    bases = [ast.unparse(b).rpartition(".")[2] for b in node.bases]
                    out[node.name] = (f"{path.relative_to(REPO)}:{node.lineno}", bases)
    errors = {}

    def is_error(name, seen=()):
        b = getattr(builtins, name, None)
        if isinstance(b, type) and issubclass(b, BaseException):
            return True
        return (
            name in out
            and name not in seen
            and any(is_error(x, (*seen, name)) for x in out[name][1])
        )

    for name, (where, bases) in out.items():
        if any(is_error(b) for b in bases):
            errors[name] = (where, bases)
    return errors


def test_every_error_derives_from_the_one_base():
    """One base class, ``EquishardError``, under every error equishard raises on purpose, so a
    caller catches them all at once (there were 12 classes with no common base)."""
    from equishard.common.errors import EquishardError

    errors = _error_classes()
    assert len(errors) >= 12
    modules = {}
    for name, (where, _) in errors.items():
        path = where.split(":")[0]
        modules[name] = importlib.import_module(_module_name(REPO / path))
    for name, module in modules.items():
        cls = getattr(module, name)
        if cls is EquishardError:
            continue
        assert issubclass(cls, EquishardError), f"{errors[name][0]}: {name}"


# -- inside shards: one subpackage per concern, each standing on those before it ------------------

SHARDS_BELOW = {
    "format": (),
    "store": ("format",),
    "read": ("format", "store"),
    "write": ("format", "store", "read"),
    "nightly": ("format", "store", "read", "write"),
}
SHARDS_SHIMS = ("shards.manifest", "shards.energon", "shards.hf_datasets", "shards.prep_settings")


def _shards_violations(files) -> list[str]:
    bad = []
    for path in files:
        mine = _module_name(path).split(".")[1]
        for line, module in _imports(path):
            parts = module.split(".")
            if parts[0] != "shards" or len(parts) < 2:
                continue
            if ".".join(parts[:2]) in SHARDS_SHIMS:
                bad.append(f"{path.relative_to(REPO)}:{line} imports {module} (a 0.1 shim)")
            elif parts[1] in SHARDS_BELOW and parts[1] not in (mine, *SHARDS_BELOW[mine]):
                bad.append(f"{path.relative_to(REPO)}:{line} imports {module} ({parts[1]})")
    return bad


@pytest.mark.parametrize("sub", sorted(SHARDS_BELOW))
def test_shards_is_split_by_concern_and_no_import_runs_back_up(sub):
    """``shards/`` was one flat room of 33 files holding five concerns; now format < store <
    read < write < nightly (and ``shards.errors`` under all), and no product module imports a
    shim kept for equishard 0.1's paths."""
    files = _product_files(f"shards.{sub}")
    assert files
    assert _shards_violations(files) == []
    if sub == "nightly":  # the shims: nothing of the product goes through them
        every = [p for pkg in PRODUCT for p in _product_files(pkg)]
        shims = {REPO / (s.replace(".", "/") + ".py") for s in SHARDS_SHIMS}
        used = [
            f"{p.relative_to(REPO)}:{line}"
            for p in every
            if p not in shims
            for line, m in _imports(p)
            if ".".join(m.split(".")[:2]) in SHARDS_SHIMS
        ]
        assert used == []


def test_the_shards_checker_sees_an_import_running_up(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    for rel, code in {
        "shards/store/a.py": "from shards.write.writer import write_generation\n",
        "shards/format/b.py": "def f():\n    import shards.read.reader\n",
        "shards/read/c.py": "from shards.manifest import open_generation\n",
    }.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)
        assert _shards_violations([path]), rel
    ok = tmp_path / "shards" / "write" / "ok.py"
    ok.parent.mkdir(parents=True, exist_ok=True)
    ok.write_text(
        "from shards.store.publish import CURRENT\nfrom shards.errors import WriteError\n"
    )
    assert _shards_violations([ok]) == []
