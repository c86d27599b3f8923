import { api, message, unwrap, type Model } from "../api/client";
import { bytes, h, notice, shortId, statusBadge, table, when } from "../dom";
import { chart } from "../charts";
import { uploadForm } from "../upload";

export async function renderModels(main: HTMLElement): Promise<void> {
  const list = h("section", { "aria-labelledby": "models-list" });
  const load = async (): Promise<void> => {
    try {
      const page = unwrap(await api.GET("/api/v1/models", { params: { query: { limit: 100 } } }));
      list.replaceChildren(h("h2", { id: "models-list" }, "Models"), modelTable(page.items));
    } catch (error) {
      list.replaceChildren(notice(`Could not list models: ${message(error)}`));
    }
  };
  main.append(
    h("h1", {}, "Models"),
    uploadForm({
      path: "/api/v1/models",
      id: "model-file",
      label: "Upload an ONNX model",
      accept: ".onnx,.zip",
      hint: "An FP32 ONNX file, or a .zip of it with its external data (model.onnx.data, as torch.onnx.export writes with dynamo=True). It is checked (protobuf, onnx.checker, opset) before it can be quantized.",
      onDone: () => void load(),
    }),
    list,
  );
  await load();
}

function modelTable(models: Model[]): HTMLElement {
  if (!models.length) return h("p", {}, "No models yet: upload one above.");
  return table(
    null,
    ["Model", "Status", "Size", "Opset", "Nodes", "Uploaded", ""],
    models.map((m) => [
      h("a", { href: `/models/${m.id}` }, m.filename, " ", h("span", { class: "muted" }, `(${shortId(m.id)})`)),
      statusBadge(m.status),
      bytes(m.size_bytes),
      m.info?.opset ?? "—",
      m.info?.num_nodes ?? "—",
      when(m.created_at),
      m.status === "ready" ? h("a", { href: `/jobs/new?model=${m.id}` }, "Quantize…") : "",
    ]),
    { class: "data", id: "models-table" },
  );
}

export async function renderModel(main: HTMLElement, params: Record<string, string>): Promise<(() => void) | void> {
  let model: Model;
  try {
    model = unwrap(await api.GET("/api/v1/models/{model_id}", { params: { path: { model_id: params.id } } }));
  } catch (error) {
    main.append(h("h1", {}, "Model"), notice(message(error)));
    return;
  }
  const info = model.info;
  main.append(
    h("h1", {}, model.filename),
    h(
      "p",
      { class: "actions" },
      model.status === "ready" ? h("a", { class: "button", href: `/jobs/new?model=${model.id}` }, "Quantize this model") : null,
      h("a", { class: "button secondary", href: `/models/${model.id}/compare` }, "Compare its jobs"),
    ),
    h(
      "dl",
      { class: "facts" },
      fact("Status", statusBadge(model.status)),
      fact("Size", bytes(model.size_bytes)),
      fact("Opset", info?.opset ?? "—"),
      fact("IR version", info?.ir_version ?? "—"),
      fact("Producer", info?.producer || "—"),
      fact("Parameters", info ? info.num_parameters.toLocaleString("en") : "—"),
      fact("Nodes", info?.num_nodes ?? "—"),
      fact("SHA-256", h("code", { class: "wrap" }, model.sha256)),
      fact("Uploaded", when(model.created_at)),
    ),
    model.error ? notice(model.error) : "",
  );
  if (!info) return;
  const tensorRows = (tensors: typeof info.outputs) =>
    tensors.map((t) => [h("code", {}, t.name), t.dtype, `[${t.shape.map((d) => (d === null ? "?" : String(d))).join(", ")}]`]);
  // where a dataset holds each input's samples: a constant input (a scalar sample rate) is one value
  const inputRows = tensorRows(info.inputs).map((row, i) => {
    const axis = info.inputs[i].batch_axis;
    return [...row, axis === null ? "constant" : `axis ${axis}`];
  });
  main.append(
    h(
      "div",
      { class: "grid2" },
      h("section", {}, h("h2", {}, "Inputs"), table(null, ["Name", "Type", "Shape", "Samples on"], inputRows, { class: "data" })),
      h("section", {}, h("h2", {}, "Outputs"), table(null, ["Name", "Type", "Shape"], tensorRows(info.outputs), { class: "data" })),
    ),
  );
  const ops = Object.entries(info.op_histogram).sort((a, b) => b[1] - a[1]);
  const histogram = chart(
    {
      type: "bar",
      data: { labels: ops.map(([op]) => op), datasets: [{ label: "nodes", data: ops.map(([, n]) => n), backgroundColor: "#1d4ed8" }] },
      options: { indexAxis: "y", plugins: { legend: { display: false } }, scales: { x: { beginAtZero: true, ticks: { precision: 0 } } } },
    },
    `Op histogram: ${ops.map(([op, n]) => `${op} ${n}`).join(", ")}`,
    Math.max(140, ops.length * 24 + 40),
  );
  main.append(
    h(
      "section",
      { "aria-labelledby": "ops" },
      h("h2", { id: "ops" }, "Op histogram"),
      h("div", { class: "grid2" }, histogram.el, table(null, ["Op type", "Nodes"], ops.map(([op, n]) => [op, n]), { class: "data compact" })),
    ),
  );
  return histogram.destroy;
}

function fact(term: string, value: Node | string | number): HTMLElement[] {
  return [h("dt", {}, term), h("dd", {}, value)];
}
