"""bench/half_precision.py: real models converted to float16, quantized, against their float32 originals.

```sh
nice -n 5 .venv/bin/python -m bench.half_precision --models ocr-rec,ocr-cls,yolo-det,minilm
```

Each named model of ``bench.models.cases.REAL_MODELS`` is converted as users make float16 models: onnxconverter-common's
``convert_float_to_float16`` with its defaults (inputs and outputs float16 too). The float32 model and its
conversion go through ``bench.quality``'s methods on the same data (cast to float16 for the conversion), and every
row of both is compared with the float32 model's outputs. So the conversion's "fp32" row is what the conversion
itself costs (the float16 model run by ONNX Runtime, in float16 arithmetic, where it can run it), and each of its
method rows what the conversion and the quantization cost together.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench.models.cases import REAL_MODELS, Case, real_cases
from bench.quality import bench_case, run_model, table

METHODS = ("quantcore", "quantcore-ort", "ort-minmax")


def float16_case(case: Case, workdir: Path) -> Case:
    """``case`` with its model converted to float16 (``workdir/exports/NAME-fp16.onnx``) and its float32
    arrays cast to float16."""
    import onnx
    from onnxconverter_common import float16

    path = workdir / "exports" / f"{case.name}-fp16.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(float16.convert_float_to_float16(onnx.load(str(case.model_path))), str(path))

    def half(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in arrays.items()}

    return replace(
        case,
        name=f"{case.name}-fp16",
        model_path=path,
        calibration=half(case.calibration),
        evaluation=half(case.evaluation),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", default="ocr-rec,ocr-cls,yolo-det,minilm", help=f"comma-separated, of {', '.join(REAL_MODELS)}"
    )
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated bench.quality methods")
    parser.add_argument("--workdir", help="where models, data and downloads go (default: a temporary directory)")
    parser.add_argument("--calibration-samples", type=int, default=32)
    parser.add_argument("--evaluation-samples", type=int, default=32)
    args = parser.parse_args(argv)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="quantcore-bench-"))
    methods = args.methods.split(",")
    rows = []
    for case in real_cases(workdir, args.calibration_samples, args.evaluation_samples, args.models.split(",")):
        print(f"# {case.name} ({case.source})", file=sys.stderr, flush=True)
        rows += bench_case(case, methods, workdir)
        reference, _, _ = run_model(case.model_path, case, case.evaluation)
        rows += bench_case(float16_case(case, workdir), methods, workdir, reference=reference)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
