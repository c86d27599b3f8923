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
  /** Set inputs from a (partial) object; fields the schema lacks are ignored. */
  set(recipe: Record<string, unknown>, path?: string): void;
  /** Show server errors; returns the errors that name no input (shown by the caller). */
  showErrors(errors: { field: string; message: string }[]): { field: string; message: string }[];
  clearErrors(): void;
}

type Reader = () => unknown;

/**
 * Inputs for the properties of `schemaName` (minus `skip`), named by their dotted path under
 * `prefix` (the path the server's errors use: `recipe.calibration.percentile`, `webhook_url`).
 */
export function schemaForm(schemaName: string, prefix = "", skip: string[] = []): SchemaForm {
  const readers = new Map<string, Reader>();
  const inputs = new Map<string, HTMLInputElement | HTMLSelectElement>();
  const errorSlots = new Map<string, HTMLElement>();
  const optional = new Map<string, HTMLInputElement>(); // optional section path → its on/off switch

  function fieldId(path: string): string {
    return `f-${path.replace(/[^A-Za-z0-9]+/g, "-")}`;
  }

  function build(schema: Schema, path: string, key: string): HTMLElement {
    const s = resolve(schema);
    // A nested spec's own title is its class name ("CalibrationSpec"): name it after the field.
    const title = tidy(schema.$ref || !s.title ? heading(key) : s.title);
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
    const choices = s.enum ?? (s.const !== undefined ? [s.const] : null);
    if (choices) {
      // No default (a choice inside an optional spec, such as the target's metric): start blank and
      // leave the field out until one is picked, rather than silently picking the first.
      const blank = s.default === undefined ? h("option", { value: "" }, "—") : null;
      control = h("select", { id, name: path }, blank, choices.map((c) => h("option", { value: String(c), selected: c === s.default }, String(c))));
      readers.set(path, () => control.value || undefined);
    } else if (s.type === "boolean") {
      control = h("input", { id, name: path, type: "checkbox", checked: s.default === true });
      readers.set(path, () => (control as HTMLInputElement).checked);
    } else if (s.type === "integer" || s.type === "number") {
      control = h("input", {
        id,
        name: path,
        type: "text",
        inputmode: s.type === "integer" ? "numeric" : "decimal",
        placeholder: s.default !== undefined ? String(s.default) : "",
      });
      // type=text, not number: a typo must reach the server and come back as a named error,
      // rather than be silently turned into "" by the browser.
      readers.set(path, () => {
        const raw = control.value.trim();
        if (raw === "") return undefined;
        const n = Number(raw);
        return Number.isFinite(n) ? n : raw;
      });
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
    } else if (s.type === "array") {
      control = h("input", { id, name: path, type: "text", placeholder: "comma-separated" });
      readers.set(path, () => {
        const items = control.value.split(",").map((v) => v.trim()).filter(Boolean);
        return items.length ? items : undefined;
      });
    } else {
      control = h("input", { id, name: path, type: "text", placeholder: s.default !== undefined ? String(s.default) : "" });
      readers.set(path, () => control.value.trim() || undefined);
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

  const join = (key: string) => (prefix ? `${prefix}.${key}` : key);
  const root = resolve({ $ref: `#/components/schemas/${schemaName}` });
  const entries = Object.entries(root.properties ?? {}).filter(([key]) => !skip.includes(key));
  const isGroup = ([, schema]: [string, Schema]) => resolve(schema).type === "object";
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
    set(recipe, path = prefix) {
      for (const [key, value] of Object.entries(recipe)) {
        const full = path ? `${path}.${key}` : key;
        if (value && typeof value === "object" && !Array.isArray(value)) {
          const on = optional.get(full);
          if (on && !on.checked) on.click(); // switch the section on (its change handler enables it)
          this.set(value as Record<string, unknown>, full);
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
