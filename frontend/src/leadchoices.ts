// The two questions the new-job page leads with: where the model will run (the recipe's platform)
// and what matters most (strategy auto's objective and the deployment's CPU objective). Each answer
// only sets recipe fields, which the Advanced form below shows and may still change.

import { h } from "./dom";

type RecipePart = Record<string, unknown>;

interface Option<T> {
  value: T;
  title: string;
  line: string; // what choosing it does, in one line
}

const RUNTIMES: Option<string>[] = [
  { value: "tensorrt", title: "TensorRT on an NVIDIA GPU", line: "INT8 with TensorRT's quantization rules; the engine is built where the worker has TensorRT." },
  { value: "tensorrt-fp8", title: "TensorRT FP8 (Hopper/Ada)", line: "FP8 E4M3 for GPUs with FP8 tensor cores (H100, L4, RTX 40xx)." },
  { value: "onnxruntime", title: "ONNX Runtime on a CPU", line: "INT8 QDQ for the CPU's integer kernels." },
  {
    value: "onnxruntime-dynamic",
    title: "ONNX Runtime, transformers with dynamic activations",
    line: "Only MatMuls with constant weights, their inputs quantized at run time: transformers on a CPU.",
  },
];

type Priority = "accuracy" | "balance" | "size";

const PRIORITIES: (Option<Priority> & { recipe: (platform: string) => RecipePart })[] = [
  {
    value: "accuracy",
    title: "Accuracy",
    line: "Outputs within cosine 0.999 of FP32: the search keeps its most harmful layers in float if no setting gets there.",
    recipe: () => objective(0.999, "accuracy"),
  },
  {
    value: "balance",
    title: "Balance",
    line: "Outputs within cosine 0.99 of FP32; on ONNX Runtime (CPU), parts that run slower quantized stay float, so it is never slower than FP32.",
    // deploy.cpu_objective latency times regions on the CPU EP, so only the onnxruntime platform takes it.
    recipe: (platform) => objective(0.99, platform === "onnxruntime" ? "latency" : "accuracy"),
  },
  {
    value: "size",
    title: "Size",
    line: "The smallest model: cosine 0.98 to FP32 is enough, and everything the platform can quantize stays quantized.",
    recipe: () => objective(0.98, "size"),
  },
];

function objective(cosine: number, cpuObjective: string): RecipePart {
  return { auto: { objective: { metric: "cosine", threshold: cosine } }, deploy: { cpu_objective: cpuObjective } };
}

export interface LeadChoices {
  el: HTMLElement;
  /** The recipe fields the current answers set. */
  recipe(): RecipePart;
}

/** The two questions as radio groups; `onChange` runs after either answer changes. */
export function leadChoices(onChange: () => void): LeadChoices {
  const runtime = radios("runs-on", "Where will the model run?", RUNTIMES);
  const priority = radios("matters-most", "What matters most?", PRIORITIES, "balance");
  const el = h("div", { class: "lead grid2" }, runtime.el, priority.el);
  el.addEventListener("change", onChange);
  return {
    el,
    recipe() {
      const platform = runtime.value();
      const chosen = PRIORITIES.find((p) => p.value === priority.value()) as (typeof PRIORITIES)[number];
      return { platform, ...chosen.recipe(platform) };
    },
  };
}

function radios<T extends string>(name: string, question: string, options: Option<T>[], initial = options[0].value): { el: HTMLElement; value: () => T } {
  const inputs = options.map((option) => h("input", { type: "radio", name, value: option.value, id: `${name}-${option.value}`, checked: option.value === initial }));
  const el = h(
    "fieldset",
    { class: "presets" },
    h("legend", {}, question),
    options.map((option, i) =>
      h("label", { class: "preset", for: inputs[i].id }, inputs[i], h("span", {}, h("strong", {}, option.title), " — ", option.line)),
    ),
  );
  return { el, value: () => (inputs.find((input) => input.checked) ?? inputs[0]).value as T };
}
