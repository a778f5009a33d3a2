//! Progress bars on stderr (indicatif hides them when stderr is not a terminal).

use indicatif::{ProgressBar, ProgressStyle};
use std::time::Duration;

const TEMPLATE: &str = "{spinner} {msg:<36} [{bar:30}] {pos}/{len} {per_sec:>12} {elapsed:>4}";
const TICK: Duration = Duration::from_millis(100);

/// A bar counting `len` steps, or a hidden one when `visible` is false.
pub fn counter(visible: bool, len: u64, message: &str) -> ProgressBar {
    if !visible {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len).with_style(style()).with_message(message.to_string());
    bar.enable_steady_tick(TICK);
    bar
}

fn style() -> ProgressStyle {
    // The template is a constant: a parse failure is a bug in this file, caught by its test.
    ProgressStyle::with_template(TEMPLATE).unwrap_or_else(|_| ProgressStyle::default_bar()).progress_chars("=> ")
}

#[cfg(test)]
mod tests {
    #[test]
    fn template_parses() {
        assert!(indicatif::ProgressStyle::with_template(super::TEMPLATE).is_ok());
    }
}
