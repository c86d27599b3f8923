// Forms built from the schemas of the OpenAPI document the client is generated from; first of
// all the recipe form. Every field the service accepts gets an input with its title, description,
// bounds and default, so a field added to the recipe appears here at the next build without code
// changes. Validation stays on the server (the form is `novalidate`); its problem+json `errors`
// are shown beside the field each one names (`recipe.calibration.percentile` → that input).

import { components } from "../openapi.json";
import { h } from "./dom";

interface Schema {
  $ref?: string;
  type?: string;
  title?: string;
  description?: string;
  default?: unknown;
  const?: unknown;
  enum?: unknown[];
  minimum?: number;
  maximum?: number;
  exclusiveMinimum?: number;
  exclusiveMaximum?: number;
  properties?: Record<string, Schema>;
  items?: Schema;
  anyOf?: Schema[];
  allOf?: Schema[];
  readOnly?: boolean; // set by the server (recipe.platform_named): no input
}

const schemas = (components as { schemas: Record<string, Schema> }).schemas;

function resolve(schema: Schema): Schema {
  if (schema.$ref) return resolve(schemas[schema.$ref.split("/").pop() as string]);
  if (schema.allOf?.length === 1) return { ...resolve(schema.allOf[0]), ...schema, allOf: undefined };
  if (schema.anyOf) {
    const concrete = schema.anyOf.filter((s) => s.type !== "null");
    if (concrete.length === 1) return { ...resolve(concrete[0]), ...schema, anyOf: undefined };
  }
  return schema;
}

export const recipeForm = (): SchemaForm => schemaForm("Recipe", "recipe");

export interface SchemaForm {
  el: HTMLElement;
  /** The object from the inputs: empty inputs are left out so the server's defaults apply. */
  value(): Record<string, unknown>;
  /** Every input back to the schema's default, every list emptied, every optional section off. */
  reset(): void;
  /** Set inputs from a (partial) object; fields the schema lacks are ignored. */
  set(recipe: Record<string, unknown>, path?: string): void;
  /** Show server errors; returns the errors that name no input (shown by the caller). */
  showErrors(errors: { field: string; message: string }[]): { field: string; message: string }[];
  clearErrors(): void;
}

type Reader = () => unknown;

/**
 * Inputs for the properties of `schemaName` (minus `skip` and the readOnly ones the server records itself),
 * named by their dotted path under `prefix` (the path the server's errors use:
 * `recipe.calibration.percentile`, `webhook_url`).
 */
