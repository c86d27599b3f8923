// A job's recipe in one line: the choices that set jobs of one model apart, for the jobs list and
// the compare page (which read them from differently shaped answers).

export interface RecipeChoices {
  platform?: unknown;
  precision?: unknown;
  observer?: unknown;
  percentile?: unknown; // shown with observer percentile only
  samples?: unknown; // calibration samples
  reconstruction?: unknown; // the method; "none" is left out
  target?: { [key: string]: unknown } | null;
  strategy?: unknown; // "fixed" is left out: the reader assumes it
  objective?: { [key: string]: unknown } | null; // strategy auto's objective, shown with auto only
}

/** "tensorrt int8 percentile 99.99 n=512 qdrop target cosine ≥ 0.999", "onnxruntime int8 auto cosine ≥ 0.99" */
export function recipeText(choices: RecipeChoices): string {
  const { target, objective } = choices;
  const auto = choices.strategy === "auto";
  const parts = [
    choices.platform,
    choices.precision,
    choices.observer,
    choices.observer === "percentile" ? choices.percentile : null,
    choices.samples ? `n=${String(choices.samples)}` : null,
    choices.reconstruction && choices.reconstruction !== "none" ? choices.reconstruction : null,
    target?.metric ? boundText("target", target) : null,
    auto ? (objective?.metric ? boundText("auto", objective) : "auto") : null,
  ];
  return parts.filter((part) => part !== null && part !== undefined && part !== "").join(" ") || "—";
}

function boundText(name: string, target: { [key: string]: unknown }): string {
  // top1_drop is met at or below its threshold (points lost), cosine and sqnr at or above
  const bound = `${name} ${String(target.metric)} ${target.metric === "top1_drop" ? "≤" : "≥"} ${String(target.threshold)}`;
  return typeof target.max_float_layers === "number" ? `${bound} (≤ ${target.max_float_layers} float layers)` : bound;
}
