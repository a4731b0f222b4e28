// Loading helpers shared by pages: reads that a role token may not be allowed to
// make (403 becomes a note instead of an error) and the error box.

import { ApiError, get } from "../api";
import { h } from "../dom";

/** The JSON at `path`, or null when the token may not read it (403). */
export async function getIfAllowed<T>(path: string): Promise<T | null> {
  try {
    return await get<T>(path);
  } catch (e) {
    if (e instanceof ApiError && e.status === 403) return null;
    throw e;
  }
}

/** A paragraph saying a part needs another token. */
export function notAllowed(what: string): HTMLElement {
  return h("p", { class: "note" }, `${what}: this token may not read it (an admin or operator token may).`);
}

/** The text of an error for the page. */
export function errorBox(e: unknown): HTMLElement {
  const message = e instanceof ApiError ? `${e.message} (${e.code})` : String(e);
  return h("p", { class: "error", role: "alert" }, message);
}
