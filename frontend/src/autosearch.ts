// The report's `auto` section (strategy auto): every candidate the search tried on the selection
// split, the Pareto front of accuracy, latency and size, the one chosen and why, the timing of those
// that meet the objective where the deployment favours latency, and the fallback.

import type { Schemas } from "./api/client";
import { scatter, type ScatterPoint } from "./charts";
import { bytes, h, label, num, scroll, table } from "./dom";

type AutoSearch = Schemas["AutoSearch"];
type Candidate = Schemas["AutoCandidateResult"];
type Fallback = Schemas["AutoFallback"];
type Speed = Schemas["AutoSpeed"];

/** Digits a metric is shown with: cosines differ in the 5th-7th decimal, SQNR and top-1 drop do not. */
const digits = (metric: string): number => (metric === "cosine" ? 7 : 3);

export function autoSearchView(auto: AutoSearch): { el: HTMLElement; destroy: () => void } {
  const metric = auto.objective.metric;
  const rows = auto.candidates.map((c) => [
    h("span", {}, h("code", {}, c.name), marks(c, auto.chosen)),
    c.change,
    num(c.value, digits(metric)),
    c.error ? "—" : c.met ? "yes" : "no",
    bytes(c.qdq_bytes),
    num(c.latency_p50_ms, 3),
    num(c.seconds, 2),
    c.error ?? "",
  ]);
  const plot = candidatePlot(auto);
  const selection = auto.selection;
  const el = h(
    "section",
    { "aria-labelledby": "auto-title", id: "auto" },
    h("h3", { id: "auto-title" }, `Automatic search: objective ${auto.objective.statement}`),
    h("p", { class: `notice ${auto.met ? "info" : "warn"}`, role: "status", id: "auto-verdict" }, h("strong", {}, auto.met ? "Objective met: " : "Objective not met: "), auto.reason),
    h(
      "p",
      { class: "hint" },
      `Each candidate calibrated on ${selection.calibration_samples} samples and was scored on ${selection.selection_samples} held out from them (${auto.measured_on}). ` +
        `${num(auto.seconds, 1)} s of a ${num(auto.budget_seconds)} s budget.` +
        (auto.stopped ? ` Stopped early: ${auto.stopped}.` : ""),
    ),
    scroll(
      "Candidates",
      table(null, ["Candidate", "What it changed", `${label(metric)} (selection)`, "Met", "Size", "CPU p50 ms (batch 1)", "Seconds", "Why no model"], rows, {
        class: "data compact fit",
        id: "auto-candidates",
      }),
    ),
    auto.speed ? speedView(auto.speed) : null,
    auto.fallback ? fallbackView(auto.fallback, metric) : null,
    plot?.el ?? null,
  );
  return { el, destroy: plot?.destroy ?? (() => {}) };
}

function marks(candidate: Candidate, chosen: string): HTMLElement[] {
  return [
    candidate.name === chosen ? h("span", { class: "badge mark-chosen" }, "chosen") : null,
    candidate.pareto ? h("span", { class: "badge mark-pareto", title: "On the accuracy/latency/size Pareto front: no other candidate is as good on all three and better on one" }, "Pareto") : null,
  ].filter((mark): mark is HTMLElement => mark !== null);
}

/** The candidates that meet the objective, one per deployed graph, timed against the most accurate. */
function speedView(speed: Speed): HTMLElement {
  const batches = speed.batch_sizes ?? [];
  const timed = speed.compared.some((c) => Object.keys(c.timings ?? {}).length > 0);
  const rows = speed.compared.map((c) => [
    h("code", {}, c.name),
    c.stands_for.length ? c.stands_for.join(", ") : "—",
    ...batches.map((b) => {
      const t = c.timings?.[`batch_${b}`];
      return t ? `${num(t.p50_ms, 3)} (${num(t.p25_ms, 3)}–${num(t.p75_ms, 3)})` : (c.error ?? "—");
    }),
  ]);
  return h(
    "div",
    { class: "notice info", id: "auto-speed" },
    h("strong", {}, "The deployment favours latency: "),
    speed.verdict,
    timed
      ? scroll(
          "Candidates timed",
          table(null, ["Timed", "Same graph as", ...batches.map((b) => `p50 ms at batch ${b} (p25–p75)`)], rows, {
            class: "data compact fit",
            id: "auto-speed-table",
          }),
        )
      : null,
    timed
      ? h(
          "p",
          { class: "hint" },
          (speed.reused ? `The timings of the base candidate's comparison, reused: interleaved runs with ${speed.threads} threads` : `Interleaved runs with ${speed.threads} threads, ${num(speed.seconds, 2)} s`) +
            `; each candidate stands for those deploying the same graph.` +
            (speed.left_out ? ` Not timed: ${speed.left_out}.` : ""),
        )
      : null,
  );
}

function fallbackView(fallback: Fallback, metric: string): HTMLElement {
  const layers = fallback.float_layers.length ? fallback.float_layers.flatMap((name, i) => [i ? ", " : "", h("code", {}, name)]) : ["none"];
  return h(
    "div",
    { class: `notice ${fallback.met ? "info" : "warn"}`, id: "auto-fallback" },
    h("strong", {}, `Fallback from ${fallback.from}: `),
    `no candidate met the objective, so the most harmful layers were kept in float; ${label(metric)} ${num(fallback.value, digits(metric))}, ${fallback.met ? "met" : "not met"} (${num(fallback.seconds, 2)} s).`,
    h("p", {}, "Kept in float: ", ...layers),
    fallback.dropped.length ? h("p", {}, `Dropped for the fallback: ${fallback.dropped.join(", ")}.`) : null,
    fallback.verdict ? h("p", {}, fallback.verdict) : null,
    fallback.error ? h("p", {}, `Error: ${fallback.error}`) : null,
  );
}

/** The metric against latency where every plotted candidate measured it, else against size. */
function candidatePlot(auto: AutoSearch): { el: HTMLElement; destroy: () => void } | null {
  const plotted = auto.candidates.filter((c) => c.error === null && typeof c.value === "number" && typeof c.qdq_bytes === "number");
  if (!plotted.length) return null;
  const byLatency = plotted.every((c) => typeof c.latency_p50_ms === "number");
  const x = (c: Candidate): number => (byLatency ? (c.latency_p50_ms as number) : (c.qdq_bytes as number) / 1024);
  const xTitle = byLatency ? "CPU p50 latency at batch 1 (ms)" : "quantized size (KiB)";
  const yTitle = `${label(auto.objective.metric)} on the selection split`;
  // The chosen one large, the Pareto front filled, the rest as rings.
  const points: ScatterPoint[] = plotted.map((c) => ({
    label: `${c.name}${c.name === auto.chosen ? " (chosen)" : c.pareto ? " (Pareto)" : ""}`,
    x: x(c),
    y: c.value as number,
    radius: c.name === auto.chosen ? 9 : 6,
    hollow: !c.pareto && c.name !== auto.chosen,
  }));
  const description = `${yTitle} against ${xTitle}: ` + points.map((p) => `${p.label} ${num(p.y, digits(auto.objective.metric))} at ${num(p.x, 3)}`).join("; ");
  const made = scatter(points, { x: xTitle, y: yTitle }, description, 300);
  return { el: h("div", { id: "auto-plot" }, h("h4", {}, `${yTitle} against ${xTitle}`), made.el), destroy: made.destroy };
}
