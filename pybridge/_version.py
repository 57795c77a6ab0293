__version__ = "0.1.0"  # the one source: pyproject.toml, the CLIs and pb_version() read it
