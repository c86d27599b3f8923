import { ApiError, api, message, unwrap, type Schemas } from "../api/client";
import { h, notice, shortId, statusBadge, table, when } from "../dom";
import { schemaForm } from "../schemaform";

type Endpoint = Schemas["WebhookPublic"];
type Delivery = Schemas["DeliveryPublic"];
const POLL_MS = 2000;
const ROTATION_OVERLAP_S = 24 * 3600; // the old secret keeps signing for a day, as the service defaults

/** Endpoints (create, test, enable/disable, rotate, delete), then every delivery with its attempts. */
export async function renderWebhooks(main: HTMLElement): Promise<() => void> {
  let timer: number | undefined;
  let stopped = false;
  const endpointsBox = h("section", { "aria-labelledby": "endpoints-title" });
  const deliveriesBox = h("section", { "aria-labelledby": "deliveries-title" });
  const flash = h("div", { "aria-live": "polite" });
  const secretBox = h("div", {}); // apart from `flash`, so the next action's message does not hide it

  const reload = async (): Promise<void> => {
    try {
      const [endpoints, deliveries] = await Promise.all([
        api.GET("/api/v1/webhooks", { params: { query: { limit: 200 } } }).then(unwrap),
        api.GET("/api/v1/webhooks/deliveries", { params: { query: { limit: 100 } } }).then(unwrap),
      ]);
      endpointsBox.replaceChildren(h("h2", { id: "endpoints-title" }, "Endpoints"), endpointTable(endpoints.items));
      deliveriesBox.replaceChildren(h("h2", { id: "deliveries-title" }, "Deliveries"), deliveryTable(deliveries.items));
      // Pending deliveries change on their own (the worker sends and retries): follow them.
      window.clearTimeout(timer);
      if (!stopped && deliveries.items.some((d) => d.status === "pending")) timer = window.setTimeout(() => void reload(), POLL_MS);
    } catch (error) {
      endpointsBox.replaceChildren(notice(`Could not list webhooks: ${message(error)}`));
    }
  };

  /** Run an action; show its outcome (or problem) and refresh the lists. */
  const act = async (what: string, run: () => Promise<unknown>): Promise<void> => {
    try {
      await run();
      flash.replaceChildren(notice(`${what}: done.`, "info"));
    } catch (error) {
      flash.replaceChildren(notice(`${what} failed: ${message(error)}`));
    }
    await reload();
  };

  const showSecret = (endpoint: Schemas["WebhookWithSecret"]): void => {
    secretBox.replaceChildren(
      h(
        "div",
        { class: "notice info", role: "status" },
        h("p", {}, `Signing secret for ${endpoint.url}. Copy it now; it is not shown again:`),
        h("code", { class: "wrap", id: "webhook-secret" }, endpoint.secret),
      ),
    );
  };

  function endpointTable(endpoints: Endpoint[]): HTMLElement {
    if (!endpoints.length) return h("p", {}, "No endpoints yet.");
    return table(
      null,
      ["URL", "Events", "State", "Description", "Created", "Actions"],
      endpoints.map((e) => [
        h("code", { class: "wrap" }, e.url),
        e.event_types.join(", "),
        h("span", {}, statusBadge(e.enabled ? "enabled" : "disabled"), e.disabled_reason ? h("div", { class: "hint" }, e.disabled_reason) : ""),
        e.description || "—",
        when(e.created_at),
        h(
          "div",
          { class: "actions" },
          button("Send test", `Send test to ${e.url}`, () =>
            act("Test ping", async () => unwrap(await api.POST("/api/v1/webhooks/{webhook_id}/test", { params: { path: { webhook_id: e.id } } }))),
          ),
          button(e.enabled ? "Disable" : "Enable", `${e.enabled ? "Disable" : "Enable"} ${e.url}`, () =>
            act(e.enabled ? "Disable" : "Enable", async () =>
              unwrap(await api.PATCH("/api/v1/webhooks/{webhook_id}", { params: { path: { webhook_id: e.id } }, body: { enabled: !e.enabled } })),
            ),
          ),
          button("Rotate secret", `Rotate secret of ${e.url}`, async () => {
            try {
              const rotated = unwrap(
                await api.POST("/api/v1/webhooks/{webhook_id}/rotate-secret", { params: { path: { webhook_id: e.id } }, body: { overlap_seconds: ROTATION_OVERLAP_S } }),
              );
              showSecret(rotated);
            } catch (error) {
              flash.replaceChildren(notice(`Rotate failed: ${message(error)}`));
            }
          }),
          button("Delete", `Delete ${e.url}`, () => {
            if (!window.confirm(`Delete the endpoint ${e.url} and its delivery log?`)) return;
            void act("Delete", async () => {
              const { response } = await api.DELETE("/api/v1/webhooks/{webhook_id}", { params: { path: { webhook_id: e.id } } });
              if (!response.ok) throw new ApiError(response.status, { detail: `HTTP ${response.status}` });
            });
          }),
        ),
      ]),
      { class: "data", id: "webhooks-table" },
    );
  }

  function deliveryTable(deliveries: Delivery[]): HTMLElement {
    if (!deliveries.length) return h("p", {}, "No deliveries yet: they appear when a job ends or a test ping is sent.");
    return table(
      null,
      ["Created", "Event", "Job", "Target", "Status", "Attempts", "Next attempt", ""],
      deliveries.map((d) => [
        when(d.created_at),
        d.event_type,
        d.job_id ? h("a", { href: `/jobs/${d.job_id}` }, h("code", {}, shortId(d.job_id))) : "—",
        h("code", { class: "wrap" }, d.url),
        h("span", {}, statusBadge(d.status), d.last_error ? h("div", { class: "hint" }, d.last_error) : ""),
        d.attempt_log.length
          ? h(
              "details",
              {},
              h("summary", {}, `${d.attempts} attempt${d.attempts === 1 ? "" : "s"}`),
              table(
                null,
                ["At", "HTTP", "ms", "Response / error"],
                d.attempt_log.map((a) => [when(a.attempted_at), a.status_code ?? "—", a.latency_ms?.toFixed(0) ?? "—", a.error || a.response || ""]),
                { class: "data compact" },
              ),
            )
          : String(d.attempts),
        when(d.next_attempt_at),
        d.endpoint_id
          ? button("Replay", `Replay delivery ${shortId(d.id)}`, () =>
              act("Replay", async () =>
                unwrap(
                  await api.POST("/api/v1/webhooks/{webhook_id}/deliveries/{delivery_id}/replay", {
                    params: { path: { webhook_id: d.endpoint_id as string, delivery_id: d.id } },
                  }),
                ),
              ),
            )
          : "",
      ]),
      { class: "data", id: "deliveries-table" },
    );
  }

  const create = schemaForm("WebhookCreate");
  const createSummary = h("div", {});
  const form = h(
    "form",
    { class: "card", novalidate: true, "aria-labelledby": "new-webhook" },
    h("h2", { id: "new-webhook" }, "Add an endpoint"),
    create.el,
    createSummary,
    h("button", { type: "submit" }, "Add endpoint"),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    create.clearErrors();
    createSummary.replaceChildren();
    try {
      const endpoint = unwrap(await api.POST("/api/v1/webhooks", { body: create.value() as never }));
      form.reset();
      showSecret(endpoint);
      await reload();
    } catch (error) {
      const rest = create.showErrors(error instanceof ApiError ? error.problem.errors ?? [] : []);
      if (!(error instanceof ApiError && error.problem.errors?.length) || rest.length) createSummary.append(notice(message(error)));
    }
  });

  main.append(
    h("h1", {}, "Webhooks"),
    h("p", { class: "hint" }, "Signed (Standard Webhooks) notifications when a job succeeds, fails or is canceled; retried with backoff, every attempt logged."),
    form,
    secretBox,
    flash,
    endpointsBox,
    deliveriesBox,
  );
  await reload();
  return () => {
    stopped = true;
    window.clearTimeout(timer);
  };
}

function button(text: string, name: string, onclick: () => unknown): HTMLButtonElement {
  return h("button", { type: "button", class: "secondary", "aria-label": name, onclick: () => void onclick() }, text);
}
