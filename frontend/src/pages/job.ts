import { api, authedFetch, message, modelName, TERMINAL, unwrap, type Artifact, type Job } from "../api/client";
import { bytes, h, notice, progressBar, setProgress, shortId, statusBadge, table, when } from "../dom";
import { renderReport } from "../report";
import { followEvents, type JobEvent } from "../sse";

const MAX_LOG_LINES = 500;

export async function renderJob(main: HTMLElement, params: Record<string, string>): Promise<() => void> {
  const cleanups: (() => void)[] = [];
  const done = () => cleanups.forEach((fn) => fn());
  let job: Job;
  try {
    job = unwrap(await api.GET("/api/v1/jobs/{job_id}", { params: { path: { job_id: params.id } } }));
  } catch (error) {
    main.append(h("h1", {}, "Job"), notice(message(error)));
    return done;
  }
  const status = h("span", { id: "job-status" }, statusBadge(job.status));
  const stage = h("span", { id: "job-stage" }, job.stage ?? "—");
  const bar = progressBar(job.progress, "Job progress");
  const pct = h("span", {}, `${Math.round(job.progress * 100)} %`);
  const model = (await modelName(job.model_id)) ?? shortId(job.model_id);
  let facts = jobFacts(job, model);
  const errorBox = h("div", {});
  const cancel = h("button", { type: "button", class: "danger", id: "cancel-job" }, "Cancel job");
  const connection = h("span", { class: "muted", id: "stream-state" });
  // Focusable so keyboard users can scroll it; role=log makes new lines polite announcements.
  const log = h("ol", { id: "event-log" });
  const logBox = h("div", { class: "log", role: "log", tabindex: 0, "aria-labelledby": "log-title" }, log);
  const results = h("div", {});

  main.append(
    h("h1", {}, "Job ", h("code", {}, shortId(job.id))),
    h(
      "div",
      { class: "card live", role: "status", "aria-live": "polite" },
      h("div", { class: "row" }, status, h("span", {}, "Stage: ", stage), pct, connection),
      bar,
    ),
    facts,
    errorBox,
    TERMINAL.includes(job.status) ? "" : h("p", {}, cancel),
    h("details", {}, h("summary", {}, "Recipe"), h("pre", {}, JSON.stringify(job.recipe, null, 2))),
    h("section", { "aria-labelledby": "log-title" }, h("h2", { id: "log-title" }, "Events"), logBox),
    results,
  );
  if (job.error) errorBox.append(notice(job.error));

  cancel.addEventListener("click", async () => {
    cancel.disabled = true;
    try {
      const updated = unwrap(await api.POST("/api/v1/jobs/{job_id}/cancel", { params: { path: { job_id: job.id } } }));
      status.replaceChildren(statusBadge(updated.status));
    } catch (error) {
      errorBox.replaceChildren(notice(`Cancel failed: ${message(error)}`));
      cancel.disabled = false;
    }
  });

  const onEvent = (event: JobEvent): void => {
    if (event.stage) stage.textContent = event.stage;
    if (typeof event.progress === "number") {
      setProgress(bar, event.progress);
      pct.textContent = `${Math.round(event.progress * 100)} %`;
    }
    const newStatus = event.kind === "status" ? (event.data?.status as string | undefined) : undefined;
    if (newStatus) status.replaceChildren(statusBadge(newStatus));
    log.append(
      h(
        "li",
        { class: `event-${event.kind}` },
        h("time", { datetime: event.created_at }, new Date(event.created_at).toLocaleTimeString("en-GB")),
        h("span", { class: "kind" }, event.kind),
        event.stage ? h("span", { class: "stage" }, event.stage) : null,
        h("span", {}, event.message),
      ),
    );
    while (log.children.length > MAX_LOG_LINES) log.firstElementChild?.remove();
    logBox.scrollTop = logBox.scrollHeight;
    if (newStatus && TERMINAL.includes(newStatus)) void finish();
  };

  const finish = async (): Promise<void> => {
    cancel.closest("p")?.remove();
    try {
      job = unwrap(await api.GET("/api/v1/jobs/{job_id}", { params: { path: { job_id: job.id } } }));
    } catch {
      return;
    }
    status.replaceChildren(statusBadge(job.status));
    const fresh = jobFacts(job, model);
    facts.replaceWith(fresh);
    facts = fresh;
    errorBox.replaceChildren(job.error ? notice(job.error) : "");
    await showResults(job, results, cleanups);
  };

  let ended = TERMINAL.includes(job.status);
  const stream = followEvents(`/api/v1/jobs/${job.id}/events`, {
    onEvent: (event) => {
      if (event.kind === "status" && TERMINAL.includes(String(event.data?.status))) ended = true;
      onEvent(event);
    },
    finished: () => ended,
    onState: (state, detail) => {
      connection.textContent = state === "open" ? "live" : state === "reconnecting" ? "reconnecting…" : state === "error" ? `stream error ${detail ?? ""}` : "";
    },
  });
  cleanups.push(stream.stop);
  return done;
}

async function showResults(job: Job, into: HTMLElement, cleanups: (() => void)[]): Promise<void> {
  into.replaceChildren();
  let artifacts: Artifact[] = [];
  try {
    artifacts = unwrap(await api.GET("/api/v1/jobs/{job_id}/artifacts", { params: { path: { job_id: job.id } } }));
  } catch (error) {
    into.append(notice(`Could not list artifacts: ${message(error)}`));
  }
  if (artifacts.length) {
    into.append(
      h(
        "section",
        { "aria-labelledby": "artifacts-title" },
        h("h2", { id: "artifacts-title" }, "Artifacts"),
        table(
          null,
          ["File", "Type", "Size", "SHA-256", ""],
          artifacts.map((a) => [
            h("code", {}, a.name),
            a.media_type,
            bytes(a.size_bytes),
            h("code", { title: a.sha256 }, a.sha256.slice(0, 12) + "…"),
            h("button", { type: "button", class: "secondary", "aria-label": `Download ${a.name}`, onclick: () => void download(a) }, "Download"),
          ]),
          { class: "data", id: "artifacts-table" },
        ),
      ),
    );
  }
  if (!artifacts.some((a) => a.name === "report.json")) return;
  try {
    const report = unwrap(await api.GET("/api/v1/jobs/{job_id}/report", { params: { path: { job_id: job.id } } }));
    const section = h("section", { "aria-labelledby": "report-title", id: "report" }, h("h2", { id: "report-title" }, "Report"));
    into.append(section);
    cleanups.push(renderReport(section, report as never));
  } catch (error) {
    into.append(notice(`Could not read the report: ${message(error)}`));
  }
}

/** Artifacts need the key header, so a plain link will not do: fetch, then save the blob. */
export async function download(artifact: Artifact): Promise<void> {
  const response = await authedFetch(artifact.url);
  const blob = await response.blob();
  const url = URL.createObjectURL(blob);
  const link = h("a", { href: url, download: artifact.name, hidden: true });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

function jobFacts(job: Job, model: string): HTMLElement {
  return h(
    "dl",
    { class: "facts" },
    fact("Job id", h("code", {}, job.id)),
    fact("Model", h("a", { href: `/models/${job.model_id}` }, model)),
    fact("Dataset", h("code", {}, shortId(job.dataset_id))),
    fact("Created", when(job.created_at)),
    fact("Started", when(job.started_at)),
    fact("Finished", when(job.finished_at)),
    fact("Attempts", job.attempts),
  );
}

function fact(term: string, value: Node | string | number): HTMLElement[] {
  return [h("dt", {}, term), h("dd", {}, value)];
}
