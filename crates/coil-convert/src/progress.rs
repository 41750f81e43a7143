//! The progress bar (bytes and ETA on stderr; hidden when stderr is not a
//! terminal or when turned off).

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub(crate) fn bar(total_bytes: u64, show: bool, what: &str) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(
        Some(total_bytes),
        if show {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        },
    );
    let style = ProgressStyle::with_template(
        "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ");
    pb.set_style(style);
    pb.set_message(what.to_string());
    pb
}
