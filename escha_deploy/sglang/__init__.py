"""SGLang as data: its releases (facts, flag catalogs, late checks), the flag check of an argv,
the capabilities our patch series adds, and model architectures as SGLang types them. Reads
nothing of the machine (.importlinter)."""
