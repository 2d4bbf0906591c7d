"""Loads one of the repository's scripts (scripts/, bench/) as a module for the tests."""
import importlib.util
import subprocess
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


def run_with_listing(tmp_path, script, listing_text, *extra):
    """Runs a SASS script (scripts/sass_check.py, sass_count.py) on an empty object file
    through a stand-in cuobjdump that prints `listing_text`: (exit status, stdout, stderr)."""
    sass = tmp_path / "listing.sass"
    sass.write_text(listing_text)
    fake = tmp_path / "cuobjdump"
    fake.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.write(open({str(sass)!r}).read())\n")
    fake.chmod(0o755)
    obj = tmp_path / "kernel.o"
    obj.write_bytes(b"")
    res = subprocess.run([sys.executable, str(script), "--cuobjdump", str(fake), str(obj), *extra],
                         capture_output=True, text=True)
    return res.returncode, res.stdout, res.stderr
