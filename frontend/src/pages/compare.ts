import { api, message, unwrap, type Job, type Model } from "../api/client";
import { chart, PALETTE } from "../charts";
import { bytes, h, notice, num, percent, shortId, statusBadge, table, when } from "../dom";

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);
const MAX_PAGES = 10;

interface Row {
  job: Job;
  report: Obj | null;
  top1: number | null;
  sqnr: number | null;
  size: number | null;
  latency: number | null;
}

/** Every job of one model side by side, and accuracy against size or latency. */
export async function renderCompare(main: HTMLElement, params: Record<string, string>): Promise<(() => void) | void> {
  let model: Model;
  try {
    model = unwrap(await api.GET("/api/v1/models/{model_id}", { params: { path: { model_id: params.id } } }));
  } catch (error) {
    main.append(h("h1", {}, "Compare jobs"), notice(message(error)));
    return;
  }
  main.append(h("h1", {}, "Compare jobs of ", h("a", { href: `/models/${model.id}` }, model.filename)));
  const jobs: Job[] = [];
  let cursor: string | null | undefined = undefined;
  // The list has no model filter yet: read pages (newest first) and keep this model's jobs.
  for (let i = 0; i < MAX_PAGES; i++) {
    const page: { items: Job[]; next_cursor?: string | null } = unwrap(await api.GET("/api/v1/jobs", { params: { query: { limit: 200, ...(cursor ? { cursor } : {}) } } }));
    jobs.push(...page.items.filter((j) => j.model_id === model.id));
    cursor = page.next_cursor;
    if (!cursor) break;
  }
  if (!jobs.length) {
    main.append(h("p", {}, "This model has no jobs yet. ", h("a", { href: `/jobs/new?model=${model.id}` }, "Start one"), "."));
    return;
  }
  const rows: Row[] = await Promise.all(
    jobs.map(async (job) => {
      let report: Obj | null = null;
      if (job.status === "succeeded") {
        const result = await api.GET("/api/v1/jobs/{job_id}/report", { params: { path: { job_id: job.id } } });
        report = isObj(result.data) ? result.data : null;
      }
      return { job, report, ...metrics(report) };
    }),
  );
  main.append(
    h(
      "div",
      { class: "scroll" },
      table(
        null,
        ["Job", "Status", "Recipe", "Top-1 (QDQ)", "SQNR dB", "QDQ size", "Latency (ms)", "Created"],
        rows.map((r) => [
          h("a", { href: `/jobs/${r.job.id}` }, h("code", {}, shortId(r.job.id))),
          statusBadge(r.job.status),
          h("code", { class: "recipe-summary" }, recipeSummary(r.job.recipe)),
          percent(r.top1),
          num(r.sqnr, 2),
          r.size === null ? "—" : bytes(r.size),
          num(r.latency, 3),
          when(r.job.created_at),
        ]),
        { class: "data", id: "compare-table" },
      ),
    ),
  );
  const plotted = rows.filter((r) => (r.top1 ?? r.sqnr) !== null && (r.latency ?? r.size) !== null);
  if (!plotted.length) return;
  const useTop1 = plotted.every((r) => r.top1 !== null);
  const axes = [
    { key: "size", title: "quantized size (KiB)", value: (r: Row) => (r.size === null ? null : r.size / 1024) },
    { key: "latency", title: "latency (ms)", value: (r: Row) => r.latency },
  ].filter((axis) => plotted.every((r) => axis.value(r) !== null));
  if (!axes.length) return;
  const yTitle = useTop1 ? "top-1 (%)" : "SQNR (dB)";
  const section = h("section", { "aria-labelledby": "plot-title" });
  let destroy = () => {};
  const draw = (axis: (typeof axes)[number]): void => {
    destroy();
    const points = plotted.map((r) => ({ x: axis.value(r) as number, y: useTop1 ? (r.top1 as number) * 100 : (r.sqnr as number) }));
    const plot = chart(
      {
        type: "scatter",
        data: {
          datasets: plotted.map((r, i) => ({
            label: `${shortId(r.job.id)} ${recipeSummary(r.job.recipe)}`,
            data: [points[i]],
            backgroundColor: PALETTE[i % PALETTE.length],
            pointRadius: 6,
            clip: false as const, // a point at 100 % sits on the edge: draw it whole
          })),
        },
        options: {
          plugins: { legend: { position: "bottom" } },
          scales: {
            x: { title: { display: true, text: axis.title } },
            y: { title: { display: true, text: yTitle }, ...(useTop1 ? { suggestedMin: 90, max: 100 } : {}) },
          },
        },
      },
      `${yTitle} against ${axis.title}: ` + plotted.map((r, i) => `job ${shortId(r.job.id)} ${num(points[i].y, 2)} at ${num(points[i].x, 3)}`).join("; "),
      320,
    );
    destroy = plot.destroy;
    section.querySelector(".chart")?.remove();
    (section.querySelector("#plot-title") as HTMLElement).textContent = `${yTitle} against ${axis.title}`;
    section.append(plot.el);
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
  main.append(section);
  draw(axes[0]);
  return () => destroy();
}

function metrics(report: Obj | null): Omit<Row, "job" | "report"> {
  const evaluation = isObj(report?.evaluation) ? report.evaluation : {};
  const exact = isObj(evaluation.qdq_exact) ? evaluation.qdq_exact : {};
  const model = isObj(evaluation.model) ? evaluation.model : {};
  const outputs = isObj(exact.outputs) ? Object.values(exact.outputs).filter(isObj) : [];
  const first = outputs[0] ?? {};
  return {
    top1: typeof exact.top1 === "number" ? exact.top1 : null,
    sqnr: typeof first.sqnr_db === "number" ? first.sqnr_db : null,
    size: typeof model.qdq_bytes === "number" ? model.qdq_bytes : null,
    latency: findLatency(evaluation),
  };
}

/** The quantized model's latency, wherever a report version puts it (null until measured). */
function findLatency(evaluation: Obj): number | null {
  // {latency_ms_per_sample: {fp32, qdq_exact, qdq_deployed}}: the deployed model's figure.
  for (const [key, value] of Object.entries(evaluation)) {
    if (!/latency/.test(key) || !isObj(value)) continue;
    const quantized = value.qdq_deployed ?? value.qdq_exact ?? value.qdq ?? value.quantized;
    if (typeof quantized === "number") return quantized;
  }
  for (const key of ["qdq_deployed", "latency", "qdq_exact"]) {
    const v = evaluation[key];
    if (!isObj(v)) continue;
    for (const [k, value] of Object.entries(v)) {
      if (/latency/.test(k) && typeof value === "number") return value;
      if (/latency/.test(k) && isObj(value)) {
        const inner = value.qdq ?? value.quantized ?? value.mean_ms ?? value.p50_ms;
        if (typeof inner === "number") return inner;
      }
    }
  }
  return null;
}

function recipeSummary(recipe: Obj): string {
  const calibration = isObj(recipe.calibration) ? recipe.calibration : {};
  const parts = [recipe.platform, recipe.precision, calibration.observer, calibration.observer === "percentile" ? calibration.percentile : null, calibration.num_samples ? `n=${calibration.num_samples}` : null];
  return parts.filter((p) => p !== null && p !== undefined && p !== "").join(" ");
}
