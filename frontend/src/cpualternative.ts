// The report's `latency.cpu_alternative`: a job left on the default tensorrt platform that got no TensorRT
// engine, with the onnxruntime platform measured beside it on the worker's CPU. The job page recommends
// that platform with both models' measured figures.

import type { Schemas } from "./api/client";
import { h, num, scroll, table } from "./dom";

type CpuAlternative = Schemas["CpuAlternative"];

const speedup = (value: number | null | undefined) =>
  typeof value === "number" ? h("strong", { class: value < 1 ? "slower" : "" }, `${value.toFixed(2)}×`) : "—";

export function cpuAlternativeView(measured: CpuAlternative): HTMLElement {
  const batches = measured.batch_sizes;
  const models: [string, string][] = [
    ["default", "This model (tensorrt rules: its Q/DQ run as float on a CPU)"],
    [measured.platform, `Platform ${measured.platform} (${measured.objective})`],
  ];
  const rows = models.map(([key, name]) => [
    name,
    ...batches.map((batch) => speedup(measured.speedup_p50[key]?.[`batch_${batch}`])),
    num(measured.cosine[key], 5),
  ]);
  return h(
    "section",
    { "aria-labelledby": "cpu-alternative-title", id: "cpu-alternative" },
    h("h3", { id: "cpu-alternative-title" }, `Recommended for a CPU: platform ${measured.platform}`),
    h(
      "p",
      { class: "notice info", role: "status", id: "cpu-alternative-statement" },
      `Because ${measured.why}, the worker also quantized this model for platform ${measured.platform} and measured both on its CPU. ` +
        `Quantize again with platform ${measured.platform}: its default cpu_objective latency also keeps float the regions slower quantized, so the model is never slower than FP32.`,
    ),
    scroll(
      "CPU alternative",
      table(
        null,
        ["Model", ...batches.map((b) => `Speed-up over FP32 at batch ${b} (p50)`), `Cosine to FP32 (${measured.output ?? "main output"})`],
        rows,
        { class: "data compact", id: "cpu-alternative-table" },
      ),
    ),
    h("p", { class: "hint" }, `Timed interleaved with FP32, ${measured.threads} thread(s); cosine as deployed on ONNX Runtime's CPU EP.`),
  );
}