export function schemaForm(schemaName: string, prefix = "", skip: string[] = []): SchemaForm {
  const readers = new Map<string, Reader>();
  const inputs = new Map<string, HTMLInputElement | HTMLSelectElement>();
  const errorSlots = new Map<string, HTMLElement>();
  const optional = new Map<string, HTMLInputElement>(); // optional section path → its on/off switch
  const rowLists = new Map<string, (rows: Record<string, unknown>[]) => void>(); // list path → replace its rows

  function fieldId(path: string): string {
    return `f-${path.replace(/[^A-Za-z0-9]+/g, "-")}`;
  }

  function build(schema: Schema, path: string, key: string): HTMLElement {
    const s = resolve(schema);
    // Only the field's own title counts: a nested spec's is its class name ("TargetSpec").
    const title = tidy(schema.title ?? heading(key));
    if (s.type === "object" && s.properties) {
      const fields = Object.entries(s.properties).map(([child, childSchema]) => build(childSchema, `${path}.${child}`, child));
      const hint = s.description ? h("p", { class: "hint" }, s.description) : null;
      if (!schema.anyOf?.some((option) => option.type === "null")) {
        return h("fieldset", { class: "group" }, h("legend", {}, title), hint, fields);
      }
      // An optional section (null by default, e.g. preprocessing): sent only when switched on, so its
      // selects' defaults do not turn "absent" into "present with defaults".
      const toggle = h("input", { type: "checkbox", id: `${fieldId(path)}-on`, name: path });
      const error = h("p", { id: `${fieldId(path)}-error`, class: "field-error", hidden: true });
      const group = h(
        "fieldset",
        { class: "group", disabled: true },
        h("legend", {}, toggle, h("label", { for: toggle.id }, ` ${title}`)),
        hint,
        error,
        fields,
      );
      toggle.addEventListener("change", () => (group.disabled = !toggle.checked));
      optional.set(path, toggle);
      inputs.set(path, toggle);
      errorSlots.set(path, error);
      return group;
    }
    const id = fieldId(path);
    const hintId = `${id}-hint`;
    const errorId = `${id}-error`;
    const error = h("p", { id: errorId, class: "field-error", hidden: true });
    errorSlots.set(path, error);
    let control: HTMLInputElement | HTMLSelectElement;
    const scalar = scalarControl(s, id, path);
    if (scalar) {
      control = scalar.control;
      readers.set(path, scalar.read);
    } else if (s.type === "array" && s.items && resolve(s.items).enum) {
      // A set of choices: one checkbox each, the schema's default checked.
      const options = resolve(s.items).enum as unknown[];
      const defaults = Array.isArray(s.default) ? s.default : [];
      const boxes = options.map((option, i) =>
        h("input", { type: "checkbox", id: i === 0 ? id : `${id}-${i}`, name: path, value: String(option), checked: defaults.includes(option) }),
      );
      // None checked: leave the field out, so the service's own default applies.
      readers.set(path, () => {
        const chosen = boxes.filter((b) => b.checked).map((b) => b.value);
        return chosen.length ? chosen : undefined;
      });
      inputs.set(path, boxes[0]);
      boxes[0].setAttribute("aria-describedby", `${hintId} ${errorId}`);
      return h(
        "fieldset",
        { class: "field choices", "aria-describedby": `${hintId} ${errorId}` },
        h("legend", {}, title),
        boxes.map((box, i) => h("label", { class: "choice", for: box.id }, box, ` ${String(options[i])}`)),
        h("p", { id: hintId, class: "hint" }, [s.description, "None checked: the service's default."].filter(Boolean).join(" ")),
        error,
      );
    } else if (isRowList(s)) {
      return rowList(s, path, title);
    } else if (s.type === "object" || (s.type === "array" && s.items && resolve(s.items).type === "object") || (!s.type && !s.enum)) {
      // Maps, lists of objects and unions the form cannot lay out: edited as JSON.
      const area = h("textarea", { id, name: path, rows: 3, placeholder: "JSON", spellcheck: "false" });
      control = area as unknown as HTMLInputElement;
      readers.set(path, () => {
        const raw = area.value.trim();
        if (raw === "") return undefined;
        try {
          return JSON.parse(raw);
        } catch {
          return raw; // the server names the field in its error
        }
      });
    } else {
      control = h("input", { id, name: path, type: "text", placeholder: "comma-separated" });
      readers.set(path, () => {
        const items = control.value.split(",").map((v) => v.trim()).filter(Boolean);
        return items.length ? items : undefined;
      });
    }
    control.setAttribute("aria-describedby", `${hintId} ${errorId}`);
    inputs.set(path, control);
    return h(
      "div",
      { class: "field" },
      h("label", { for: id }, title),
      control,
      h("p", { id: hintId, class: "hint" }, [s.description, shape(s), bounds(s)].filter(Boolean).join(" ")),
      error,
    );
  }

  /**
   * One row per list item, a control per item field; a row's controls and error slots are named
   * `path.<index>.<field>` (and the row's own `path.<index>`), the paths the server's errors use,
   * renumbered when a row is removed.
   */
  function rowList(s: Schema, path: string, title: string): HTMLElement {
    const fields = Object.entries(resolve(s.items as Schema).properties ?? {}).map(([key, schema]) => ({ key, schema: resolve(schema) }));
    const id = fieldId(path);
    const body = h("tbody", {});
    const rows: { el: HTMLElement; read: () => Record<string, unknown> | undefined; controls: Map<string, HTMLInputElement | HTMLSelectElement>; slots: Map<string, HTMLElement> }[] = [];
    const renumber = (): void => {
      for (const map of [inputs, errorSlots]) for (const key of [...map.keys()]) if (key.startsWith(`${path}.`)) map.delete(key);
      rows.forEach((row, i) => {
        for (const [key, control] of row.controls) {
          control.id = `${id}-${i}-${key}`;
          control.setAttribute("aria-label", `${heading(key)} of row ${i + 1}`);
          inputs.set(`${path}.${i}.${key}`, control);
          errorSlots.set(`${path}.${i}.${key}`, row.slots.get(key) as HTMLElement);
        }
        inputs.set(`${path}.${i}`, row.controls.values().next().value as HTMLInputElement);
        errorSlots.set(`${path}.${i}`, row.slots.get("") as HTMLElement);
      });
    };
    const add = (values: Record<string, unknown> = {}): void => {
      const controls = new Map<string, HTMLInputElement | HTMLSelectElement>();
      const slots = new Map<string, HTMLElement>([["", h("p", { class: "field-error", hidden: true })]]);
      const readers = fields.map(({ key, schema }) => {
        const made = scalarControl(schema, "", `${path}.${key}`) as { control: HTMLInputElement | HTMLSelectElement; read: Reader };
        if (values[key] !== undefined && values[key] !== null) made.control.value = String(values[key]);
        controls.set(key, made.control);
        slots.set(key, h("p", { class: "field-error", hidden: true }));
        return [key, made.read] as const;
      });
      const row = {
        el: h("tr", {}),
        controls,
        slots,
        // A row left wholly blank is no override: it is dropped rather than sent empty.
        read: () => {
          const entries = readers.map(([key, read]) => [key, read()] as const).filter(([, value]) => value !== undefined);
          return entries.length ? Object.fromEntries(entries) : undefined;
        },
      };
      const remove = h("button", { type: "button", class: "secondary" }, "Remove");
      remove.addEventListener("click", () => {
        rows.splice(rows.indexOf(row), 1);
        row.el.remove();
        renumber();
      });
      row.el.append(
        ...fields.map(({ key }) => h("td", {}, controls.get(key), slots.get(key))),
        h("td", {}, remove, slots.get("")),
      );
      rows.push(row);
      body.append(row.el);
      renumber();
    };
    rowLists.set(path, (items) => {
      rows.splice(0).forEach((row) => row.el.remove());
      items.forEach((item) => add(item));
      renumber();
    });
    readers.set(path, () => {
      const items = rows.map((row) => row.read()).filter((item) => item !== undefined);
      return items.length ? items : undefined;
    });
    const error = h("p", { id: `${id}-error`, class: "field-error", hidden: true });
    errorSlots.set(path, error);
    const addButton = h("button", { type: "button", class: "secondary", id: `${id}-add` }, `Add a row`);
    addButton.addEventListener("click", () => add());
    inputs.set(path, addButton as unknown as HTMLInputElement);
    return h(
      "fieldset",
      { class: "group wide rows", id },
      h("legend", {}, title),
      h("p", { class: "hint" }, s.description),
      h("ul", { class: "hint" }, fields.map(({ key, schema }) => h("li", {}, h("strong", {}, heading(key)), ": ", [schema.description, bounds(schema)].filter(Boolean).join(" ")))),
      error,
      h(
        "table",
        { class: "data compact" },
        h("thead", {}, h("tr", {}, fields.map(({ key }) => h("th", { scope: "col" }, heading(key))), h("th", { scope: "col" }, h("span", { class: "visually-hidden" }, "Actions")))),
        body,
      ),
      addButton,
    );
  }

  const join = (key: string) => (prefix ? `${prefix}.${key}` : key);
  const root = resolve({ $ref: `#/components/schemas/${schemaName}` });
  const entries = Object.entries(root.properties ?? {}).filter(([key, schema]) => !skip.includes(key) && !schema.readOnly);
  const isGroup = ([, schema]: [string, Schema]) => resolve(schema).type === "object" || isRowList(resolve(schema));
  const scalars = entries.filter((e) => !isGroup(e));
  // Top-level scalars (platform, precision, seed...) share one "General" group; specs get their own.
  const el = h(
    "div",
    { class: "recipe" },
    scalars.length && prefix
      ? h("fieldset", { class: "group" }, h("legend", {}, "General"), scalars.map(([key, schema]) => build(schema, join(key), key)))
      : scalars.map(([key, schema]) => build(schema, join(key), key)),
    entries.filter(isGroup).map(([key, schema]) => build(schema, join(key), key)),
  );

  return {
    el,
    value() {
      const out: Record<string, unknown> = {};
      for (const [path, read] of readers) {
        if ([...optional].some(([section, on]) => !on.checked && path.startsWith(`${section}.`))) continue;
        const value = read();
        if (value === undefined) continue;
        const parts = (prefix ? path.slice(prefix.length + 1) : path).split(".");
        let node = out;
        for (const part of parts.slice(0, -1)) node = (node[part] ??= {}) as Record<string, unknown>;
        node[parts[parts.length - 1]] = value;
      }
      return out;
    },
    reset() {
      for (const control of el.querySelectorAll<HTMLInputElement | HTMLSelectElement | HTMLTextAreaElement>("input, select, textarea")) {
        if (control instanceof HTMLSelectElement) for (const option of control.options) option.selected = option.defaultSelected;
        else if (control instanceof HTMLInputElement && control.type === "checkbox") control.checked = control.defaultChecked;
        else control.value = control.defaultValue;
      }
      for (const toggle of optional.values()) toggle.dispatchEvent(new Event("change")); // its section follows
      for (const replaceRows of rowLists.values()) replaceRows([]);
      this.clearErrors();
    },
    set(recipe, path = prefix) {
      for (const [key, value] of Object.entries(recipe)) {
        const full = path ? `${path}.${key}` : key;
        if (value && typeof value === "object" && !Array.isArray(value)) {
          const on = optional.get(full);
          if (on && !on.checked) on.click(); // switch the section on (its change handler enables it)
          this.set(value as Record<string, unknown>, full);
          continue;
        }
        const replaceRows = rowLists.get(full);
        if (replaceRows && Array.isArray(value)) {
          replaceRows(value as Record<string, unknown>[]);
          continue;
        }
        const input = inputs.get(full);
        if (!input) continue;
        if (input instanceof HTMLInputElement && input.type === "checkbox") input.checked = Boolean(value);
        else input.value = Array.isArray(value) ? value.join(", ") : String(value);
      }
    },
    showErrors(errors) {
      const unplaced: { field: string; message: string }[] = [];
      let first: HTMLElement | null = null;
      for (const error of errors) {
        const slot = errorSlots.get(error.field);
        const input = inputs.get(error.field);
        if (!slot || !input) {
          unplaced.push(error);
          continue;
        }
        slot.textContent = error.message;
        slot.hidden = false;
        input.setAttribute("aria-invalid", "true");
        first ??= input;
      }
      first?.focus();
      return unplaced;
    },
    clearErrors() {
      for (const slot of errorSlots.values()) {
        slot.hidden = true;
        slot.textContent = "";
      }
      for (const input of inputs.values()) input.removeAttribute("aria-invalid");
    },
  };
}

