use clap::Parser;

use quantppl::cli::{Cli, Command};

fn main() {
    // Die quietly on a closed pipe (`quantppl inspect DIR | head`), as command-line tools do.
    // SAFETY: setting a signal disposition to its default at start-up, before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Eval(a) => quantppl::cli::eval::run(a),
        Command::Compare(a) => quantppl::cli::compare::run(a),
        Command::Merge(a) => quantppl::cli::merge::run(a),
        Command::Inspect(a) => quantppl::cli::inspect::run(a),
        Command::Check(a) => quantppl::cli::check::run(a),
        Command::Synth(a) => quantppl::cli::synth::run(a),
        Command::Bench(a) => quantppl::cli::bench::run(a),
        Command::Devices(a) => quantppl::cli::devices::run(a),
    };
    if let Err(e) = result {
        // One line, naming the thing at fault; never a panic trace.
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
