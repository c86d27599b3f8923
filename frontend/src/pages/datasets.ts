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
      accept: ".npz",
      hint: "An .npz of arrays named after the model's inputs, first axis = samples. An optional 'labels' array enables top-1.",
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
    ["Dataset", "Samples", "Arrays", "Size", "Uploaded"],
    datasets.map((d) => [
      h("span", {}, d.filename, " ", h("span", { class: "muted" }, `(${shortId(d.id)})`)),
      d.num_samples.toLocaleString("en"),
      h(
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
