//! Draws the README's speed figure from a benchmark run's summary:
//!
//! ```sh
//! cargo run -p coil-docs --bin speed-svg -- docs/img/speed-zen4-avx512.json docs/img/speed.svg
//! cargo run -p coil-docs --bin speed-svg -- RUN_DIR/summary.json out.svg --title "..."
//! ```
//!
//! `RUN_DIR/summary.json` is what `scripts/bench-vs-llamacpp.sh` writes;
//! `-` as the output writes to stdout.

use anyhow::{bail, Context, Result};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut paths, mut title) = (Vec::new(), None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--title" => title = Some(it.next().context("--title needs a value")?.clone()),
            "-h" | "--help" => {
                println!("usage: speed-svg SUMMARY.json OUT.svg [--title TEXT]");
                return Ok(());
            }
            _ => paths.push(a.clone()),
        }
    }
    let [input, output] = paths.as_slice() else {
        bail!("usage: speed-svg SUMMARY.json OUT.svg [--title TEXT]");
    };
    let json = std::fs::read_to_string(input).with_context(|| format!("reading {input}"))?;
    let fig = coil_docs::speed::parse(&json, title.as_deref())
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("{input}: not a benchmark summary"))?;
    let svg = coil_docs::speed::svg(&fig);
    if output == "-" {
        print!("{svg}");
    } else {
        std::fs::write(output, svg).with_context(|| format!("writing {output}"))?;
    }
    Ok(())
}