/**
 * The control of one value the form can show as a single input: a select for a choice, a checkbox
 * for a boolean, a text box for a number or a string; null for lists, objects and unions.
 */
function scalarControl(s: Schema, id: string, name: string): { control: HTMLInputElement | HTMLSelectElement; read: Reader } | null {
  const choices = s.enum ?? (s.const !== undefined ? [s.const] : null);
  if (choices) {
    // No default, or null (the target's metric, deploy.cpu_objective): start blank and leave the
    // field out until one is picked, rather than silently picking the first.
    const blank = s.default === undefined || s.default === null ? h("option", { value: "" }, "—") : null;
    const control = h("select", { id, name }, blank, choices.map((c) => h("option", { value: String(c), selected: c === s.default }, String(c))));
    return { control, read: () => control.value || undefined };
  }
  if (s.type === "boolean") {
    const control = h("input", { id, name, type: "checkbox", checked: s.default === true });
    return { control, read: () => control.checked };
  }
  if (s.type === "integer" || s.type === "number") {
    const placeholder = s.default !== undefined && s.default !== null ? String(s.default) : "";
    const control = h("input", { id, name, type: "text", inputmode: s.type === "integer" ? "numeric" : "decimal", placeholder });
    // type=text, not number: a typo must reach the server and come back as a named error,
    // rather than be silently turned into "" by the browser.
    const read = (): unknown => {
      const raw = control.value.trim();
      if (raw === "") return undefined;
      const n = Number(raw);
      return Number.isFinite(n) ? n : raw;
    };
    return { control, read };
  }
  if (!isScalar(s)) return null;
  const control = h("input", { id, name, type: "text", placeholder: s.default !== undefined && s.default !== null ? String(s.default) : "" });
  return { control, read: () => control.value.trim() || undefined };
}

