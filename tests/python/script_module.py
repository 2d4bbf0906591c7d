"""Loads one of the repository's scripts (scripts/, bench/) as a module for the tests."""
import importlib.util
import re
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


def assemble(body):
    """cuobjdump --dump-sass instruction lines, 16 bytes apart, each followed by the line
    with the upper 64 bits of its encoding. `name:` before an instruction labels it, `BRA
    name` branches to it, and a trailing `| s` sets the stall count s in bits 41-44 of the
    upper word (default 1), with the yield bit 45 and a read barrier in bits 49-51 set
    too, which must not count as stalls."""
    labels, plain = {}, []
    for line in body:
        m = re.match(r"(\w+):\s*(.*)", line)
        if m:
            labels[m.group(1)] = 16 * len(plain)
            line = m.group(2)
        plain.append(line)
    out = []
    for i, line in enumerate(plain):
        text, _, stall = line.partition("|")
        text = re.sub(r"BRA (\w+)$", lambda m: f"BRA {labels[m.group(1)]:#x}" if m.group(1) in labels else m.group(0),
                      text.strip())
        hi = (int(stall) if stall.strip() else 1) << 41 | 1 << 45 | 5 << 49
        out.append(f"        /*{16 * i:04x}*/                   {text} ;   /* 0x{0x123456789abcdef0:016x} */")
        out.append(f"                                                         /* 0x{hi:016x} */")
    return out
