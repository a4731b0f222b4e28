//! The web UI's files (built from ui/ by scripts/ui.sh into ui/dist, committed, and
//! embedded here so the master needs no other server): `index.html` for `/`, `/ui/`
//! and every other `/ui/...` path (the page routes on the client), and the script
//! and style sheet under `/ui/assets/`. The files hold no data: every page reads the
//! API with the user's token (docs/ui.md), so these routes need none.

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

const INDEX_HTML: &str = include_str!("../../ui/dist/index.html");
const APP_JS: &str = include_str!("../../ui/dist/assets/app.js");
const APP_CSS: &str = include_str!("../../ui/dist/assets/app.css");

/// The content security policy of every UI file: only this origin's script, style
/// and API; no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                   connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
                   form-action 'self'; frame-ancestors 'none'";

/// One embedded file with its type and the headers every UI answer carries.
fn file(content_type: &'static str, body: &'static str) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            // Names are fixed (no content hash): revalidate on every load.
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(CSP),
            ),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            (
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            ),
        ],
        body,
    )
        .into_response()
}

/// The page.
fn page() -> Response {
    file("text/html; charset=utf-8", INDEX_HTML)
}

/// The web UI's page (no token: the page reads the API with the user's token).
#[utoipa::path(
    get,
    path = "/",
    tag = "ui",
    responses((status = 200, description = "The web UI's page (docs/ui.md).", content_type = "text/html", body = String)),
)]
pub async fn root() -> Response {
    page()
}

/// The web UI's page, as at `/`.
#[utoipa::path(
    get,
    path = "/ui",
    tag = "ui",
    responses((status = 200, description = "The web UI's page (docs/ui.md).", content_type = "text/html", body = String)),
)]
pub async fn ui() -> Response {
    page()
}

/// The web UI's page, as at `/`.
#[utoipa::path(
    get,
    path = "/ui/",
    tag = "ui",
    responses((status = 200, description = "The web UI's page (docs/ui.md).", content_type = "text/html", body = String)),
)]
pub async fn ui_slash() -> Response {
    page()
}

/// A file of the web UI: `assets/app.js`, `assets/app.css`, or the page for any
/// other path (the app routes on the client).
#[utoipa::path(
    get,
    path = "/ui/{path}",
    tag = "ui",
    params(("path" = String, Path, description = "`assets/app.js`, `assets/app.css`, or a page's path (e.g. `jobs/www-data/prod/hello`).")),
    responses(
        (status = 200, description = "The file, or the page.", content(
            (String = "text/html"),
            (String = "text/javascript"),
            (String = "text/css"),
        )),
        (status = 404, description = "Another path under `assets/`.", content_type = "text/plain", body = String),
    ),
)]
pub async fn path(Path(path): Path<String>) -> Response {
    match path.as_str() {
        "assets/app.js" => file("text/javascript; charset=utf-8", APP_JS),
        "assets/app.css" => file("text/css; charset=utf-8", APP_CSS),
        p if p.starts_with("assets/") => (
            StatusCode::NOT_FOUND,
            "no such UI file; the UI's files are index.html, assets/app.js and assets/app.css",
        )
            .into_response(),
        _ => page(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_the_embedded_files() {
        // vite's fixed names (ui/vite.config.ts) are the ones served here.
        assert!(INDEX_HTML.contains("/ui/assets/app.js"), "{INDEX_HTML}");
        assert!(INDEX_HTML.contains("/ui/assets/app.css"), "{INDEX_HTML}");
        assert!(!APP_JS.is_empty() && !APP_CSS.is_empty());
    }
}
