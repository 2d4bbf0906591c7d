"""Reading cuobjdump --dump-sass listings: the parsing shared by sass_check.py and
sass_count.py (no GPU needed, only cuobjdump and, for readable names, c++filt)."""
import re
import shutil
import subprocess
from typing import NamedTuple

_FUNCTION = re.compile(r"\s*Function : (\S+)")
_ARCH = re.compile(r"\s*code for (sm_\w+)")
# `        /*0390*/                   @!P0 BRA 0x540 ;   /* 0x... */`
_INSTRUCTION = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][\w.]*)\s*([^;]*);")
# The line after an instruction: the upper 64 bits of its 128-bit encoding.
_ENCODING = re.compile(r"\s*/\* (0x[0-9a-f]{16}) \*/\s*$")


class Instruction(NamedTuple):
    addr: int       # byte offset in the function
    pred: str       # guard predicate ("@!P0"), "" when none
    op: str         # mnemonic with modifiers ("LDSM.16.MT88.4")
    operands: str   # the rest up to the ';' ("R4, [R2+UR4]")
    ctrl: int = 0   # upper 64 bits of the encoding (0 when the listing has none)

    @property
    def base(self) -> str:
        """The mnemonic without modifiers ("LDSM")."""
        return self.op.split(".")[0]

    @property
    def stall(self) -> int:
        """Cycles the warp waits before issuing its next instruction, as ptxas encoded them
        for fixed-latency dependences and pipe throughput (bits 105-108 of the Volta-and-later
        encoding); variable-latency results (loads, MUFU, SHFL, wgmma) wait on scoreboards
        instead and are not counted here."""
        return (self.ctrl >> 41) & 0xF


def functions(sass: str):
    """(arch, name, lines) per function of a listing; arch is the `code for sm_XX` above it
    ("" when the listing has none), lines the function's raw text lines."""
    arch, name, body = "", None, []
    for line in sass.splitlines():
        m = _FUNCTION.match(line)
        a = _ARCH.match(line)
        if (m or a) and name:
            yield fn_arch, name, body
            name = None
        if a:
            arch = a.group(1)
        elif m:
            fn_arch, name, body = arch, m.group(1), []
        elif name:
            body.append(line)
    if name:
        yield fn_arch, name, body


def instructions(lines):
    """The Instructions of a function's lines, in address order (encoding lines skipped)."""
    out = []
    for i, line in enumerate(lines):
        m = _INSTRUCTION.match(line)
        if m:
            e = _ENCODING.match(lines[i + 1]) if i + 1 < len(lines) else None
            out.append(Instruction(int(m.group(1), 16), (m.group(2) or "").strip(), m.group(3), m.group(4).strip(),
                                   int(e.group(1), 16) if e else 0))
    return out


def branch_target(ins: Instruction):
    """Target address of a direct branch (BRA, BRA.DIV, ...), else None."""
    if ins.base != "BRA":
        return None
    m = re.search(r"0x([0-9a-f]+)\s*$", ins.operands)
    return int(m.group(1), 16) if m else None


def back_edges(ins):
    """(target index, branch index) of every backward branch (target <= its own address)
    in a function's Instructions: each closes a loop [target, branch]."""
    index = {x.addr: i for i, x in enumerate(ins)}
    return [(index[t], i) for i, x in enumerate(ins)
            if (t := branch_target(x)) is not None and t <= x.addr and t in index]


def dump_sass(cuobjdump: str, path: str) -> str:
    """cuobjdump --dump-sass of an object file or executable; RuntimeError naming the file."""
    try:
        res = subprocess.run([cuobjdump, "--dump-sass", path], capture_output=True, text=True)
    except OSError as e:
        raise RuntimeError(f"cannot run {cuobjdump}: {e}") from e
    if res.returncode != 0:
        raise RuntimeError(f"{cuobjdump} failed on {path}: {res.stderr.strip()[:200]}")
    return res.stdout


def matching_functions(cuobjdump: str, paths, pattern: str, arch: str = "all"):
    """(path, arch, name, lines) of every function whose mangled name matches the regex
    `pattern`, in the `arch` code ("all": every arch) of each file; RuntimeError from
    dump_sass."""
    for path in paths:
        for a, name, lines in functions(dump_sass(cuobjdump, path)):
            if re.search(pattern, name) and (arch == "all" or a == arch):
                yield path, a, name, lines


def demangle(names):
    """C++ names through c++filt (the names unchanged when it is absent)."""
    cxxfilt = shutil.which("c++filt")
    if not cxxfilt or not names:
        return list(names)
    out = subprocess.run([cxxfilt], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return out if len(out) == len(names) else list(names)
