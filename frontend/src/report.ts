// Renders a job's report JSON (schema: the `Report` model of the OpenAPI document). Known sections
// get purpose-built views (summary, the onnxruntime platform recommended for a job with no engine, automatic
// search, accuracy target, QAT's loss curve, outputs, layers ranked by harm, CPU latency and placement);
// anything else, such as sections a newer engine adds, falls through to a generic, readable rendering:
// nothing in the report is ever hidden from the user.

import type { Schemas } from "./api/client";
import { autoSearchView } from "./autosearch";
import { chart, PALETTE } from "./charts";
import { bytes, h, label, num, percent, scroll, table } from "./dom";
import { cpuAlternativeView } from "./cpualternative";
import { placementView } from "./placement";
import { qatView } from "./qat";

type Analysis = Schemas["Analysis"];
type LayerHarm = Schemas["LayerHarm"];
type Target = Schemas["TargetOutcome"];
type Parity = Schemas["Parity"];
type CpuLatency = Schemas["CpuLatency"];

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
type Obj = { [key: string]: Json };

const isObj = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);

const HANDLED_TOP = new Set(["format", "evaluation", "stage_seconds", "warnings", "config", "analysis", "target", "parity", "latency", "auto", "placement", "qat"]);
const HANDLED_EVAL = new Set(["model", "num_samples", "top1_output", "latency_ms_per_sample"]);

/** Render into `section`; returns a cleanup that destroys the charts. */
export function renderReport(section: HTMLElement, report: Obj): () => void {
  const destroyers: (() => void)[] = [];
  const evaluation = isObj(report.evaluation) ? report.evaluation : {};
  const variants = Object.entries(evaluation).filter(([, v]) => isObj(v) && (isObj(v.outputs) || "top1" in v)) as [string, Obj][];

  const warnings = Array.isArray(report.warnings) ? report.warnings : [];
  if (warnings.length) {
    section.append(
      h("div", { class: "notice warn", role: "note" }, h("strong", {}, "Warnings"), h("ul", {}, warnings.map((w) => h("li", {}, typeof w === "string" ? w : JSON.stringify(w))))),
    );
  }
  section.append(summary(evaluation, variants));
  const latency = isObj(report.latency) ? report.latency : {};
  if (isObj(latency.cpu_alternative)) section.append(cpuAlternativeView(latency.cpu_alternative as unknown as Schemas["CpuAlternative"]));
  if (isObj(report.parity)) section.append(parityView(report.parity as unknown as Parity, isObj(report.config) ? report.config : {}));
  if (isObj(report.auto)) {
    const view = autoSearchView(report.auto as unknown as Schemas["AutoSearch"]);
    section.append(view.el);
    destroyers.push(view.destroy);
  }
  if (isObj(report.target)) section.append(targetView(report.target as unknown as Target));
  if (isObj(report.qat)) {
    const view = qatView(report.qat as unknown as Schemas["Qat"]);
    section.append(view.el);
    destroyers.push(view.destroy);
  }
  section.append(outputMetrics(variants));

  if (isObj(report.analysis)) {
    const view = analysisView(report.analysis as unknown as Analysis);
    section.append(view.el);
    destroyers.push(view.destroy);
  }

  section.append(latencyView(isObj(latency.cpu) ? (latency.cpu as unknown as CpuLatency) : null, evaluation.latency_ms_per_sample));
  if (isObj(report.placement)) section.append(placementView(report.placement as unknown as Schemas["Placement"]));
  for (const [key, value] of Object.entries(latency)) {
    if (key !== "cpu" && key !== "cpu_alternative") section.append(h("details", { class: "generic" }, h("summary", {}, `Latency: ${label(key)}`), generic(value)));
  }

  if (isObj(report.stage_seconds)) {
    const stages = Object.entries(report.stage_seconds).filter(([, v]) => typeof v === "number") as [string, number][];
    section.append(
      h("h3", {}, "Time per stage"),
      table(null, ["Stage", "Seconds"], stages.map(([s, v]) => [s, v.toFixed(2)]), { class: "data compact", id: "stage-table" }),
    );
  }

  // Evaluation keys and top-level sections no view above knows: shown generically.
  const variantKeys = new Set(variants.map(([k]) => k));
  for (const [key, value] of Object.entries(evaluation)) {
    if (HANDLED_EVAL.has(key) || variantKeys.has(key)) continue;
    section.append(h("h3", {}, label(key)), generic(value));
  }
  for (const [key, value] of Object.entries(report)) {
    if (HANDLED_TOP.has(key)) continue;
    section.append(h("details", { class: "generic" }, h("summary", {}, label(key)), generic(value)));
  }
  section.append(
    h("details", {}, h("summary", {}, "Configuration"), h("pre", {}, JSON.stringify(report.config ?? null, null, 2))),
    h("details", {}, h("summary", {}, "Raw report JSON"), h("pre", { id: "raw-report" }, JSON.stringify(report, null, 2))),
  );
  return () => destroyers.forEach((fn) => fn());
}

