"""The SGLang runtime: patch series, file inventory, verification and runtime description.

Import-free on purpose (the CLI imports submodules inside command bodies), and ``hooks/``
holds the standard-library-only modules the patched SGLang calls into (see docs/runtime.md).
"""
