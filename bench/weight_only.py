"""Weight-only w4 on a decoder of ``samples.decoder``: quantcore's RTN, GPTQ, AWQ and HQQ
(MatMulNBits, symmetric and not) against ONNX Runtime's own ``MatMulNBitsQuantizer`` (its DEFAULT, the C++
round-to-nearest, and its HQQ; its RTN and GPTQ configurations need Intel Neural Compressor, reported as not
run when it is absent) at block sizes 32 and 128, on the same calibration and evaluation tokens, the LM head
kept float by all.

``--model text`` (the default): a byte-level decoder (d_model 128, 4 blocks, 64-byte context) trained for
``--train-seconds`` on the Python standard library's source, evaluated on held-out windows of it;
``--model markov``: the tests' 2-block decoder of a random Markov chain (its perplexity barely moves at w4).

Columns: perplexity on the evaluation windows (``quantcore.weight_only.language``: exp of the mean
next-token NLL) and its increase over FP32, next-token accuracy, the logits' SQNR to FP32 (dB), the file's
bytes as a fraction of FP32's, and the CPU batch-1 latency (one window of 24 tokens, p50 of interleaved
runs of every model, ``quantcore.evaluate.paired_latency``) as a multiple of FP32's. Run:
``nice -n 5 .venv/bin/python -m bench.weight_only``.

``--memory``: peak memory instead. A decoder-shaped model of about ``--memory-gb`` GB (d_model 2048,
``samples.large.external_decoder``) is written with its weights in external data, and each algorithm of
``--algorithms`` quantizes it (w4, block 32, MatMulNBits, the whole run: prepare to evaluate, without the
CPU latency stage, whose two sessions evaluation's three already outnumber) in a fresh process that
reports its peak resident memory (``VmHWM``, reset after the imports and the data where the kernel
allows) above its resident memory just before ``quantize``. Every algorithm streams the weights from the
data file (GPTQ and AWQ one segment of the graph at a time, ``quantcore.weight_only.segments``). Run:
``nice -n 5 .venv/bin/python -m bench.weight_only --memory --algorithms rtn gptq awq``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from quantcore import QuantizeConfig, quantize
from quantcore.config import WeightOnlyConfig
from quantcore.evaluate.paired_latency import interleaved_times
from quantcore.runtime.batching import input_specs
from quantcore.runtime.session import open_session
from quantcore.weight_only.language import NextToken
from samples.decoder import DecoderModel, Shape, build_decoder, train_on_text
from samples.large import external_decoder

ALGORITHMS = ("rtn", "gptq", "awq", "hqq")
BLOCKS = (32, 128)
TEXT_SHAPE = Shape(vocab=128, d_model=128, heads=4, layers=4, max_len=64)
TEXT_BYTES = 3_000_000  # of the standard library's .py files, in name order
MEMORY_WIDTH = 2048  # d_model of the memory bench's decoder: 12·2048²·4 B = 201 MB of weights per block


def _text_model(seconds: float, calibration: int, evaluation: int) -> DecoderModel:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = b"".join(path.read_bytes() for path in sorted(stdlib.glob("*.py")))[:TEXT_BYTES]
    length = TEXT_SHAPE.max_len
    return train_on_text(
        text, TEXT_SHAPE, seconds=seconds, calibration=calibration, evaluation=evaluation, length=length
    )


@dataclass
class Row:
    method: str
    block: int | None
    symmetric: bool | None
    path: Path
    perplexity: float = 0.0
    accuracy: float = 0.0
    sqnr: float = 0.0


def _score(row: Row, built: DecoderModel, reference: np.ndarray) -> None:
    tokens = built.evaluation["tokens"]
    with open_session(str(row.path)) as session:
        logits = session.run(["logits"], {"tokens": tokens})[0]
    total = NextToken()
    total.update(logits, tokens, None)
    scores = total.to_dict()
    row.perplexity, row.accuracy = scores["perplexity"], scores["next_token_accuracy"]
    with np.errstate(divide="ignore"):  # FP32 against itself: infinite
        row.sqnr = float(10 * np.log10(np.sum(reference**2) / np.sum((reference - logits) ** 2)))


def _onnxruntime(source: Path, target: Path, block: int, symmetric: bool, head: str, algorithm: str) -> Path:
    from onnxruntime.quantization.matmul_nbits_quantizer import HQQWeightOnlyQuantConfig, MatMulNBitsQuantizer

    config = HQQWeightOnlyQuantConfig(block_size=block, bits=4) if algorithm == "HQQ" else None
    quantizer = MatMulNBitsQuantizer(
        onnx.load(str(source)),
        bits=4,
        block_size=block,
        is_symmetric=symmetric,
        nodes_to_exclude=[head],
        algo_config=config,
    )
    quantizer.process()
    onnx.save(quantizer.model.model, str(target))
    return target


def _neural_compressor() -> bool:
    try:
        import neural_compressor  # noqa: F401
    except ImportError:
        return False
    return True


def _status_bytes(field: str) -> int:
    """A ``kB`` line of /proc/self/status, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def _peak(source: Path, tokens: np.ndarray, algorithm: str, out: Path, answer: multiprocessing.Queue) -> None:
    """In a fresh process: quantize ``source`` with ``algorithm``; puts (baseline RSS, peak RSS above it,
    seconds, whether the peak was reset at the baseline)."""
    import time

    options = WeightOnlyConfig(algorithm=algorithm, block_size=32)
    config = QuantizeConfig(platform="onnxruntime-weight-only", precision="w4", cpu_latency=False, weight_only=options)
    calibration, evaluation = {"input_ids": tokens[:8]}, {"input_ids": tokens[8:]}
    try:  # "5" resets VmHWM to the current RSS (Linux 4.0+); without it the imports' peak may show
        Path("/proc/self/clear_refs").write_text("5")
        reset = True
    except OSError:
        reset = False
    baseline = _status_bytes("VmRSS")
    started = time.perf_counter()
    quantize(source, calibration, evaluation, config, out)
    answer.put((baseline, _status_bytes("VmHWM") - baseline, time.perf_counter() - started, reset))