function summary(evaluation: Obj, variants: [string, Obj][]): HTMLElement {
  const model = isObj(evaluation.model) ? evaluation.model : {};
  const cards: HTMLElement[] = [];
  const fp32 = variants.find(([k]) => k === "fp32")?.[1];
  for (const [name, v] of variants) {
    // task_metrics holds every task metric (top1, top5, ...); older reports only a top1 of their own.
    const scores = isObj(v.task_metrics) && Object.keys(v.task_metrics).length ? v.task_metrics : { top1: v.top1 ?? null };
    for (const [metric, value] of Object.entries(scores)) {
      if (typeof value !== "number") continue;
      const reference = isObj(fp32?.task_metrics) ? fp32.task_metrics[metric] : metric === "top1" ? fp32?.top1 : null;
      const drop = name !== "fp32" && typeof reference === "number" ? (value - reference) * 100 : null;
      cards.push(
        stat(`${label(metric).replace(/^./, (c) => c.toUpperCase())} · ${label(name)}`, percent(value), drop === null ? undefined : `${drop >= 0 ? "+" : ""}${drop.toFixed(2)} points vs FP32`),
      );
    }
  }
  if (typeof model.fp32_bytes === "number" && typeof model.qdq_bytes === "number") {
    cards.push(stat("Size FP32 → QDQ", `${bytes(model.fp32_bytes)} → ${bytes(model.qdq_bytes)}`, `${(model.fp32_bytes / model.qdq_bytes).toFixed(2)}× smaller`));
  }
  const rest = Object.entries(model).filter(([k]) => k !== "fp32_bytes" && k !== "qdq_bytes");
  for (const [key, value] of rest) cards.push(stat(label(key), typeof value === "number" ? num(value) : String(value)));
  if (typeof evaluation.num_samples === "number") cards.push(stat("Evaluated samples", num(evaluation.num_samples)));
  return h("div", { class: "stats", id: "report-summary" }, cards);
}

function stat(title: string, value: string, note?: string): HTMLElement {
  return h("div", { class: "stat" }, h("div", { class: "stat-title" }, title), h("div", { class: "stat-value" }, value), note ? h("div", { class: "stat-note" }, note) : null);
}

function outputMetrics(variants: [string, Obj][]): HTMLElement {
  const rows: [string, string, Obj][] = [];
  for (const [variant, v] of variants) {
    if (!isObj(v.outputs)) continue;
    for (const [output, metrics] of Object.entries(v.outputs)) if (isObj(metrics)) rows.push([variant, output, metrics]);
  }
  if (!rows.length) return h("p", {}, "No output metrics in this report.");
  const keys = [...new Set(rows.flatMap(([, , m]) => Object.keys(m).filter((k) => typeof m[k] !== "object" || m[k] === null)))];
  const extra = rows.flatMap(([variant, , m]) =>
    Object.entries(m)
      .filter(([, value]) => typeof value === "object" && value !== null)
      .map(([k, value]) => h("details", { class: "generic" }, h("summary", {}, `${label(variant)}: ${label(k)}`), generic(value))),
  );
  const variantExtras = variants.flatMap(([variant, v]) =>
    Object.entries(v)
      .filter(([k]) => !["outputs", "top1", "task_metrics"].includes(k))
      .map(([k, value]) => h("details", { class: "generic" }, h("summary", {}, `${label(variant)}: ${label(k)}`), generic(value))),
  );
  return h(
    "div",
    {},
    h("h3", {}, "Outputs: quantized vs FP32"),
    h(
      "p",
      { class: "hint" },
      "“qdq exact” runs the exported model with exact QDQ arithmetic; “qdq deployed” with the runtime's integer kernels. The two can differ.",
    ),
    scroll("Output metrics", table(null, ["Measured as", "Output", ...keys.map(label)], rows.map(([variant, output, m]) => [label(variant), h("code", {}, output), ...keys.map((k) => num(m[k]))]), { class: "data fit", id: "output-metrics" })),
    extra,
    variantExtras,
  );
}

// ---- deployment: does the model run as the report measured it, and how to run it so ----

