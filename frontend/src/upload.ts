// The upload form shared by the models and datasets pages: a file input, a progress bar, the outcome.

import { message, upload } from "./api/client";
import { h, notice, progressBar, setProgress } from "./dom";

export function uploadForm<P extends "/api/v1/models" | "/api/v1/datasets">(options: {
  path: P;
  id: string;
  label: string;
  accept: string;
  hint: string;
  onDone: () => void;
}): HTMLFormElement {
  const input = h("input", { id: options.id, name: "file", type: "file", accept: options.accept, required: true, "aria-describedby": `${options.id}-hint` });
  const bar = progressBar(0, "Upload progress");
  bar.hidden = true;
  const status = h("div", { "aria-live": "polite" });
  const button = h("button", { type: "submit" }, "Upload");
  const form = h(
    "form",
    { class: "card upload", novalidate: true },
    h("label", { for: options.id }, options.label),
    h("div", { class: "row" }, input, button),
    h("p", { id: `${options.id}-hint`, class: "hint" }, options.hint),
    bar,
    status,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    status.replaceChildren();
    const file = input.files?.[0];
    if (!file) {
      status.append(notice("Choose a file first."));
      input.focus();
      return;
    }
    button.disabled = true;
    bar.hidden = false;
    setProgress(bar, 0);
    try {
      await upload(options.path, file, (fraction) => {
        setProgress(bar, fraction);
        if (fraction >= 1) status.replaceChildren(notice("Uploaded; validating…", "info"));
      });
      status.replaceChildren(notice(`Uploaded ${file.name}.`, "info"));
      form.reset();
      options.onDone();
    } catch (error) {
      status.replaceChildren(notice(`Upload failed: ${message(error)}`));
    } finally {
      button.disabled = false;
      bar.hidden = true;
    }
  });
  return form;
}
