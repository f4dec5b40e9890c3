//! Ctrl-C during `eval` and `compare`: the first stops the run once the window being recorded
//! is on disk, and the error says what the run file kept; a second ends the process at once.

use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// The exit status of a run stopped by Ctrl-C (128 + SIGINT, as shells report it).
pub const EXIT_STATUS: i32 = 130;

/// Catches Ctrl-C for the rest of the process (not for a server, which has its own).
pub fn catch() -> crate::Result<()> {
    ctrlc::set_handler(|| {
        if REQUESTED.swap(true, Ordering::SeqCst) {
            std::process::exit(EXIT_STATUS);
        }
        eprintln!("\nstopping after the window in progress (Ctrl-C again to stop at once)");
    })
    .map_err(|e| crate::Error::InvalidArgument(format!("cannot catch Ctrl-C: {e}")))
}

/// Whether Ctrl-C was pressed.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}
