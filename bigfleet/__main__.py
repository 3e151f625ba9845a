"""``python -m bigfleet`` runs the command line."""

from bigfleet.cli import main

main()
