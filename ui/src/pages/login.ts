// The sign-in form: a Drover API token (`drover token create`, or the admin token
// `drover dev` prints), checked against the master, then kept in sessionStorage for
// this tab only.

import { ApiError, clearToken, get, setToken } from "../api";
import { h } from "../dom";
import type { Page } from "../page";

export function loginPage(root: HTMLElement, done: () => void): Page {
  const input = h("input", {
    id: "token",
    name: "token",
    type: "password",
    autocomplete: "off",
    required: true,
    placeholder: "drv_…",
    "aria-describedby": "token-help",
  });
  const error = h("p", { class: "error", role: "alert" });
  const form = h(
    "form",
    { class: "login" },
    h("h1", {}, "Sign in to Drover"),
    h("label", { for: "token" }, "API token"),
    input,
    h(
      "p",
      { id: "token-help", class: "help" },
      "A token from `drover token create` (admin, operator or role token), or the " +
        "admin token of a `drover dev` cluster. It is kept in this tab only " +
        "(sessionStorage) and sent as a bearer token, like the CLI's.",
    ),
    h("button", { type: "submit" }, "Sign in"),
    error,
  );
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    setToken(input.value);
    try {
      await get("/v1/jobs");
      done();
    } catch (err) {
      clearToken();
      error.textContent =
        err instanceof ApiError ? `The master refused it: ${err.message}` : `Cannot reach the master: ${err}`;
    }
  });
  root.append(form);
  input.focus();
  return {};
}
