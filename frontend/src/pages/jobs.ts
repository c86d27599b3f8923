import { api, message, modelName, TERMINAL, unwrap, type Job, type JobStatus } from "../api/client";
import { h, notice, progressBar, shortId, statusBadge, table, when } from "../dom";
import { recipeText } from "../recipetext";
import { navigate } from "../router";

const STATUSES: JobStatus[] = ["queued", "running", "canceling", "succeeded", "failed", "canceled"];
const PAGE = 20;
const POLL_MS = 3000;

/** Jobs, newest first, filtered by status, a page at a time; refreshed while any shown job is live. */
export async function renderJobs(main: HTMLElement, _params: Record<string, string>, query: URLSearchParams): Promise<() => void> {
  const status = (query.get("status") || "") as JobStatus | "";
  const cursor = query.get("cursor");
  const trail = (query.get("trail") || "").split(",").filter(Boolean); // cursors of earlier pages, for "Previous"
  const select = h(
    "select",
    { id: "status-filter", name: "status" },
    h("option", { value: "" }, "any"),
    STATUSES.map((s) => h("option", { value: s, selected: s === status }, s)),
  );
  select.addEventListener("change", () => navigate(select.value ? `/jobs?status=${select.value}` : "/jobs"));
  const body = h("div", { "aria-busy": "true" });
  main.append(
    h("h1", {}, "Jobs"),
    h(
      "div",
      { class: "toolbar" },
      h("label", { for: "status-filter" }, "Status"),
      select,
      h("a", { class: "button", href: "/jobs/new" }, "New job"),
    ),
    body,
  );

  const models = new Map<string, string>();
  let timer: number | undefined;
  let stopped = false;

  const load = async (): Promise<void> => {
    try {
      const params = { limit: PAGE, ...(status ? { status } : {}), ...(cursor ? { cursor } : {}) };
      const page = unwrap(await api.GET("/api/v1/jobs", { params: { query: params } }));
      await nameModels(page.items, models);
      if (stopped) return;
      body.replaceChildren(jobTable(page.items, models), pager(status, cursor, trail, page.next_cursor));
      body.setAttribute("aria-busy", "false");
      if (page.items.some((job) => !TERMINAL.includes(job.status))) timer = window.setTimeout(load, POLL_MS);
    } catch (error) {
      body.replaceChildren(notice(`Could not list jobs: ${message(error)}`));
    }
  };
  await load();
  return () => {
    stopped = true;
    window.clearTimeout(timer);
  };
}

async function nameModels(jobs: Job[], names: Map<string, string>): Promise<void> {
  const missing = [...new Set(jobs.map((j) => j.model_id))].filter((id) => !names.has(id));
  await Promise.all(
    missing.map(async (id) => {
      names.set(id, (await modelName(id)) ?? shortId(id));
    }),
  );
}

function jobTable(jobs: Job[], models: Map<string, string>): HTMLElement {
  if (!jobs.length) return h("p", {}, "No jobs match.");
  return table(
    null,
    ["Job", "Model", "Platform", "Recipe", "Status", "Stage", "Progress", "Created", "Finished"],
    jobs.map((job) => [
      h("a", { href: `/jobs/${job.id}` }, h("code", {}, shortId(job.id))),
      h("a", { href: `/models/${job.model_id}` }, models.get(job.model_id) ?? shortId(job.model_id)),
      String(job.recipe.platform ?? "—"),
      recipeText({
        precision: job.recipe.precision,
        observer: section(job.recipe, "calibration").observer,
        percentile: section(job.recipe, "calibration").percentile,
        reconstruction: section(job.recipe, "reconstruction").method,
        target: section(job.recipe, "target"),
        strategy: job.recipe.strategy,
        objective: section(section(job.recipe, "auto"), "objective"),
      }),
      statusBadge(job.status),
      job.stage ?? "—",
      h("div", { class: "cell-progress" }, progressBar(job.progress, `Progress of job ${shortId(job.id)}`), `${Math.round(job.progress * 100)} %`),
      when(job.created_at),
      when(job.finished_at),
    ]),
    { class: "data", id: "jobs-table" },
  );
}

function section(recipe: Job["recipe"], key: string): { [key: string]: unknown } {
  const value = recipe[key];
  return typeof value === "object" && value !== null ? (value as { [key: string]: unknown }) : {};
}

function pager(status: string, cursor: string | null, trail: string[], next: string | null | undefined): HTMLElement {
  const base = (c: string | null, t: string[]) => {
    const q = new URLSearchParams();
    if (status) q.set("status", status);
    if (c) q.set("cursor", c);
    if (t.length) q.set("trail", t.join(","));
    const s = q.toString();
    return s ? `/jobs?${s}` : "/jobs";
  };
  const previous = cursor ? base(trail[trail.length - 1] || null, trail.slice(0, -1)) : null;
  return h(
    "nav",
    { class: "pager", "aria-label": "Pages" },
    previous ? h("a", { href: previous, rel: "prev" }, "← Newer") : null,
    next ? h("a", { href: base(next, cursor ? [...trail, cursor] : trail), rel: "next" }, "Older →") : null,
  );
}