function parityView(parity: Parity, config: Obj): HTMLElement {
  const disabled = Array.isArray(config.disabled_optimizers) ? config.disabled_optimizers.filter((n): n is string => typeof n === "string") : [];
  const kind = parity.agree === true ? "info" : parity.agree === false ? "error" : "warn";
  const verdict = parity.agree === true ? "Deployed as measured" : parity.agree === false ? "Deployed model disagrees with exact QDQ" : "Deployment not measured";
  return h(
    "section",
    { "aria-labelledby": "deployment-title", id: "deployment" },
    h("h3", { id: "deployment-title" }, "Deployment"),
    h("p", { class: `notice ${kind}`, role: "status", id: "parity-verdict" }, h("strong", {}, `${verdict}: `), parity.reason),
    parity.remedy ? h("p", { id: "parity-remedy" }, h("strong", {}, "What was changed: "), parity.remedy) : null,
    disabled.length
      ? h(
          "p",
          { class: "notice warn", id: "run-as" },
          h("strong", {}, "Run it as measured: "),
          h("code", {}, `onnxruntime.InferenceSession(path, disabled_optimizers=${JSON.stringify(disabled)})`),
        )
      : null,
  );
}

// ---- latency: the CPU benchmark (latency.cpu), FP32 against quantized per batch size ----

function latencyView(cpu: CpuLatency | null, perSample: Json | undefined): HTMLElement {
  const section = h("section", { "aria-labelledby": "latency-title", id: "latency" }, h("h3", { id: "latency-title" }, "Latency"));
  if (!cpu) {
    section.append(h("p", { id: "latency-table" }, "Not measured: the recipe turned the CPU latency benchmark off (deploy.cpu_latency)."));
  } else {
    const rows = cpu.batch_sizes.map((batch) => {
      const fp32 = cpu.fp32[`batch_${batch}`];
      const quantized = cpu.quantized[`batch_${batch}`];
      const speedup = cpu.speedup_p50[`batch_${batch}`];
      return [
        String(batch),
        num(fp32?.p50_ms, 3),
        num(quantized?.p50_ms, 3),
        typeof speedup === "number" ? h("strong", { class: speedup < 1 ? "slower" : "" }, `${speedup.toFixed(2)}×`) : "—",
        num(quantized?.p90_ms, 3),
        num(quantized?.p99_ms, 3),
        `${samplesPerSecond(fp32)} → ${samplesPerSecond(quantized)}`,
      ];
    });
    section.append(
      h("p", { class: "hint" }, `${cpu.provider} (ONNX Runtime ${cpu.onnxruntime}) on ${cpu.device} · threads: ${cpu.threads ?? "default"} · warm-up runs: ${cpu.warmup} · timed runs: up to ${cpu.runs}, FP32 and quantized interleaved.`),
      scroll(
        "CPU latency",
        table(null, ["Batch", "FP32 p50 ms", "Quantized p50 ms", "Speed-up (p50)", "Quantized p90 ms", "Quantized p99 ms", "Samples/s FP32 → quantized"], rows, {
          class: "data compact",
          id: "latency-table",
        }),
      ),
      cpu.notes.length ? h("ul", { class: "hint", id: "latency-notes" }, cpu.notes.map((note) => h("li", {}, note))) : "",
    );
  }
  if (isObj(perSample)) {
    // The evaluation's wall time over all samples (simulated modes included) is no benchmark: said so.
    const times = Object.entries(perSample).map(([mode, ms]) => `${label(mode)} ${num(ms, 3)} ms`);
    section.append(h("p", { class: "hint" }, `Evaluation time per sample (not a benchmark): ${times.join(", ")}.`));
  }
  return section;
}

function samplesPerSecond(stats: Schemas["LatencyStats"] | undefined): string {
  const rate = stats?.throughput_samples_per_s;
  return typeof rate === "number" ? num(Math.round(rate)) : "—";
}

// ---- accuracy target: the verdict and every step ----

function targetView(target: Target): HTMLElement {
  const steps = target.steps.map((s) => [
    String(s.step),
    s.float_layers.length ? h("span", {}, s.float_layers.flatMap((name, i) => [i ? ", " : "", h("code", {}, name)])) : "none",
    num(s.value, target.metric === "cosine" ? 7 : 3), // cosine targets live in the 6th-7th decimal
    s.met ? "yes" : "no",
    percent(s.top1),
    bytes(s.qdq_bytes),
    num(s.latency_ms_per_sample, 3),
    s.calibration ?? "—",
  ]);
  return h(
    "section",
    { "aria-labelledby": "target-title", id: "target" },
    h("h3", { id: "target-title" }, `Accuracy target: ${target.statement}`),
    h("p", { class: `notice ${target.met ? "info" : "error"}`, role: "status", id: "target-verdict" }, target.verdict),
    h("p", { class: "hint" }, `Measured on ${label(target.measured_on)}; ${target.search}. Step ${target.chosen_step} is the model stored.`),
    scroll(
      "Target steps",
      table(null, ["Step", "Layers in float", label(target.metric), "Met", "Top-1", "Size", "ms / sample", "Calibration"], steps, {
        class: "data compact",
        id: "target-steps",
      }),
    ),
  );
}

