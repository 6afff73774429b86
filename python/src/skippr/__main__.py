"""``python -m skippr``: the package's version, or the bundled ``skipprd`` with the same arguments.

``python -m skippr --version`` prints the version of the installed distribution, which is the
version of the ``skipprd`` binary it ships (both come from the crate's Cargo.toml).
``python -m skippr ARGS`` runs the ``skipprd`` installed with this package, so a virtualenv's
binary can be reached without activating the environment.
"""

from __future__ import annotations

import os
import subprocess
import sys

from . import __version__, skipprd_path


def main(argv: list[str]) -> int:
    if argv in (["--version"], ["-V"]):
        print(f"skippr {__version__}")
        return 0
    binary = skipprd_path()
    if binary is None:
        print(
            "error: the skipprd binary is not installed next to this Python package; "
            "install the skipprd wheel (docs/install.md) or put skipprd on PATH",
            file=sys.stderr,
        )
        return 127
    if os.name == "posix":
        os.execv(binary, [binary, *argv])
    return subprocess.call([binary, *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
