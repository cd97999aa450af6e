"""Regenerates corpus.txt from Python standard-library docstrings (PSF licence). Not run by tests."""
import importlib, inspect, re

MODS = ["collections", "itertools", "functools", "json", "re", "os", "pathlib", "shutil", "subprocess",
        "threading", "queue", "asyncio", "heapq", "bisect", "datetime", "calendar", "textwrap", "string",
        "difflib", "csv", "sqlite3", "http.client", "urllib.parse", "email.message", "logging", "argparse",
        "unittest", "doctest", "statistics", "random", "decimal", "fractions", "math", "hashlib", "zipfile",
        "tarfile", "tempfile", "socket", "selectors", "contextlib", "dataclasses", "enum", "typing", "abc",
        "copy", "pprint", "pickle", "struct", "codecs", "locale", "gettext", "time", "sched", "io", "glob",
        "fnmatch", "configparser", "secrets", "uuid", "weakref", "types", "operator", "array"]
out, seen = [], set()


def add(doc):
    if not doc:
        return
    for para in re.split(r"\n\s*\n", doc):
        p = " ".join(para.split())
        if len(p) < 80 or p in seen:
            continue
        if sum(c.isalpha() or c == " " for c in p) / len(p) < 0.85:
            continue
        seen.add(p)
        out.append(p)


for name in MODS:
    try:
        m = importlib.import_module(name)
    except Exception:
        continue
    add(inspect.getdoc(m))
    for attr, obj in sorted(vars(m).items()):
        if attr.startswith("_") or getattr(obj, "__module__", None) != m.__name__:
            continue
        if inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj):
            add(inspect.getdoc(obj))
text = "\n\n".join(out)
open("corpus.txt", "w").write(text[:200000].rsplit("\n\n", 1)[0] + "\n")
