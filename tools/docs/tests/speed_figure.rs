//! docs/img/speed.svg is what the `speed-svg` tool draws from the committed
//! summary beside it.

use std::path::Path;

#[test]
fn the_committed_figure_is_drawn_from_the_committed_summary() {
    let img = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/img");
    let json = std::fs::read_to_string(img.join("speed-zen4-avx512.json")).expect("summary");
    let fig = coil_docs::speed::parse(&json, None).unwrap_or_else(|e| panic!("{e}"));
    let want = coil_docs::speed::svg(&fig);
    let have = std::fs::read_to_string(img.join("speed.svg")).expect("docs/img/speed.svg");
    assert!(
        have == want,
        "docs/img/speed.svg is not what its summary draws: run `cargo run -p coil-docs --bin \
         speed-svg -- docs/img/speed-zen4-avx512.json docs/img/speed.svg`"
    );
}
