// Server-Sent Events read with fetch() so the API key travels in the X-API-Key header.
//
// EventSource cannot send headers; putting the key in the URL instead would write it into access
// logs, browser history and proxies. fetch() streams the body just as well: this parses the
// text/event-stream format (id/event/data/retry lines, blank line ends an event) and resumes after
// a dropped connection with Last-Event-ID, as EventSource would.

import { apiKey } from "./session";

export interface JobEvent {
  id: number;
  kind: string;
  stage: string | null;
  progress: number | null;
  message: string;
  data: Record<string, unknown> | null;
  created_at: string;
}

export interface StreamHandlers {
  onEvent: (event: JobEvent) => void;
  onState?: (state: "open" | "reconnecting" | "closed" | "error", detail?: string) => void;
  /** True once the stream has said all it will (e.g. the job's terminal status arrived). */
  finished: () => boolean;
}

/** Follow `url` until the server ends the stream after a terminal event, or `stop()` is called. */
export function followEvents(url: string, handlers: StreamHandlers): { stop: () => void } {
  const controller = new AbortController();
  let lastId: string | null = null;
  let retryMs = 2000;
  let stopped = false;

  async function connect(): Promise<void> {
    while (!stopped) {
      const headers: Record<string, string> = { Accept: "text/event-stream" };
      const key = apiKey();
      if (key) headers["X-API-Key"] = key;
      if (lastId) headers["Last-Event-ID"] = lastId;
      try {
        const response = await fetch(url, { headers, signal: controller.signal });
        if (!response.ok || !response.body) {
          handlers.onState?.("error", `HTTP ${response.status}`);
          return; // 401/404 will not fix themselves by retrying
        }
        handlers.onState?.("open");
        await read(response.body);
        if (handlers.finished()) {
          handlers.onState?.("closed");
          return;
        }
        // Closed early (a restarted server, a proxy timeout): resume after the last event seen.
        handlers.onState?.("reconnecting");
        await new Promise((resolve) => setTimeout(resolve, retryMs));
      } catch (error) {
        if (stopped || controller.signal.aborted) return;
        handlers.onState?.("reconnecting", String(error));
        await new Promise((resolve) => setTimeout(resolve, retryMs));
      }
    }
  }

  async function read(body: ReadableStream<Uint8Array>): Promise<void> {
    const reader = body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    let fields: { id?: string; event?: string; data: string[] } = { data: [] };
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let newline: number;
      while ((newline = buffer.search(/\r\n|\r|\n/)) >= 0) {
        const line = buffer.slice(0, newline);
        buffer = buffer.slice(newline + (buffer.startsWith("\r\n", newline) ? 2 : 1));
        if (line === "") {
          if (fields.id !== undefined) lastId = fields.id;
          if (fields.data.length) dispatch(fields.data.join("\n"));
          fields = { data: [] };
          continue;
        }
        if (line.startsWith(":")) continue; // keep-alive comment
        const colon = line.indexOf(":");
        const name = colon < 0 ? line : line.slice(0, colon);
        const raw = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (name === "data") fields.data.push(raw);
        else if (name === "id") fields.id = raw;
        else if (name === "event") fields.event = raw;
        else if (name === "retry" && /^\d+$/.test(raw)) retryMs = Number(raw);
      }
    }
  }

  function dispatch(data: string): void {
    try {
      handlers.onEvent(JSON.parse(data) as JobEvent);
    } catch {
      /* a malformed event is skipped, the stream goes on */
    }
  }

  void connect();
  return {
    stop() {
      stopped = true;
      controller.abort();
    },
  };
}
