from caprl.cli import entry

raise SystemExit(entry())