// ---- layer-wise analysis: layers ranked by harm, tensors' ranges ----

function analysisView(analysis: Analysis): { el: HTMLElement; destroy: () => void } {
  const measured = analysis.layers.filter((r): r is LayerHarm & { sqnr_db: number } => typeof r.sqnr_db === "number");
  const top = measured.slice(0, 25); // already ranked, most harmful first
  const view = chart(
    {
      type: "bar",
      data: {
        labels: top.map((r) => r.node),
        datasets: [{ label: "Layer-wise SQNR (dB)", data: top.map((r) => r.sqnr_db), backgroundColor: PALETTE[4] }],
      },
      options: { indexAxis: "y", plugins: { legend: { display: false } }, scales: { x: { title: { display: true, text: "SQNR (dB), only this layer quantized" } } } },
    },
    "Layers ranked by harm (layer-wise SQNR in dB, lowest first): " + top.slice(0, 5).map((r) => `${r.node} ${num(r.sqnr_db, 2)}`).join(", "),
    Math.max(160, top.length * 22 + 60),
  );
  const layerRows = analysis.layers.map((r) => [
    String(r.rank),
    h("code", {}, r.node),
    r.op_type,
    r.nonfinite ? "NaN/inf" : r.analyzed ? num(r.sqnr_db, 2) : "not run",
    num(r.cosine, 6),
    num(r.local_sqnr_db, 2),
    h("span", {}, r.tensors.flatMap((t, i) => [i ? ", " : "", h("code", {}, t)])),
  ]);
  const tensorRows = analysis.tensors.map((t) => [
    h("code", {}, t.tensor),
    t.kind,
    num(t.graphwise_sqnr_db, 2),
    num(t.local_sqnr_db, 2),
    `${num(t.observed_min)} … ${num(t.observed_max)}`,
    `${num(t.range_min)} … ${num(t.range_max)}`,
    percent(t.clipped_fraction),
    num(t.channel_range_ratio, 2),
  ]);
  const el = h(
    "section",
    { "aria-labelledby": "layers-title", id: "layers" },
    h("h3", { id: "layers-title" }, "Layers ranked by harm: output SQNR (dB) with only that layer quantized"),
    h("p", { class: "hint" }, `${analysis.layerwise.statement}; graph-wise statistics on ${analysis.graphwise.samples} samples.`),
    view.el,
    scroll(
      "Layers ranked by harm",
      table(null, ["Rank", "Node", "Op", "Layer-wise SQNR (dB)", "Cosine", "Local SQNR (dB)", "Quantized inputs"], layerRows, {
        class: "data compact",
        id: "layer-table",
      }),
    ),
    h(
      "details",
      {},
      h("summary", {}, `Quantized tensors (${analysis.tensors.length}): SQNR and ranges`),
      h(
        "p",
        { class: "hint" },
        "Graph-wise: SQNR at the tensor in the fully quantized model; local: its own quantization alone; range: what the chosen clipping keeps; clipped: values beyond it.",
      ),
      scroll(
        "Quantized tensors",
        table(null, ["Tensor", "Kind", "Graph-wise SQNR (dB)", "Local SQNR (dB)", "Observed", "Range kept", "Clipped", "Channel range ratio"], tensorRows, {
          class: "data compact",
          id: "tensor-table",
        }),
      ),
    ),
  );
  return { el, destroy: view.destroy };
}

// ---- generic rendering ----

export function generic(value: Json, depth = 0): HTMLElement {
  if (value === null || typeof value !== "object") return h("span", {}, typeof value === "number" ? num(value) : String(value));
  if (Array.isArray(value)) {
    if (value.every((v) => v === null || typeof v !== "object")) return h("span", {}, value.map((v) => (typeof v === "number" ? num(v) : String(v))).join(", ") || "—");
    const rows = value.filter(isObj);
    if (rows.length === value.length) {
      const keys = [...new Set(rows.flatMap(Object.keys))];
      return scroll("Table", table(null, keys.map(label), rows.slice(0, 500).map((r) => keys.map((k) => generic(r[k] ?? null, depth + 1))), { class: "data compact" }));
    }
    return h("pre", {}, JSON.stringify(value, null, 2));
  }
  if (depth > 3) return h("pre", {}, JSON.stringify(value, null, 2));
  return h("dl", { class: "facts" }, Object.entries(value).flatMap(([k, v]) => [h("dt", {}, label(k)), h("dd", {}, generic(v, depth + 1))]));
}
