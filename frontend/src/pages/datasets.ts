import { api, message, unwrap, type Dataset } from "../api/client";
import { bytes, h, notice, shortId, table, when } from "../dom";
import { uploadForm } from "../upload";

export async function renderDatasets(main: HTMLElement): Promise<void> {
  const list = h("section", { "aria-labelledby": "datasets-list" });
  const load = async (): Promise<void> => {
    try {
      const page = unwrap(await api.GET("/api/v1/datasets", { params: { query: { limit: 100 } } }));
      list.replaceChildren(h("h2", { id: "datasets-list" }, "Datasets"), datasetTable(page.items));
    } catch (error) {
      list.replaceChildren(notice(`Could not list datasets: ${message(error)}`));
    }
  };
  main.append(
    h("h1", {}, "Datasets"),
    uploadForm({
      path: "/api/v1/datasets",
      id: "dataset-file",
      label: "Upload calibration data",
      accept: ".npz,.zip",
      hint: "An .npz of arrays named after the model's inputs, first axis = samples (an optional 'labels' array enables top-1); or a .zip of JPEG/PNG images, one folder per class or with a labels.csv (file,label). Jobs on images need the recipe's preprocessing section.",
      onDone: () => void load(),
    }),
    list,
  );
  await load();
}

function datasetTable(datasets: Dataset[]): HTMLElement {
  if (!datasets.length) return h("p", {}, "No datasets yet: upload one above.");
  return table(
    null,
    ["Dataset", "Samples", "Contents", "Size", "Uploaded"],
    datasets.map((d) => [
      h("span", {}, d.filename, " ", h("span", { class: "muted" }, `(${shortId(d.id)})`)),
      // null: the arrays share no first axis; a job counts samples along each model input's batch axis
      d.num_samples === null ? h("span", { class: "muted" }, "per input") : d.num_samples.toLocaleString("en"),
      d.images ? imageSummary(d) : h(
        "ul",
        { class: "plain" },
        d.arrays.map((a) => h("li", {}, h("code", {}, a.name), ` ${a.dtype} [${a.shape.join(", ")}]`)),
      ),
      bytes(d.size_bytes),
      when(d.created_at),
    ]),
    { class: "data", id: "datasets-table" },
  );
}

function imageSummary(d: Dataset): HTMLElement {
  const images = d.images!;
  const formats = Object.entries(images.formats).map(([format, count]) => `${count} ${format}`).join(", ");
  const labels = images.label_source
    ? `${images.classes.length} classes from ${images.label_source === "csv" ? "labels.csv" : "folders"}`
    : "unlabelled";
  return h("span", {}, `images (${formats}); ${labels}`, d.status !== "ready" ? h("span", { class: "muted" }, ` — ${d.status}`) : "");
}
