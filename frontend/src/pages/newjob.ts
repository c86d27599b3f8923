import { ApiError, api, message, unwrap } from "../api/client";
import { h, notice, shortId } from "../dom";
import { leadChoices } from "../leadchoices";
import { recipeForm, schemaForm } from "../schemaform";
import { navigate } from "../router";

/** How the settings are found: a search (the default) or fixed starting points. Each only sets fields, the rest keep the service's defaults. */
const PRESETS: { name: string; description: string; recipe: Record<string, unknown> }[] = [
  {
    name: "Search",
    description: "Try variations (observers, equalization, bias correction, SmoothQuant, AdaRound) for up to 15 minutes and keep the best for what matters most.",
    recipe: { strategy: "auto" },
  },
  { name: "Defaults", description: "No search: percentile 99.99 calibration on 512 samples.", recipe: { strategy: "fixed" } },
  {
    name: "Quick check",
    description: "No search: min/max ranges from 128 samples; fastest, a first look at the damage.",
    recipe: { strategy: "fixed", calibration: { observer: "minmax", num_samples: 128 } },
  },
  {
    name: "Careful",
    description: "No search: percentile 99.999 over 2048 samples, evaluated on up to 5000 held-out samples.",
    recipe: { strategy: "fixed", calibration: { observer: "percentile", percentile: 99.999, num_samples: 2048 }, evaluation: { max_samples: 5000 } },
  },
];

export async function renderNewJob(main: HTMLElement, _params: Record<string, string>, query: URLSearchParams): Promise<void> {
  main.append(h("h1", {}, "New job"));
  let models, datasets;
  try {
    [models, datasets] = await Promise.all([
      api.GET("/api/v1/models", { params: { query: { limit: 200 } } }).then(unwrap),
      api.GET("/api/v1/datasets", { params: { query: { limit: 200 } } }).then(unwrap),
    ]);
  } catch (error) {
    main.append(notice(message(error)));
    return;
  }
  const ready = models.items.filter((m) => m.status === "ready");
  if (!ready.length || !datasets.items.length) {
    main.append(
      h(
        "p",
        {},
        "A job needs a ready model and a dataset. ",
        h("a", { href: "/models" }, "Upload a model"),
        " and ",
        h("a", { href: "/datasets" }, "a dataset"),
        " first.",
      ),
    );
    return;
  }
  const wanted = query.get("model");
  const modelSelect = h(
    "select",
    { id: "f-model_id", name: "model_id", "aria-describedby": "f-model_id-error" },
    ready.map((m) => h("option", { value: m.id, selected: m.id === wanted }, `${m.filename} (${shortId(m.id)})`)),
  );
  const datasetSelect = h(
    "select",
    { id: "f-dataset_id", name: "dataset_id", "aria-describedby": "f-dataset_id-error" },
    datasets.items.map((d) => h("option", { value: d.id }, `${d.filename} (${shortId(d.id)}, ${d.num_samples ?? "per-input"} ${d.kind === "images" ? "images" : "samples"})`)),
  );
  const topErrors: Record<string, HTMLElement> = {
    model_id: h("p", { id: "f-model_id-error", class: "field-error", hidden: true }),
    dataset_id: h("p", { id: "f-dataset_id-error", class: "field-error", hidden: true }),
  };
  const recipe = recipeForm();
  // Image datasets need the preprocessing section: switch it on when one is picked.
  const syncPreprocessing = (): void => {
    if (datasets.items.find((d) => d.id === datasetSelect.value)?.kind === "images") recipe.set({ preprocessing: {} });
  };
  datasetSelect.addEventListener("change", syncPreprocessing);
  const lead = leadChoices(() => recipe.set(lead.recipe()));
  let preset = PRESETS[0];
  // The Advanced form from scratch: its defaults, then the lead answers, then the preset.
  const applyChoices = (): void => {
    recipe.reset();
    recipe.set(lead.recipe());
    recipe.set(preset.recipe);
    syncPreprocessing();
  };
  applyChoices();
  const advanced = h(
    "details",
    { class: "advanced", id: "advanced" },
    h("summary", {}, "Advanced: every recipe field"),
    h("p", { class: "hint" }, "The answers above fill these in; anything changed here is sent as shown."),
    recipe.el,
  );
  // Whatever else a job request takes besides the recipe (e.g. a one-off webhook URL).
  const extras = schemaForm("JobCreate", "", ["model_id", "dataset_id", "recipe"]);
  const summary = h("div", { id: "form-errors" });
  const submit = h("button", { type: "submit" }, "Start job");
  const form = h(
    "form",
    { class: "card", novalidate: true },
    h(
      "div",
      { class: "grid2" },
      h("div", { class: "field" }, h("label", { for: "f-model_id" }, "Model"), modelSelect, topErrors.model_id),
      h("div", { class: "field" }, h("label", { for: "f-dataset_id" }, "Dataset"), datasetSelect, topErrors.dataset_id),
    ),
    lead.el,
    h(
      "fieldset",
      { class: "presets" },
      h("legend", {}, "How should the settings be found?"),
      PRESETS.map((choice, i) =>
        h(
          "label",
          { class: "preset" },
          h("input", {
            type: "radio",
            name: "preset",
            value: choice.name,
            checked: i === 0,
            onchange: () => {
              preset = choice;
              applyChoices();
            },
          }),
          h("span", {}, h("strong", {}, choice.name), " — ", choice.description),
        ),
      ),
    ),
    advanced,
    extras.el.childElementCount ? h("fieldset", { class: "group" }, h("legend", {}, "Also"), extras.el) : "",
    summary,
    submit,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    recipe.clearErrors();
    extras.clearErrors();
    summary.replaceChildren();
    for (const slot of Object.values(topErrors)) slot.hidden = true;
    submit.disabled = true;
    try {
      const body = { ...extras.value(), model_id: modelSelect.value, dataset_id: datasetSelect.value, recipe: recipe.value() };
      // The recipe is checked by the server; the generated type is for what the form guarantees.
      const job = unwrap(await api.POST("/api/v1/jobs", { body: body as never }));
      const secrets = Object.entries(job).filter(([key, value]) => /secret/.test(key) && typeof value === "string");
      if (!secrets.length) {
        navigate(`/jobs/${job.id}`);
        return;
      }
      // A secret is shown once: keep the visitor here until they have copied it.
      form.replaceWith(
        h(
          "div",
          { class: "card", role: "status" },
          h("p", {}, "The job was started. Copy this now; it is not shown again:"),
          secrets.map(([key, value]) => h("p", {}, h("strong", {}, `${key}: `), h("code", { class: "wrap" }, String(value)))),
          h("a", { class: "button", href: `/jobs/${job.id}` }, "Go to the job"),
        ),
      );
    } catch (error) {
      const errors = error instanceof ApiError ? error.problem.errors ?? [] : [];
      // An error beside a field the reader cannot see is no help: open Advanced first.
      if (errors.some((e) => e.field.startsWith("recipe."))) advanced.open = true;
      const rest = extras.showErrors(recipe.showErrors(errors)).filter((e) => {
        const slot = topErrors[e.field];
        if (!slot) return true;
        slot.textContent = e.message;
        slot.hidden = false;
        return false;
      });
      summary.replaceChildren(
        notice(errors.length ? "The job was not started: fix the fields marked above." : `The job was not started: ${message(error)}`),
        rest.length ? h("ul", {}, rest.map((e) => h("li", {}, h("code", {}, e.field), `: ${e.message}`))) : "",
      );
    } finally {
      submit.disabled = false;
    }
  });
  main.append(form);
}
