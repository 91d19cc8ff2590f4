"""The release of the anarchon distribution: the one place it is written.

The build reads it from here (``[tool.hatch.version]`` in pyproject.toml); the
three packages, their commands and the registry of live instances read it
from here too, so they agree in an installed wheel and in a source tree alike.
"""

__version__ = "0.2.0"
