// Renders a job's report JSON. The report grows as the engine does (per-layer analysis, latency,
// engines...), so known sections get purpose-built views and everything else falls through to a
// generic, readable rendering: nothing in the report is ever hidden from the user.

import { chart, PALETTE } from "./charts";
import { bytes, h, label, num, percent, table } from "./dom";

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
type Obj = { [key: string]: Json };

const isObj = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);

const LATENCY = /latency|_ms$|throughput/i; // shown together in the latency table
const HANDLED_TOP = new Set(["format", "evaluation", "stage_seconds", "warnings", "config"]);
const HANDLED_EVAL = new Set(["model", "num_samples", "top1_output"]);

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
  section.append(outputMetrics(variants));

  const layers = findLayers(report);
  if (layers) {
    const view = layerChart(layers);
    section.append(view.el);
    destroyers.push(view.destroy);
  }

  const latencies = collect(evaluation, (key) => LATENCY.test(key));
  if (latencies.length) {
    section.append(
      h("h3", {}, "Latency"),
      table(null, ["Measurement", "Value"], latencies.map(([path, v]) => [path, num(v, 3)]), { class: "data compact", id: "latency-table" }),
    );
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
    if (HANDLED_EVAL.has(key) || variantKeys.has(key) || (LATENCY.test(key) && latencies.length)) continue;
    section.append(h("h3", {}, label(key)), generic(value));
  }
  for (const [key, value] of Object.entries(report)) {
    if (HANDLED_TOP.has(key) || value === layers?.source) continue;
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
    if (typeof v.top1 !== "number") continue;
    const drop = name !== "fp32" && fp32 && typeof fp32.top1 === "number" ? (v.top1 - fp32.top1) * 100 : null;
    cards.push(
      stat(`Top-1 · ${label(name)}`, percent(v.top1), drop === null ? undefined : `${drop >= 0 ? "+" : ""}${drop.toFixed(2)} points vs FP32`),
    );
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
      .filter(([k, value]) => k !== "outputs" && k !== "top1" && !(typeof value === "number" && LATENCY.test(k)))
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
    h("div", { class: "scroll" }, table(null, ["Measured as", "Output", ...keys.map(label)], rows.map(([variant, output, m]) => [label(variant), h("code", {}, output), ...keys.map((k) => num(m[k]))]), { class: "data", id: "output-metrics" })),
    extra,
    variantExtras,
  );
}

// ---- per-layer analysis: found wherever the report puts it ----

interface Layers {
  source: Json[];
  name: string;
  metric: string;
  higherIsWorse: boolean;
  rows: Obj[];
}

const NAME_KEYS = ["name", "tensor", "layer", "node", "op"];

function findLayers(report: Obj): Layers | null {
  let best: Layers | null = null;
  const visit = (value: Json, depth: number): void => {
    if (depth > 4 || best) return;
    if (Array.isArray(value)) {
      const rows = value.filter(isObj);
      if (rows.length >= 2 && rows.length === value.length) {
        const name = NAME_KEYS.find((k) => typeof rows[0][k] === "string");
        const numeric = Object.keys(rows[0]).filter((k) => typeof rows[0][k] === "number");
        const metric =
          numeric.find((k) => /sqnr|snr/i.test(k)) ?? numeric.find((k) => /error|mse|loss|harm/i.test(k)) ?? numeric.find((k) => /cosine/i.test(k));
        if (name && metric) best = { source: value, name, metric, higherIsWorse: !/sqnr|snr|cosine/i.test(metric), rows };
      }
      return;
    }
    if (isObj(value)) for (const [key, child] of Object.entries(value)) if (key !== "config") visit(child, depth + 1);
  };
  visit(report, 0);
  return best;
}

function layerChart(layers: Layers): { el: HTMLElement; destroy: () => void } {
  const { rows, name, metric, higherIsWorse } = layers;
  const value = (r: Obj) => (typeof r[metric] === "number" ? (r[metric] as number) : NaN);
  const ranked = [...rows].filter((r) => Number.isFinite(value(r))).sort((a, b) => (higherIsWorse ? value(b) - value(a) : value(a) - value(b)));
  const top = ranked.slice(0, 25);
  const view = chart(
    {
      type: "bar",
      data: {
        labels: top.map((r) => String(r[name])),
        datasets: [{ label: label(metric), data: top.map(value), backgroundColor: PALETTE[4] }],
      },
      options: { indexAxis: "y", plugins: { legend: { display: false } }, scales: { x: { title: { display: true, text: label(metric) } } } },
    },
    `Layers ranked by harm (${label(metric)}, ${higherIsWorse ? "highest" : "lowest"} first): ` +
      top.slice(0, 5).map((r) => `${r[name]} ${num(value(r), 2)}`).join(", "),
    Math.max(160, top.length * 22 + 60),
  );
  const keys = Object.keys(rows[0]).filter((k) => typeof rows[0][k] !== "object" || rows[0][k] === null);
  const el = h(
    "section",
    { "aria-labelledby": "layers-title", id: "layers" },
    h("h3", { id: "layers-title" }, `Per-layer error, ranked by harm (${label(metric)})`),
    view.el,
    h(
      "details",
      {},
      h("summary", {}, `All ${ranked.length} layers`),
      h("div", { class: "scroll" }, table(null, keys.map(label), ranked.map((r) => keys.map((k) => (k === name ? h("code", {}, String(r[k])) : num(r[k])))), { class: "data compact" })),
    ),
  );
  return { el, destroy: view.destroy };
}

// ---- generic rendering ----

function collect(value: Json, match: (key: string) => boolean, path = ""): [string, number][] {
  if (!isObj(value)) return [];
  return Object.entries(value).flatMap(([key, child]) => {
    const here = path ? `${path} › ${label(key)}` : label(key);
    if (typeof child === "number" && match(key)) return [[here, child] as [string, number]];
    if (match(key) && isObj(child)) {
      // e.g. latency_ms_per_sample: {fp32: 0.013, qdq_exact: 0.033, qdq_deployed: 0.029}
      return collect(child, () => true, here);
    }
    return collect(child, match, here);
  });
}

export function generic(value: Json, depth = 0): HTMLElement {
  if (value === null || typeof value !== "object") return h("span", {}, typeof value === "number" ? num(value) : String(value));
  if (Array.isArray(value)) {
    if (value.every((v) => v === null || typeof v !== "object")) return h("span", {}, value.map((v) => (typeof v === "number" ? num(v) : String(v))).join(", ") || "—");
    const rows = value.filter(isObj);
    if (rows.length === value.length) {
      const keys = [...new Set(rows.flatMap(Object.keys))];
      return h("div", { class: "scroll" }, table(null, keys.map(label), rows.slice(0, 500).map((r) => keys.map((k) => generic(r[k] ?? null, depth + 1))), { class: "data compact" }));
    }
    return h("pre", {}, JSON.stringify(value, null, 2));
  }
  if (depth > 3) return h("pre", {}, JSON.stringify(value, null, 2));
  return h("dl", { class: "facts" }, Object.entries(value).flatMap(([k, v]) => [h("dt", {}, label(k)), h("dd", {}, generic(v, depth + 1))]));
}
