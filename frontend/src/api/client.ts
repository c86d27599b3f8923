// The typed API client: openapi-fetch over types generated from the service's OpenAPI document
// (src/api/schema.d.ts, written by `npm run generate`; never edit it by hand).

import createClient, { type Middleware } from "openapi-fetch";
import type { components, paths } from "./schema";
import { apiKey, signOut } from "../session";

export type Schemas = components["schemas"];
export type Model = Schemas["ModelPublic"];
export type Dataset = Schemas["DatasetPublic"];
export type Job = Schemas["JobPublic"];
export type JobStatus = Schemas["JobStatus"];
export type Artifact = Schemas["ArtifactPublic"];
export type Recipe = Schemas["Recipe"];

export const API_BASE = "/api/v1";
export const TERMINAL: readonly string[] = ["succeeded", "failed", "canceled"];

/** An RFC 9457 problem as the service sends it; `errors` names each bad field. */
export interface Problem {
  type?: string;
  title?: string;
  status?: number;
  detail?: string;
  errors?: { field: string; message: string }[];
}

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly problem: Problem,
  ) {
    super(problem.detail || problem.title || `HTTP ${status}`);
  }
}

const auth: Middleware = {
  onRequest({ request }) {
    const key = apiKey();
    if (key) request.headers.set("X-API-Key", key);
    return request;
  },
  onResponse({ response }) {
    if (response.status === 401 && apiKey() && location.pathname !== "/signin") {
      signOut();
      window.dispatchEvent(new CustomEvent("quant:signed-out"));
    }
    return response;
  },
};

export const api = createClient<paths>({ baseUrl: "" });
api.use(auth);

/** The data of an openapi-fetch result, or an ApiError carrying the problem document. */
export function unwrap<T>(result: { data?: T; error?: unknown; response: Response }): T {
  if (result.error !== undefined || result.data === undefined) {
    throw new ApiError(result.response.status, asProblem(result.error, result.response.status));
  }
  return result.data;
}

function asProblem(body: unknown, status: number): Problem {
  if (body && typeof body === "object") return body as Problem;
  return { status, title: `HTTP ${status}`, detail: typeof body === "string" && body ? body : undefined };
}

/** Fetch a binary/JSON resource with the key header (artifacts, report). */
export async function authedFetch(path: string, init: RequestInit = {}): Promise<Response> {
  const headers = new Headers(init.headers);
  const key = apiKey();
  if (key) headers.set("X-API-Key", key);
  const response = await fetch(path, { ...init, headers });
  if (!response.ok) {
    let problem: Problem = { status: response.status, title: response.statusText };
    try {
      problem = await response.json();
    } catch {
      /* not JSON: keep the status line */
    }
    throw new ApiError(response.status, problem);
  }
  return response;
}

/**
 * Upload a file with a progress callback. fetch() cannot report upload progress, so this one call
 * uses XMLHttpRequest; the route and the response type still come from the generated schema.
 */
export function upload<P extends "/api/v1/models" | "/api/v1/datasets">(
  path: P,
  file: File,
  onProgress: (fraction: number) => void,
): Promise<P extends "/api/v1/models" ? Model : Dataset> {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("POST", path);
    const key = apiKey();
    if (key) xhr.setRequestHeader("X-API-Key", key);
    xhr.upload.onprogress = (event) => {
      if (event.lengthComputable) onProgress(event.loaded / event.total);
    };
    xhr.onload = () => {
      let body: unknown = null;
      try {
        body = JSON.parse(xhr.responseText);
      } catch {
        body = xhr.responseText;
      }
      if (xhr.status >= 200 && xhr.status < 300) resolve(body as never);
      else reject(new ApiError(xhr.status, asProblem(body, xhr.status)));
    };
    xhr.onerror = () => reject(new ApiError(0, { title: "network error", detail: "the upload did not reach the service" }));
    const form = new FormData();
    form.append("file", file, file.name);
    xhr.send(form);
  });
}

/** A model's uploaded file name, for pages that hold only its id; null when it cannot be read. */
export async function modelName(modelId: string): Promise<string | null> {
  const result = await api.GET("/api/v1/models/{model_id}", { params: { path: { model_id: modelId } } });
  return result.data ? result.data.filename : null;
}

export function message(error: unknown): string {
  if (error instanceof ApiError) return error.message;
  if (error instanceof Error) return error.message;
  return String(error);
}
