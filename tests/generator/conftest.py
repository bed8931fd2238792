"""Keep ``import generator`` pointing at the project's package.

This folder is called ``generator`` and has no ``__init__.py``. pytest
(default "prepend" import mode) puts ``tests/`` on ``sys.path`` for the root
``conftest.py``, and when the repository root itself is not on ``sys.path``
(plain ``pytest`` instead of ``python -m pytest``, or another working
directory) Python's path finder takes this folder for a namespace package
named ``generator`` before the editable install's finder is asked. The
repository root on ``sys.path`` makes the real package win: a regular package
beats namespace portions wherever they are on the path.
"""

from __future__ import annotations

import sys
from pathlib import Path

_REPO = str(Path(__file__).resolve().parents[2])
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)
_imported = sys.modules.get("generator")
if _imported is not None and getattr(_imported, "__file__", None) is None:
    # The namespace package was imported already: forget it.
    for _name in [n for n in sys.modules if n.split(".")[0] == "generator"]:
        del sys.modules[_name]
