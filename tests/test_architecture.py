"""The import contracts of ARCHITECTURE.md (import-linter, configured in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_hold() -> None:
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint_imports, "import-linter is not installed in this environment"
    result = subprocess.run([lint_imports], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_api_process_never_loads_torch_or_onnx() -> None:
    code = (
        "import sys, api.main; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'onnx', 'onnxruntime', 'quantcore'}); "
        "print(','.join(bad)); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, f"the API process imported: {result.stdout.strip()} {result.stderr[-2000:]}"


def _stage_layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [layers] = [c for c in config["tool"]["importlinter"]["contracts"] if c.get("containers") == ["quantcore"]]
    return [name.strip() for layer in layers["layers"] for name in layer.split("|")]


def test_every_quantcore_module_stands_in_a_stage_layer_or_on_the_ground() -> None:
    # The layers contract only constrains the modules it names: a new top-level module would escape it.
    # The ground (imported by every layer, importing none) is these few, and they stay few.
    ground = {"errors", "checks", "progress", "atomic", "jsonable", "wording"}
    layered = set(_stage_layers())
    top_level = {
        p.stem if p.suffix == ".py" else p.name
        for p in (ROOT / "quantcore").iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()
    }
    assert top_level - ground == layered, f"outside the layers contract: {sorted(top_level - ground - layered)}"
