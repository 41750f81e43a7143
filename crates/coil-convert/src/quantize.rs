//! placeholder
pub struct QuantizeOptions;
pub struct QuantizeReport;
pub enum QuantMix {}
pub fn quantize() {}
