use clap::Parser;

use quantppl::cli::{Cli, Command};

fn main() {
    // Die quietly on a closed pipe (`quantppl inspect DIR | head`), as command-line tools do.
    // SAFETY: setting a signal disposition to its default at start-up, before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // Mesa's Vulkan drivers print "error: XDG_RUNTIME_DIR is invalid" on headless machines
    // while quantppl merely lists adapters; give them the temp directory instead.
    if std::env::var_os("XDG_RUNTIME_DIR").is_none_or(|v| v.is_empty()) {
        // SAFETY: start-up, before any thread exists.
        unsafe { std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir()) };
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Eval(a) => quantppl::cli::eval::run(a, cli.quiet),
        Command::Compare(a) => quantppl::cli::compare::run(a, cli.quiet),
        Command::Merge(a) => quantppl::cli::merge::run(a),
        Command::Inspect(a) => quantppl::cli::inspect::run(a),
        Command::Check(a) => quantppl::cli::check::run(a),
        Command::Synth(a) => quantppl::cli::synth::run(a, cli.quiet),
        Command::Bench(a) => quantppl::cli::bench::run(a, cli.quiet),
        Command::Devices(a) => quantppl::cli::devices::run(a),
        Command::Serve(a) => quantppl::cli::serve::run(a, cli.quiet),
    };
    if let Err(e) = result {
        // One line, naming the thing at fault; never a panic trace.
        eprintln!("error: {e:#}");
        let interrupted = e
            .chain()
            .any(|c| matches!(c.downcast_ref(), Some(quantppl::Error::Interrupted(_))));
        std::process::exit(match interrupted {
            true => quantppl::run::interrupt::EXIT_STATUS,
            false => 1,
        });
    }
}
