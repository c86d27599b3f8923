import "./style.css";
import { h } from "./dom";
import { dispatch, interceptLinks, navigate, route } from "./router";
import { apiKey, signOut } from "./session";
import { renderSignIn } from "./pages/signin";
import { renderModels, renderModel } from "./pages/models";
import { renderDatasets } from "./pages/datasets";
import { renderJobs } from "./pages/jobs";
import { renderJob } from "./pages/job";
import { renderNewJob } from "./pages/newjob";
import { renderCompare } from "./pages/compare";
import { renderWebhooks } from "./pages/webhooks";
import type { Render } from "./router";

/** Pages behind sign-in send the visitor to /signin first, then back. */
function guarded(render: Render): Render {
  return (main, params, query) => {
    if (!apiKey()) {
      navigate(`/signin?next=${encodeURIComponent(location.pathname + location.search)}`, true, false);
      return;
    }
    return render(main, params, query);
  };
}

route("/", "Jobs", guarded((main, params, query) => renderJobs(main, params, query)));
route("/signin", "Sign in", renderSignIn);
route("/models", "Models", guarded(renderModels));
route("/models/:id", "Model", guarded(renderModel));
route("/models/:id/compare", "Compare jobs", guarded(renderCompare));
route("/datasets", "Datasets", guarded(renderDatasets));
route("/jobs", "Jobs", guarded(renderJobs));
route("/jobs/new", "New job", guarded(renderNewJob));
route("/jobs/:id", "Job", guarded(renderJob));
route("/webhooks", "Webhooks", guarded(renderWebhooks));

function renderNav(): void {
  const nav = document.getElementById("nav") as HTMLElement;
  if (!apiKey()) {
    nav.replaceChildren();
    return;
  }
  const links: [string, string][] = [
    ["/jobs", "Jobs"],
    ["/jobs/new", "New job"],
    ["/models", "Models"],
    ["/datasets", "Datasets"],
    ["/webhooks", "Webhooks"],
  ];
  nav.replaceChildren(
    h("ul", {}, links.map(([href, text]) => h("li", {}, h("a", { href }, text)))),
    h(
      "button",
      {
        type: "button",
        class: "link",
        onclick: () => {
          signOut();
          window.dispatchEvent(new CustomEvent("quant:signed-out"));
        },
      },
      "Sign out",
    ),
  );
}

window.addEventListener("quant:signed-in", renderNav);
window.addEventListener("quant:signed-out", () => {
  renderNav();
  navigate(`/signin?next=${encodeURIComponent(location.pathname)}`, true);
});

interceptLinks();
renderNav();
void dispatch();
