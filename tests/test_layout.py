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


def test_the_loader_imports_neither_the_writer_nor_the_prep_pipeline():
    """A training process that streams shards: importing the loader must not load the writer,
    the prep pipeline, numba or pyarrow's dataset layer (it took 0.7 s before the first sample)."""
    code = (
        "import sys, torch\n"
        "from shards import GroupDataset, RankInfo\n"
        "heavy = ['shards.writer', 'dataprep.prep', 'dataprep.cost_table', 'numba', "
        "'balancing', 'webdataset']\n"
        "print([m for m in heavy if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
