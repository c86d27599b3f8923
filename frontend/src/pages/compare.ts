import { api, message, unwrap, type Schemas } from "../api/client";
import { scatter } from "../charts";
import { bytes, h, notice, num, percent, shortId, statusBadge, table, when } from "../dom";
import { recipeText, type RecipeChoices } from "../recipetext";
import { download } from "./job";

type Comparison = Schemas["ModelComparison"];
type Row = Schemas["ComparisonRow"];
type Recipe = Schemas["RecipeSummary"];
const PAGE = 50;

/** Every job of one model side by side (GET /models/{id}/comparison), and accuracy against size or latency. */
export async function renderCompare(main: HTMLElement, params: Record<string, string>): Promise<(() => void) | void> {
  let first: Comparison;
  try {
    first = await fetchPage(params.id, null);
  } catch (error) {
    main.append(h("h1", {}, "Compare jobs"), notice(message(error)));
    return;
  }
  main.append(h("h1", {}, "Compare jobs of ", h("a", { href: `/models/${first.model_id}` }, first.filename)));
  if (!first.items.length) {
    main.append(h("p", {}, "This model has no jobs yet. ", h("a", { href: `/jobs/new?model=${first.model_id}` }, "Start one"), "."));
    return;
  }
  const rows: Row[] = [...first.items];
  let cursor = first.next_cursor;
  const tableHolder = h("div", { class: "scroll" });
  const more = h("button", { type: "button", class: "secondary", id: "compare-more" }, "Load older jobs");
  const plot = h("section", { "aria-labelledby": "plot-title" });
  let destroy = () => {};
  const render = (): void => {
    tableHolder.replaceChildren(comparisonTable(rows, first.size_bytes));
    more.hidden = !cursor;
    destroy();
    destroy = drawPlot(plot, rows);
  };
  more.addEventListener("click", async () => {
    more.disabled = true;
    try {
      const next = await fetchPage(params.id, cursor ?? null);
      rows.push(...next.items);
      cursor = next.next_cursor;
      render();
    } catch (error) {
      main.append(notice(message(error)));
    } finally {
      more.disabled = false;
    }
  });
  main.append(
    h("p", { class: "hint" }, "Accuracy of the QDQ model in exact QDQ arithmetic on each job's held-out samples; latency is the ONNX Runtime CPU median at batch 1."),
    tableHolder,
    more,
    plot,
  );
  render();
  return () => destroy();
}

async function fetchPage(modelId: string, cursor: string | null): Promise<Comparison> {
  const query = { limit: PAGE, ...(cursor ? { cursor } : {}) };
  return unwrap(await api.GET("/api/v1/models/{model_id}/comparison", { params: { path: { model_id: modelId }, query } }));
}

function comparisonTable(rows: Row[], fp32Bytes: number): HTMLTableElement {
  return table(
    null,
    ["Job", "Status", "Recipe", "Top-1 FP32 → QDQ", "Δ top-1 (points)", "Min SQNR dB", "Min cosine", "Size FP32 → QDQ", "CPU p50 ms FP32 → QDQ", "Artifacts", "Created"],
    rows.map((r) => [
      h("a", { href: `/jobs/${r.job_id}` }, h("code", {}, shortId(r.job_id))),
      r.error ? h("span", { title: r.error }, statusBadge(r.status)) : statusBadge(r.status),
      h("code", { class: "recipe-summary" }, recipeText(choices(r.recipe))),
      pair(percent(r.metrics?.top1_fp32), percent(r.metrics?.top1_quantized)),
      num(r.metrics?.top1_drop, 2),
      num(r.metrics?.sqnr_db_min, 2),
      num(r.metrics?.cosine_min, 5),
      pair(bytes(r.size?.fp32_bytes ?? fp32Bytes), bytes(r.size?.quantized_bytes)),
      pair(num(r.latency?.fp32_p50_ms, 3), num(r.latency?.quantized_p50_ms, 3)),
      h(
        "span",
        { class: "artifact-links" },
        r.artifacts.map((a) =>
          h("button", { type: "button", class: "link", "aria-label": `Download ${a.name} of job ${shortId(r.job_id)}`, onclick: () => void download(a) }, a.name),
        ),
      ),
      when(r.created_at),
    ]),
    { class: "data fit", id: "compare-table" },
  );
}

function pair(before: string, after: string): string {
  return before === "—" && after === "—" ? "—" : `${before} → ${after}`;
}

function choices(recipe: Recipe): RecipeChoices {
  return {
    ...recipe,
    samples: recipe.calibration_samples,
    reconstruction: recipe.reconstruction ? (recipe.reconstruction.method ?? "on") : null,
    objective: (recipe.auto?.objective as RecipeChoices["objective"]) ?? null,
  };
}

/** A scatter of accuracy (top-1, or min SQNR without labels) against quantized size or latency. */
function drawPlot(section: HTMLElement, rows: Row[]): () => void {
  section.replaceChildren();
  const plotted = rows.filter((r) => (r.metrics?.top1_quantized ?? r.metrics?.sqnr_db_min ?? null) !== null);
  if (!plotted.length) return () => {};
  const useTop1 = plotted.every((r) => r.metrics?.top1_quantized !== null && r.metrics?.top1_quantized !== undefined);
  const axes = [
    { key: "size", title: "quantized size (KiB)", value: (r: Row) => (r.size?.quantized_bytes == null ? null : r.size.quantized_bytes / 1024) },
    { key: "latency", title: "CPU p50 latency (ms)", value: (r: Row) => r.latency?.quantized_p50_ms ?? null },
  ].filter((axis) => plotted.every((r) => axis.value(r) !== null));
  if (!axes.length) return () => {};
  const yTitle = useTop1 ? "top-1 (%)" : "min SQNR (dB)";
  const y = (r: Row): number => (useTop1 ? (r.metrics?.top1_quantized as number) * 100 : (r.metrics?.sqnr_db_min as number));
  let destroy = () => {};
  const draw = (axis: (typeof axes)[number]): void => {
    destroy();
    const points = plotted.map((r) => ({ x: axis.value(r) as number, y: y(r) }));
    const made = scatter(
      plotted.map((r, i) => ({ label: `${shortId(r.job_id)} ${recipeText(choices(r.recipe))}`, ...points[i] })),
      { x: axis.title, y: yTitle, yMax: useTop1 ? 100 : undefined },
      `${yTitle} against ${axis.title}: ` + plotted.map((r, i) => `job ${shortId(r.job_id)} ${num(points[i].y, 2)} at ${num(points[i].x, 3)}`).join("; "),
    );
    destroy = made.destroy;
    section.querySelector(".chart")?.remove();
    (section.querySelector("#plot-title") as HTMLElement).textContent = `${yTitle} against ${axis.title}`;
    section.append(made.el);
  };
  const select = h(
    "select",
    { id: "plot-axis" },
    axes.map((axis) => h("option", { value: axis.key }, axis.title)),
  );
  select.addEventListener("change", () => draw(axes.find((a) => a.key === select.value) ?? axes[0]));
  section.append(
    h("h2", { id: "plot-title" }),
    axes.length > 1 ? h("div", { class: "toolbar" }, h("label", { for: "plot-axis" }, "Horizontal axis"), select) : "",
  );
  draw(axes[0]);
  return () => destroy();
}
