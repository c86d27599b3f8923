"""Weight-only w4 on the small decoder of ``samples.decoder``: quantcore's RTN and GPTQ (MatMulNBits,
symmetric and not) against ONNX Runtime's own ``MatMulNBitsQuantizer`` (its DEFAULT algorithm, the C++
round-to-nearest; its RTN and GPTQ configs need Intel Neural Compressor, which is not installed, and are
reported as not run) at block sizes 32 and 128, on the same calibration and evaluation tokens, the LM
head kept float by both. Columns: the logits' SQNR to FP32 (dB), next-token (argmax) agreement with FP32,
the model file's bytes. Run: ``.venv/bin/python -m bench.weight_only``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx

from quantcore import QuantizeConfig, quantize
from quantcore.config import WeightOnlyConfig
from quantcore.runtime.session import open_session
from samples.decoder import build_decoder


def _logits(model: str | Path, tokens: np.ndarray) -> np.ndarray:
    with open_session(str(model)) as session:
        return session.run(["logits"], {"tokens": tokens})[0]


def _scores(reference: np.ndarray, candidate: np.ndarray) -> tuple[float, float]:
    sqnr = 10 * np.log10(np.sum(reference**2) / np.sum((reference - candidate) ** 2))
    return float(sqnr), float(np.mean(reference.argmax(-1) == candidate.argmax(-1)))


def _onnxruntime_default(source: Path, target: Path, block_size: int, symmetric: bool, head: str) -> Path:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(
        onnx.load(str(source)), bits=4, block_size=block_size, is_symmetric=symmetric, nodes_to_exclude=[head]
    )
    quantizer.process()
    onnx.save(quantizer.model.model, str(target))
    return target


def main() -> None:
    built = build_decoder()
    tokens = built.evaluation["tokens"]
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        source = root / "decoder.onnx"
        onnx.save(built.model, str(source))
        head = next(n.name for n in built.model.graph.node if n.output[0] == "logits")
        reference = _logits(source, tokens)
        print(f"FP32 file {source.stat().st_size} bytes; final training loss {built.final_loss:.3f}")
        print("| method | block | symmetric | SQNR dB | next-token agreement | file bytes |")
        print("| --- | --- | --- | --- | --- | --- |")
        for block in (32, 128):
            for symmetric in (True, False):
                for algorithm in ("rtn", "gptq"):
                    options = WeightOnlyConfig(algorithm=algorithm, block_size=block, symmetric=symmetric)
                    config = QuantizeConfig(
                        platform="onnxruntime-weight-only", precision="w4", cpu_latency=False, weight_only=options
                    )
                    out = root / f"{algorithm}-{block}-{symmetric}"
                    result = quantize(source, built.calibration, built.evaluation, config, out)
                    sqnr, agreement = _scores(reference, _logits(result.model_path, tokens))
                    size = result.model_path.stat().st_size
                    print(f"| quantcore {algorithm} | {block} | {symmetric} | {sqnr:.2f} | {agreement:.4f} | {size} |")
                path = _onnxruntime_default(source, root / f"ort-{block}-{symmetric}.onnx", block, symmetric, head)
                sqnr, agreement = _scores(reference, _logits(path, tokens))
                print(f"| ORT DEFAULT | {block} | {symmetric} | {sqnr:.2f} | {agreement:.4f} | {path.stat().st_size} |")
        print("ORT RTN / GPTQ configs: not run (they need neural_compressor, not installed)")


if __name__ == "__main__":
    main()
