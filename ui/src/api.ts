// Talking to the master: the bearer token (kept in sessionStorage, see docs/ui.md),
// JSON requests, and API errors turned into one exception type with the master's
// own message.

import type { ApiErrorBody } from "./types";

const TOKEN_KEY = "drover.token";

/** The token the pages use, or null before sign-in. */
export function token(): string | null {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(value: string): void {
  sessionStorage.setItem(TOKEN_KEY, value.trim());
}

export function clearToken(): void {
  sessionStorage.removeItem(TOKEN_KEY);
}

/**
 * Takes a token handed over in the URL fragment (`#token=drv_...`, as `drover dev`
 * prints it) into sessionStorage and removes it from the address bar and history.
 * The fragment never reaches the server.
 */
export function adoptTokenFromFragment(): void {
  const m = /(?:^#|&)token=([^&]+)/.exec(location.hash);
  if (m) {
    setToken(decodeURIComponent(m[1]));
    history.replaceState(history.state, "", location.pathname + location.search);
  }
}

/** An answer other than 2xx: the HTTP status and the master's error body. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

/** Called on a 401 (the token is missing, revoked or wrong). */
let onUnauthorized: () => void = () => {};
export function whenUnauthorized(f: () => void): void {
  onUnauthorized = f;
}

/** A request to the master with the token; the raw response once it is 2xx. */
export async function request(
  method: "GET" | "POST",
  path: string,
  body?: unknown,
  signal?: AbortSignal,
): Promise<Response> {
  const headers: Record<string, string> = {};
  const t = token();
  if (t) headers["Authorization"] = `Bearer ${t}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
  });
  if (!response.ok) {
    let code = "http_" + response.status;
    let message = `${method} ${path}: HTTP ${response.status}`;
    try {
      const e = (await response.json()) as ApiErrorBody;
      code = e.error.code;
      message = e.error.message;
    } catch {
      // Not the master's JSON error (e.g. a proxy's page): keep the status line.
    }
    if (response.status === 401) onUnauthorized();
    throw new ApiError(response.status, code, message);
  }
  return response;
}

/** GET a JSON document. */
export async function get<T>(path: string, signal?: AbortSignal): Promise<T> {
  return (await (await request("GET", path, undefined, signal)).json()) as T;
}

/** POST a JSON body, answer the JSON reply. */
export async function post<T>(path: string, body: unknown): Promise<T> {
  return (await (await request("POST", path, body)).json()) as T;
}

/** A job key's path under /v1/jobs (each part encoded). */
export function jobPath(key: string): string {
  return "/v1/jobs/" + key.split("/").map(encodeURIComponent).join("/");
}
