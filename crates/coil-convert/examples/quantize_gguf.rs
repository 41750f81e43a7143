//! `coil quantize` without the CLI (for timing the library):
//! `quantize_gguf IN.gguf OUT.gguf TYPE`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 4 {
        return Err("usage: quantize_gguf IN.gguf OUT.gguf TYPE".into());
    }
    let mix = coil_convert::QuantMix::parse(&a[3]).ok_or("unknown type")?;
    let r = coil_convert::quantize(
        a[1].as_ref(),
        a[2].as_ref(),
        &coil_convert::QuantizeOptions::new(mix),
    )?;
    println!("{:?}", r.types);
    Ok(())
}
