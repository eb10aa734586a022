"""The command line: ``app.py`` registers verbs; one module per verb; shared options in ``options.py``."""
