// History-API routing: the API serves index.html for every non-API path, so URLs are real paths.

export type Render = (main: HTMLElement, params: Record<string, string>, query: URLSearchParams) => void | (() => void) | Promise<void | (() => void)>;

interface Route {
  pattern: RegExp;
  keys: string[];
  render: Render;
  title: string;
}

const routes: Route[] = [];
let cleanup: (() => void) | void = undefined;
let generation = 0;
let moveFocus = false; // not on the first load: screen readers start at the top (and the skip link)

export function route(path: string, title: string, render: Render): void {
  const keys: string[] = [];
  const pattern = new RegExp(
    "^" + path.replace(/:(\w+)/g, (_m, key: string) => (keys.push(key), "([^/]+)")) + "/?$",
  );
  routes.push({ pattern, keys, render, title });
}

/** Go to `path`; `focus` moves keyboard focus to the new page's heading (off for redirects). */
export function navigate(path: string, replace = false, focus = true): void {
  moveFocus = focus;
  if (replace) history.replaceState(null, "", path);
  else history.pushState(null, "", path);
  void dispatch();
}

export async function dispatch(): Promise<void> {
  if (typeof cleanup === "function") cleanup();
  cleanup = undefined;
  const mine = ++generation;
  const focus = moveFocus;
  const main = document.getElementById("main") as HTMLElement;
  const { pathname, search } = window.location;
  for (const r of routes) {
    const match = r.pattern.exec(pathname);
    if (!match) continue;
    const params = Object.fromEntries(r.keys.map((key, i) => [key, decodeURIComponent(match[i + 1])]));
    // Each page renders into its own container: a page left while it was still loading keeps
    // writing into its detached container, never into the page that replaced it.
    const page = document.createElement("div");
    main.replaceChildren(page);
    document.title = `${r.title} · Quantization service`;
    markCurrent(pathname);
    const done = await r.render(page, params, new URLSearchParams(search));
    if (mine !== generation) {
      // Another navigation happened while this page loaded: it is gone, stop its timers and streams.
      if (typeof done === "function") done();
      return;
    }
    cleanup = done;
    // Move focus to the page heading so keyboard and screen-reader users land on the new content.
    const heading = page.querySelector<HTMLElement>("h1");
    if (heading && focus) {
      heading.tabIndex = -1;
      heading.focus({ preventScroll: true });
    }
    return;
  }
  main.replaceChildren();
  const h1 = document.createElement("h1");
  h1.textContent = "Page not found";
  main.append(h1);
}

function markCurrent(pathname: string): void {
  for (const link of document.querySelectorAll<HTMLAnchorElement>("#nav a")) {
    const href = link.getAttribute("href") || "";
    const current = pathname === href || (pathname.startsWith(href + "/") && pathname !== "/jobs/new");
    if (current) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
}

/** Same-origin links navigate without a reload. */
export function interceptLinks(): void {
  document.addEventListener("click", (event) => {
    if (event.defaultPrevented || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
    const link = (event.target as Element).closest("a");
    if (!link || link.target || link.hasAttribute("download")) return;
    const url = new URL(link.href, window.location.href);
    if (url.origin !== window.location.origin || url.pathname.startsWith("/api/") || url.pathname.startsWith("/docs")) return;
    event.preventDefault();
    navigate(url.pathname + url.search);
  });
  window.addEventListener("popstate", () => {
    moveFocus = true;
    void dispatch();
  });
}
