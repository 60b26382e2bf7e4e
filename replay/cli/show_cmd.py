"""`replay show`: placeholder until the foundation helper writes it."""
import click


@click.command("show")
def command() -> None:
    """List a snapshot's calls and tensors."""
    raise click.UsageError("not yet written")
