use clap::Parser;

use quantppl::cli::{Cli, Command};

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Eval(a) => quantppl::cli::eval::run(a),
        Command::Inspect(a) => quantppl::cli::inspect::run(a),
        Command::Check(a) => quantppl::cli::check::run(a),
    };
    if let Err(e) = result {
        // One line, naming the thing at fault; never a panic trace.
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
