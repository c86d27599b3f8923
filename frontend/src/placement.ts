// The report's `placement` section (deploy.cpu_objective latency): each quantized region's estimate from
// ONNX Runtime's node profiles (its float nodes against its integer kernels and Q/DQ, in µs), or, where the
// profiles could not be traced to it, its whole-model pair timed quantized against float; what was kept and
// why, and the final speed-up.

import type { Schemas } from "./api/client";
import { h, num, scroll, table } from "./dom";

type Placement = Schemas["Placement"];
type Timing = Schemas["PlacementTiming"];

const p50 = (timing: Timing | null | undefined): string => num(timing?.p50_ms, 4);

export function placementView(placement: Placement): HTMLElement {
  const batches = placement.batch_sizes;
  const regions = placement.regions.map((region) => [
    String(region.round),
    h("span", { class: "names" }, region.nodes.flatMap((node, i) => [i ? ", " : "", h("code", {}, node)])),
    Object.entries(region.op_types).map(([op, count]) => `${op} ×${count}`).join(", "),
    ...batches.map((batch) => {
      const estimate = region.estimate[`batch_${batch}`];
      if (estimate) return `${num(estimate.quantized_us, 4)} → ${num(estimate.float_us, 4)} µs`;
      const pair = region.timings[`batch_${batch}`];
      return pair ? `${p50(pair.quantized)} → ${p50(pair.float)} ms` : "—";
    }),
    num(region.cost, 3),
    region.kept === "float" ? h("strong", {}, "float (faster)") : "quantized",
    region.cached ? `${region.reason} (cached)` : region.reason,
  ]);
  const finals = batches.map((batch) => {
    const final = placement.final[`batch_${batch}`];
    const speedup = final?.speedup_p50;
    return [
      String(batch),
      p50(final?.fp32),
      p50(final?.quantized),
      p50(final?.placed),
      typeof speedup === "number" ? h("strong", { class: speedup < 1 ? "slower" : "" }, `${speedup.toFixed(2)}×`) : "—",
    ];
  });
  return h(
    "section",
    { "aria-labelledby": "placement-title", id: "placement" },
    h("h3", { id: "placement-title" }, "CPU placement: regions kept float where that is faster"),
    h("p", { class: "notice info", role: "status", id: "placement-statement" }, placement.statement),
    h(
      "p",
      { class: "hint" },
      `${placement.cpu}, ONNX Runtime ${placement.onnxruntime}, ${placement.threads} thread(s); ${placement.rounds} round(s), stopped: ${placement.stopped}. ` +
        `Model kept: ${placement.kept}. Estimates are µs of profiled kernels (cost above 0: slower quantized); timed pairs and the speed-up are p50 ms of interleaved runs` +
        {
          profile: " (the last profile's own runs: nothing more was timed).",
          profiles: " (each model's profile runs beside FP32's: the timing budget left no room for a final comparison).",
          timed: " (a final comparison).",
        }[placement.final_source],
    ),
    placement.past_budget ? h("p", { class: "notice", id: "placement-past-budget" }, `Timed past the budget: ${placement.past_budget}.`) : null,
    scroll(
      "Placement regions",
      table(null, ["Round", "Nodes", "Ops", ...batches.map((b) => `Batch ${b}: quantized → float`), "Cost", "Kept", "Why"], regions, {
        class: "data compact fit",
        id: "placement-regions",
      }),
    ),
    scroll(
      "Placement speed-up",
      table(null, ["Batch", "FP32 p50 ms", "All quantized p50 ms", "Placed p50 ms", "Speed-up over FP32 (p50)"], finals, {
        class: "data compact",
        id: "placement-final",
      }),
    ),
  );
}
