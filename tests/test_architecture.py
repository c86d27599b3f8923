"""The import contracts of ARCHITECTURE.md (import-linter, configured in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
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
