"""Plumbing that knows no domain: errors, units, bounded JSON and YAML with positions, paths,
the HTTP reader, addresses, terminal text, redaction and secret flags. Imports no other package
of escha_deploy (.importlinter)."""
