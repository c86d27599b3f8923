import { api, message, unwrap } from "../api/client";
import { h, notice } from "../dom";
import { navigate } from "../router";
import { signIn, signOut } from "../session";

export function renderSignIn(main: HTMLElement, _params: Record<string, string>, query: URLSearchParams): void {
  const error = h("div", { id: "signin-error" });
  const input = h("input", {
    id: "api-key",
    name: "api-key",
    type: "password",
    autocomplete: "off",
    required: true,
    "aria-describedby": "api-key-hint",
  });
  const form = h(
    "form",
    { class: "card narrow", novalidate: true },
    h("label", { for: "api-key" }, "API key"),
    input,
    h(
      "p",
      { id: "api-key-hint", class: "hint" },
      "Every key belongs to one project; you see that project's models, datasets and jobs. The key is kept in this tab's session storage only. Create one with ",
      h("code", {}, "quant-admin create-key --project NAME"),
      ".",
    ),
    error,
    h("button", { type: "submit" }, "Sign in"),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.replaceChildren();
    const key = input.value.trim();
    if (!key) {
      error.append(notice("Enter an API key."));
      input.focus();
      return;
    }
    signIn(key);
    try {
      unwrap(await api.GET("/api/v1/models", { params: { query: { limit: 1 } } }));
    } catch (err) {
      signOut();
      error.append(notice(`That key was not accepted: ${message(err)}`));
      input.focus();
      return;
    }
    window.dispatchEvent(new CustomEvent("quant:signed-in"));
    const next = query.get("next");
    navigate(next && next.startsWith("/") && !next.startsWith("//") && !next.startsWith("/signin") ? next : "/jobs", true);
  });
  main.append(h("h1", {}, "Sign in"), form);
}
