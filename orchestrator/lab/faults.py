"""stub"""
from typing import Any

import click


def describe(fault: dict[str, Any]) -> str:
    return str(fault)


@click.group()
def fault() -> None:
    """Inject faults."""
