// A tiny DOM builder: h("p", {class: "hint"}, "text", child). No framework, no innerHTML of data.

type Child = Node | string | number | null | undefined | false;
type Attrs = Record<string, string | number | boolean | EventListener | null | undefined>;

export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Attrs = {},
  ...children: (Child | Child[])[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2).toLowerCase(), value);
    } else if (value === true) {
      el.setAttribute(key, "");
    } else {
      el.setAttribute(key, String(value));
    }
  }
  append(el, ...children);
  return el;
}

export function append(el: Element, ...children: (Child | Child[])[]): void {
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
}

export function clear(el: Element): void {
  el.replaceChildren();
}

export function bytes(n: number | null | undefined): string {
  if (n === null || n === undefined || !Number.isFinite(n)) return "—";
  const units = ["B", "KiB", "MiB", "GiB"];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value.toFixed(unit === 0 ? 0 : 1)} ${units[unit]}`;
}

export function num(value: unknown, digits = 4): string {
  if (typeof value !== "number" || !Number.isFinite(value)) return value === null || value === undefined ? "—" : String(value);
  if (Number.isInteger(value)) return value.toLocaleString("en");
  const abs = Math.abs(value);
  if (abs !== 0 && (abs < 1e-3 || abs >= 1e6)) return value.toExponential(2);
  return String(Number(value.toFixed(digits))); // 29.5, not 29.5000
}

export function percent(value: unknown): string {
  return typeof value === "number" && Number.isFinite(value) ? `${(value * 100).toFixed(2)} %` : "—";
}

export function when(iso: string | null | undefined): string {
  if (!iso) return "—";
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? iso : date.toLocaleString("en-GB", { dateStyle: "short", timeStyle: "medium" });
}

export function shortId(id: string): string {
  return id.slice(0, 8);
}

const WORDS: Record<string, string> = {
  fp32: "FP32", fp16: "FP16", fp8: "FP8", int8: "INT8", qdq: "QDQ", sqnr: "SQNR", snr: "SNR", db: "(dB)",
  ms: "(ms)", mse: "MSE", top1: "top-1", top5: "top-5", onnx: "ONNX", tqc: "TQC", id: "id",
};

/** A label from a snake_case key: "max_abs_error" → "max abs error", "sqnr_db" → "SQNR (dB)". */
export function label(key: string): string {
  return key
    .split("_")
    .map((word) => WORDS[word.toLowerCase()] ?? word)
    .join(" ");
}

export function statusBadge(status: string): HTMLSpanElement {
  return h("span", { class: `badge status-${status}` }, status);
}

export function progressBar(value: number, name: string): HTMLDivElement {
  const pct = Math.round(Math.max(0, Math.min(1, value)) * 100);
  const bar = h(
    "div",
    { class: "progress", role: "progressbar", "aria-label": name, "aria-valuemin": 0, "aria-valuemax": 100, "aria-valuenow": pct },
    h("div", { class: "progress-fill", style: `width: ${pct}%` }),
  );
  return bar;
}

export function setProgress(bar: HTMLElement, value: number): void {
  const pct = Math.round(Math.max(0, Math.min(1, value)) * 100);
  bar.setAttribute("aria-valuenow", String(pct));
  const fill = bar.querySelector<HTMLElement>(".progress-fill");
  if (fill) fill.style.width = `${pct}%`;
}

/** A table from rows; `head` are column titles. Cells may be nodes or text. */
export function table(caption: string | null, head: string[], rows: Child[][], attrs: Attrs = {}): HTMLTableElement {
  return h(
    "table",
    attrs,
    caption ? h("caption", {}, caption) : null,
    h("thead", {}, h("tr", {}, head.map((title) => h("th", { scope: "col" }, title)))),
    h("tbody", {}, rows.map((cells) => h("tr", {}, cells.map((cell) => h("td", {}, cell))))),
  );
}

/** A horizontally scrollable wrapper that keyboard users can focus (and screen readers name). */
export function scroll(name: string, content: HTMLElement): HTMLElement {
  return h("div", { class: "scroll", tabindex: 0, role: "region", "aria-label": name }, content);
}

export function notice(text: string, kind: "error" | "info" = "error"): HTMLParagraphElement {
  return h("p", { class: `notice ${kind}`, role: kind === "error" ? "alert" : "status" }, text);
}
