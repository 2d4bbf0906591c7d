"""Loads one of the repository's scripts (scripts/, bench/) as a module for the tests."""
import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def load_script(name, path):
    """The module `name` from the file `path` (registered in sys.modules, so that the
    scripts' own imports of each other resolve to it)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