def memory(gigabytes: float, algorithms: list[str]) -> None:
    """The ``--memory`` table (module docstring)."""
    layers = max(1, round(gigabytes * 1e9 / (12 * MEMORY_WIDTH**2 * 4)))
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        source = external_decoder(root, d_model=MEMORY_WIDTH, layers=layers)
        size = sum(path.stat().st_size for path in root.iterdir())
        tokens = np.random.default_rng(0).integers(0, 256, size=(16, 32), dtype=np.int64)
        print(f"model: {layers} blocks of d_model {MEMORY_WIDTH}, {size / 1e9:.3f} GB with its external data")
        print("| algorithm | baseline RSS GB | peak above baseline GB | peak / model size | seconds |")
        print("| --- | --- | --- | --- | --- |")
        for algorithm in algorithms:
            answer = context.Queue()
            process = context.Process(target=_peak, args=(source, tokens, algorithm, root / algorithm, answer))
            process.start()
            baseline, peak, seconds, reset = answer.get()
            process.join()
            note = "" if reset else " (VmHWM not reset: includes the imports' peak)"
            figures = f"{baseline / 1e9:.2f} | {peak / 1e9:.2f} | {peak / size:.2f} | {seconds:.0f}{note}"
            print(f"| {algorithm} | {figures} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("text", "markov"), default="text")
    parser.add_argument("--train-seconds", type=float, default=240.0, help="text model: training wall clock")
    parser.add_argument("--evaluation", type=int, default=256, help="evaluation windows")
    parser.add_argument("--calibration", type=int, default=128, help="calibration windows")
    parser.add_argument("--memory", action="store_true", help="peak memory of each algorithm instead (docstring)")
    parser.add_argument("--memory-gb", type=float, default=1.0, help="memory: the model's size")
    parser.add_argument("--algorithms", nargs="+", choices=ALGORITHMS, default=list(ALGORITHMS))
    args = parser.parse_args()
    if args.memory:
        memory(args.memory_gb, args.algorithms)
        return
    if args.model == "text":
        built = _text_model(args.train_seconds, args.calibration, args.evaluation)
    else:
        built = build_decoder(calibration=args.calibration, evaluation=args.evaluation)
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        source = root / "decoder.onnx"
        onnx.save(built.model, str(source))
        head = next(n.name for n in built.model.graph.node if n.output[0] == "logits")
        with open_session(str(source)) as session:
            reference = session.run(["logits"], {"tokens": built.evaluation["tokens"]})[0]
        rows = [Row("FP32", None, None, source)]
        for block in BLOCKS:
            for symmetric in (True, False):
                for algorithm in ALGORITHMS:
                    options = WeightOnlyConfig(algorithm=algorithm, block_size=block, symmetric=symmetric)
                    config = QuantizeConfig(
                        platform="onnxruntime-weight-only", precision="w4", cpu_latency=False, weight_only=options
                    )
                    out = root / f"{algorithm}-{block}-{symmetric}"
                    result = quantize(source, built.calibration, built.evaluation, config, out)
                    rows.append(Row(f"quantcore {algorithm}", block, symmetric, result.model_path))
                rows.append(
                    Row(
                        "ORT DEFAULT",
                        block,
                        symmetric,
                        _onnxruntime(source, root / f"ort-{block}-{symmetric}.onnx", block, symmetric, head, "DEFAULT"),
                    )
                )
            # ORT's HQQ is asymmetric with float zero points whatever is_symmetric says: one row per block
            path = _onnxruntime(source, root / f"ort-hqq-{block}.onnx", block, False, head, "HQQ")
            rows.append(Row("ORT HQQ", block, False, path))
        for row in rows:
            _score(row, built, reference)
        sample = {"tokens": built.evaluation["tokens"][:1]}
        times = interleaved_times(
            [r.path.read_bytes() for r in rows],
            [1],
            specs=input_specs(built.model),
            sample=sample,
            threads=None,
            budget_s=0.5 * len(rows),
        )[1]
        p50 = [statistics.median(t) if isinstance(t, list) and t else float("nan") for t in times]
        fp32 = rows[0]
        windows, length = built.evaluation["tokens"].shape
        print(f"{args.model}: final training loss {built.final_loss:.3f}; {windows} x {length} evaluation tokens")
        size = fp32.path.stat().st_size
        print(f"FP32: perplexity {fp32.perplexity:.4f}, file {size} bytes, batch-1 p50 {p50[0]:.3f} ms")
        columns = ("method", "block", "symmetric", "perplexity", "increase %", "next-token acc", "SQNR dB")
        print("| " + " | ".join((*columns, "size / FP32", "latency / FP32")) + " |")
        print("| --- " * (len(columns) + 2) + "|")
        for row, median in zip(rows[1:], p50[1:], strict=True):
            increase = 100 * (row.perplexity / fp32.perplexity - 1)
            size = row.path.stat().st_size / fp32.path.stat().st_size
            print(
                f"| {row.method} | {row.block} | {'yes' if row.symmetric else 'no'} | {row.perplexity:.4f} | "
                f"{increase:.2f} | {row.accuracy:.4f} | {row.sqnr:.2f} | {size:.3f} | {median / p50[0]:.2f} |"
            )
        if not _neural_compressor():
            print("ORT RTN / GPTQ configs: not run (they need neural_compressor, not installed)")


if __name__ == "__main__":
    main()
