//! `GET /`: the chat page, one self-contained HTML file built from `web/`
//! (`web/build.sh`) and embedded here, so the binary serves it with nothing
//! to install and no network. The page holds no data of its own: it is
//! served without an API key and asks for the key before it calls the API
//! (`--api-key` guards every other route as before). `--no-ui` leaves `/`
//! unrouted (404).

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

/// The page: HTML with its script and styles inlined (Markdown, code
/// highlighting and math renderers bundled in).
pub const PAGE: &str = include_str!("../assets/chat.html");

/// Serves [`PAGE`]. Its own Content-Security-Policy (a `<meta>` tag) lets
/// only its inlined script run and only this server be fetched; the
/// headers add what a `<meta>` cannot say (no framing).
pub async fn page() -> Response {
    let mut res = PAGE.into_response();
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("frame-ancestors 'none'"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    res
}

#[cfg(test)]
mod tests {
    use super::PAGE;
    use sha2::{Digest, Sha256};
    use std::path::Path;

    fn between<'a>(s: &'a str, open: &str, close: &str) -> &'a str {
        let from = s.find(open).unwrap_or_else(|| panic!("no {open}")) + open.len();
        let len = s[from..]
            .find(close)
            .unwrap_or_else(|| panic!("no {close}"));
        &s[from..from + len]
    }

    fn base64(bytes: &[u8]) -> String {
        const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let b = [
                chunk[0],
                *chunk.get(1).unwrap_or(&0),
                *chunk.get(2).unwrap_or(&0),
            ];
            let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
            for k in 0..4 {
                if k <= chunk.len() {
                    out.push(ABC[(n >> (18 - 6 * k) & 63) as usize] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    /// The page's policy names its one script by hash: a page whose script
    /// was edited after the build would load and do nothing.
    #[test]
    fn the_policy_lets_the_pages_own_script_run_and_nothing_else() {
        let csp = between(
            PAGE,
            "http-equiv=\"Content-Security-Policy\" content=\"",
            "\"",
        );
        assert!(csp.contains("default-src 'none'"), "{csp}");
        assert!(csp.contains("connect-src 'self'"), "{csp}");
        assert!(!csp.contains("unsafe-eval"), "{csp}");
        let script_src = between(csp, "script-src ", ";");
        assert!(!script_src.contains("unsafe-inline"), "{csp}");
        assert_eq!(PAGE.matches("<script>").count(), 1, "one inline script");
        let script = between(PAGE, "<script>", "</script>");
        // What the HTML parser would read as markup inside the script.
        for markup in ["<!--", "<script", "</script"] {
            assert!(!script.to_lowercase().contains(markup), "{markup}");
        }
        let hash = base64(&Sha256::digest(script.as_bytes()));
        assert_eq!(script_src, format!("'sha256-{hash}'"));
        assert!(base64(b"coil!") == "Y29pbCE=" && base64(b"ab") == "YWI=");
    }

    /// The embedded page is what `web/build.sh` makes of the sources in
    /// `web/` (the same fingerprint as build.mjs computes).
    #[test]
    fn the_page_is_built_from_the_sources_in_web() {
        let web = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../web");
        let mut files = vec![
            "build.mjs".to_string(),
            "package.json".into(),
            "package-lock.json".into(),
        ];
        let mut src: Vec<String> = std::fs::read_dir(web.join("src"))
            .expect("web/src")
            .map(|e| format!("src/{}", e.expect("entry").file_name().to_string_lossy()))
            .collect();
        src.sort();
        files.extend(src);
        let mut h = Sha256::new();
        for f in &files {
            h.update(f.as_bytes());
            h.update([0]);
            h.update(std::fs::read(web.join(f)).expect("a source file"));
            h.update([0]);
        }
        let want: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        let got = between(PAGE, "sources sha256:", " ");
        assert_eq!(
            got, want,
            "crates/coil-server/assets/chat.html was not built from web/ as it is: run web/build.sh"
        );
    }
}
