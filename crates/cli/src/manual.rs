//! `ferrofs manpages DIR` and `ferrofs completions SHELL`: the man pages and the shell
//! completions, generated from the binary's own clap definition, so a subcommand or option
//! added anywhere appears in them with nothing else to edit. scripts/install.sh runs both on
//! the binary it installs, which keeps the installed pages and completions that binary's.

use crate::failure::{CliResult, Context};
use clap::{Args, Command, CommandFactory};
use clap_complete::Shell;
use std::path::{Path, PathBuf};

/// The section of every page: commands for the administrator, as mkfs(8) and fsck(8).
const SECTION: &str = "8";

#[derive(Args, Debug)]
pub struct ManpagesArgs {
    /// Directory to write ferrofs.8 and one ferrofs-SUBCOMMAND.8 per subcommand into
    /// (created if missing), e.g. /usr/local/share/man/man8.
    pub dir: PathBuf,
}

#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete for; the script goes to standard output.
    pub shell: Shell,
}

pub fn manpages(args: &ManpagesArgs) -> CliResult<()> {
    let dir = &args.dir;
    std::fs::create_dir_all(dir).context(|| format!("manpages: make {}", dir.display()))?;
    let mut cli = crate::Cli::command();
    cli.build();
    // `ferrofs help` stays a command, but has no page of its own for ferrofs(8) to list.
    let cli = cli.mut_subcommand("help", |help| help.hide(true));
    write_page(dir, "ferrofs", cli.clone())?;
    // The subcommands a user sees: not the generators themselves, nor `help`.
    for sub in cli.get_subcommands().filter(|c| !c.is_hide_set()) {
        let name = format!("ferrofs-{}", sub.get_name());
        // Named as its page is, so that NAME and SYNOPSIS read `ferrofs-mkfs` as mkfs's do.
        let page = sub.clone().name(name.clone()).bin_name(format!("ferrofs {}", sub.get_name()));
        write_page(dir, &name, page)?;
    }
    Ok(())
}

fn write_page(dir: &Path, name: &str, cmd: Command) -> CliResult<()> {
    let path = dir.join(format!("{name}.{SECTION}"));
    let mut text = Vec::new();
    let man = clap_mangen::Man::new(cmd)
        .title(name.to_uppercase())
        .section(SECTION)
        .source(concat!("ferrofs ", env!("CARGO_PKG_VERSION")));
    man.render(&mut text).context(|| format!("manpages: render {name}"))?;
    std::fs::write(&path, text).context(|| format!("manpages: write {}", path.display()))
}

pub fn completions(args: &CompletionsArgs) -> CliResult<()> {
    let mut cli = crate::Cli::command();
    clap_complete::generate(args.shell, &mut cli, "ferrofs", &mut std::io::stdout());
    Ok(())
}
