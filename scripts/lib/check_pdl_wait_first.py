#!/usr/bin/env python3
# Every kernel launched with programmatic dependent launch (kernels/cuda/pdl.cuh launch_pdl, on by
# default on sm_90+) must begin with pdl_wait(): such a kernel may be scheduled while the kernel
# before it is still running, and only griddepcontrol.wait makes that kernel's writes complete
# and visible. A kernel that read or wrote memory before it would race its predecessor, and no
# bit test is sure to catch a race. This check reads the sources (no GPU):
#   - the __global__ functions of the given files and their first statements;
#   - the kernels passed to launch_pdl: the first argument when it names a kernel, else (a lambda's
#     `kernel` parameter) every kernel named in the same top-level function, over-inclusive.
# Usage: check_pdl_wait_first.py FILE...   Exit 1, naming each kernel, where one does not begin
# with `pdl_wait();` (declarations of its own before it count as not beginning with it).
import re
import sys

GLOBAL = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(")
LAUNCH = re.compile(r"\blaunch_pdl\s*\(\s*(\w+)")


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def close_paren(text, i):
    """Index just past the parenthesis that closes the one at text[i]."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "(":
            depth += 1
        elif text[j] == ")":
            depth -= 1
            if depth == 0:
                return j + 1
    raise ValueError("unbalanced parentheses")


def kernels_of(text):
    """name -> list of (line, first statement) over the definitions of __global__ functions."""
    out = {}
    for m in GLOBAL.finditer(text):
        end = close_paren(text, m.end() - 1)
        rest = text[end:].lstrip()
        if not rest.startswith("{"):
            continue  # a declaration
        body = rest[1:].lstrip()
        first = body.split(";", 1)[0].strip() + ";"
        line = text.count("\n", 0, m.start()) + 1
        out.setdefault(m.group(1), []).append((line, first))
    return out


def top_level_chunks(text):
    """(start, end) offsets of top-level pieces: a line starting with '}' closes one."""
    chunks, start = [], 0
    for m in re.finditer(r"^\}[^\n]*\n?", text, flags=re.M):
        chunks.append((start, m.end()))
        start = m.end()
    chunks.append((start, len(text)))
    return chunks


def main(paths):
    texts = {p: strip_comments(open(p, encoding="utf-8").read()) for p in paths}
    kernels = {}
    for p, t in texts.items():
        for name, defs in kernels_of(t).items():
            kernels.setdefault(name, []).extend((p, line, first) for line, first in defs)
    launched = {}  # kernel name -> a launch site
    for p, t in texts.items():
        chunks = top_level_chunks(t)
        for m in LAUNCH.finditer(t):
            site = f"{p}:{t.count(chr(10), 0, m.start()) + 1}"
            if m.group(1) == "void":
                continue  # launch_pdl's own definition (pdl.cuh)
            if m.group(1) in kernels:
                launched.setdefault(m.group(1), site)
                continue
            a, b = next((a, b) for a, b in chunks if a <= m.start() < b)
            named = [k for k in kernels if re.search(rf"\b{k}\b", t[a:b])]
            if not named:
                print(f"{site}: launch_pdl({m.group(1)}, ...) names no kernel this check can see")
                return 1
            for k in named:
                launched.setdefault(k, site)
    bad = 0
    for name in sorted(launched):
        for p, line, first in kernels[name]:
            if not re.fullmatch(r"pdl_wait\s*\(\s*\)\s*;", first):
                print(f"{p}:{line}: {name} is launched with launch_pdl ({launched[name]}) but does "
                      f"not begin with pdl_wait(); it begins with: {first[:80]}")
                bad += 1
    print(f"check_pdl_wait_first: {len(launched)} kernels launched with launch_pdl, "
          f"{bad} not beginning with pdl_wait()")
    return 1 if bad or not launched else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