function isScalar(s: Schema): boolean {
  return Boolean(s.enum || s.const !== undefined || (s.type && s.type !== "array" && s.type !== "object"));
}

/** A list of flat objects (overrides: pattern, bits, observer), edited as rows rather than JSON. */
function isRowList(s: Schema): boolean {
  const item = s.type === "array" && s.items ? resolve(s.items) : null;
  return Boolean(item?.properties && Object.values(item.properties).every((p) => isScalar(resolve(p))));
}

/** Pydantic's titles spell acronyms as words ("Webhook Url"). */
function tidy(title: string): string {
  return title.replace(/\bUrl\b/g, "URL").replace(/\bId\b/g, "ID");
}

function heading(key: string): string {
  const words = key.replace(/_/g, " ");
  return words.charAt(0).toUpperCase() + words.slice(1);
}

/** For JSON-edited fields: the keys an item takes, e.g. `A JSON list of {pattern, bits, observer}.` */
function shape(s: Schema): string {
  const item = s.type === "array" && s.items ? resolve(s.items) : null;
  if (item?.properties) return `A JSON list of {${Object.keys(item.properties).join(", ")}}.`;
  if (s.type === "object" && !s.properties) return "A JSON object.";
  return "";
}

function bounds(s: Schema): string {
  const low = s.minimum ?? s.exclusiveMinimum;
  const high = s.maximum ?? s.exclusiveMaximum;
  const parts: string[] = [];
  if (low !== undefined && high !== undefined) parts.push(`Between ${low} and ${high}.`);
  else if (low !== undefined) parts.push(`At least ${low}.`);
  else if (high !== undefined) parts.push(`At most ${high}.`);
  if (s.default !== undefined && s.default !== "" && s.default !== null && !Array.isArray(s.default)) parts.push(`Default ${String(s.default)}.`);
  return parts.join(" ");
}
