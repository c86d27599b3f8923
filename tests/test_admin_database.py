"""`quant-admin` finds the configured database wherever it runs, and says in one line when there is
none or it is not migrated: no traceback, no empty database file created beside the caller."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from jobs.config import HOME, Settings


def _admin(cwd: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "QUANT_DATABASE_URL", "QUANT_VAR_DIR")}
    return subprocess.run(
        [sys.executable, "-m", "jobs.admin", "list-keys", "--project", "nobody"],
        cwd=cwd,
        env={**clean, "PYTHONPATH": str(HOME), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _one_line_refusal(result: subprocess.CompletedProcess, needle: str) -> None:
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert needle in result.stderr


def test_relative_paths_are_the_checkouts_not_the_working_directorys(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert Settings(database_url=None).resolved_database_url == f"sqlite:///{HOME / 'var' / 'quant.db'}"
    assert Settings(var_dir=Path("elsewhere")).artifact_root == HOME / "elsewhere" / "storage"
    assert Settings(database_url="sqlite:///db/q.db").database_url == f"sqlite:///{HOME / 'db' / 'q.db'}"
    assert Settings(database_url=f"sqlite:///{tmp_path}/q.db").database_url == f"sqlite:///{tmp_path}/q.db"


def test_run_outside_the_checkout_it_creates_nothing_there(tmp_path: Path) -> None:
    result = _admin(tmp_path)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result
    assert list(tmp_path.iterdir()) == []  # the bug: ./var/quant.db, then "no such table: projects"


def test_a_missing_database_is_named_and_not_created(tmp_path: Path) -> None:
    var = tmp_path / "var"
    _one_line_refusal(_admin(tmp_path, QUANT_VAR_DIR=str(var)), f"no database at sqlite:///{var / 'quant.db'}")
    assert not var.exists()


def test_an_unmigrated_database_says_to_migrate(tmp_path: Path) -> None:
    sqlite3.connect(tmp_path / "quant.db").close()
    _one_line_refusal(_admin(tmp_path, QUANT_VAR_DIR=str(tmp_path)), "is not migrated: run `quant-admin migrate`")


def test_a_migrated_database_is_found_from_anywhere(database: str, tmp_path: Path) -> None:
    _one_line_refusal(_admin(tmp_path, DATABASE_URL=database), "no project named 'nobody'")
