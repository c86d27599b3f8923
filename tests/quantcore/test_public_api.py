"""The public surface, the error tree and the import rules of quantcore."""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path

import pytest

import quantcore
from quantcore import errors

PACKAGE = Path(quantcore.__file__).parent
# filelock: the CPU timing cache; scipy: LAPACK in place for GPTQ's factor of H (one KxK array per layer, where
# numpy and torch allocate a new one per factorization)
ALLOWED_THIRD_PARTY = {"numpy", "onnx", "onnxruntime", "torch", "filelock", "scipy"}
LAZY_ONLY = {"tensorrt"}


def test_all_lists_exactly_the_public_names() -> None:
    for name in quantcore.__all__:
        assert hasattr(quantcore, name), name
    public = {n for n in vars(quantcore) if not n.startswith("_") and not inspect.ismodule(getattr(quantcore, n))}
    assert public == set(quantcore.__all__)


@pytest.mark.parametrize("function", [quantcore.quantize, quantcore.quantize_auto])
def test_quantize_signature(function) -> None:
    parameters = inspect.signature(function).parameters
    assert list(parameters)[:10] == [
        "model_path",
        "calibration",
        "evaluation",
        "config",
        "out_dir",
        "labels",
        "progress",
        "should_cancel",
        "engine_builder",
        "resume_from",
    ]
    keyword_only = ("labels", "progress", "should_cancel", "engine_builder", "resume_from")
    assert all(parameters[p].kind is inspect.Parameter.KEYWORD_ONLY for p in keyword_only)


def test_error_tree() -> None:
    for error in (errors.InvalidModelError, errors.InvalidDataError, errors.Canceled, errors.UnsupportedModelError):
        assert issubclass(error, errors.QuantcoreError)
    assert errors.__doc__.lstrip().startswith("Exceptions raised by quantcore")


def test_module_names_are_concepts() -> None:
    banned = {"utils", "util", "helpers", "helper", "common", "misc"}
    assert not [p for p in PACKAGE.rglob("*.py") if p.stem in banned]


def test_quantcore_imports_only_its_allowed_libraries() -> None:
    """numpy, onnx, onnxruntime, torch, filelock, scipy and the stdlib anywhere; tensorrt only lazily (inside a
    function, so a machine without it still imports quantcore) and in one module (ARCHITECTURE.md)."""
    stdlib = set(sys.stdlib_module_names)
    offenders, lazy_modules = [], set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        top_level = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                roots = [node.module.split(".")[0]]
            else:
                continue
            for root in roots:
                if root in LAZY_ONLY and id(node) not in top_level:
                    lazy_modules.add(path.relative_to(PACKAGE))
                elif root not in stdlib | ALLOWED_THIRD_PARTY | {"quantcore"}:
                    offenders.append(f"{path.relative_to(PACKAGE)}: {root}")
    assert not offenders
    assert len(lazy_modules) <= 1, lazy_modules
