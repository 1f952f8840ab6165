"""Fuzz ``pullback.parse`` for a set time: ``python scripts/fuzz.py --seconds 60``.

Inputs are printed generated programs mutated at the token and byte level
(delete / duplicate / swap / insert tokens, random bytes, truncation, numbers
made huge: thousands of digits, past int64, overflowing floats), programs with
an unused binding inserted (well- or ill-typed: the parser type-checks it), plus
deeply nested parentheses, tuples, calls and ifs. Every input must either parse or
raise ``pullback.ParseError``; anything else (another exception, a
RecursionError, an input taking more than ``--hang-seconds``) is printed with
the input saved under ``--out`` and the exit status is 1. Prints the number of
inputs tried.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
import time

import pullback as pb
from pullback.testing.programs import random_program

TOKEN = re.compile(r"%[\w.]+|@[\w.]+|[A-Za-z_][\w.]*|-?\d+(?:\.\d*)?(?:e-?\d+)?|\s+|.", re.S)
NOISE = ["(", ")", ",", "[", "]", "{", "}", "=", ";", "%", "@", "->", ":", "?", ".", "0", "-1", "1e999", "nan",
         "if", "else", "def", "fn", "Tensor", "float32", "int32", "bool", "const", "add", "nn.dense", "\"", "#",
         "\n", "\x00", "\u00e9", "%0", "%x", "@main", "axis=", "Primitive=1", "meta[relay.Constant][0]"]
HUGE = ["9" * 5000, "-" + "9" * 5000, "1" + "0" * 23, str(2**63), str(2**63 - 1), str(-(2**63) - 1), "1e999",
        "9" * 400 + ".5", "1e-99999", "0" * 5000 + "7", "1e" + "9" * 5000]
NUMBER = re.compile(r"-?\d")
NEST = [("(", "%x", ")"), ("(%x, ", "%x", ")"), ("tanh(", "%x", ")"), ("add(%x, ", "%x", ")"),
        ("if (%c) { ", "%x", " } else { %x }"), ("(", "%x", ",)")]


def seeds(rng: random.Random, n: int = 40) -> list[str]:
    """Printed generated programs to mutate."""
    return [pb.astext(random_program(rng.randrange(2**31), max_nodes=rng.randint(1, 10))) for _ in range(n)]


def nested(rng: random.Random, max_depth: int) -> str:
    """A program with one construct nested up to ``max_depth`` deep (possibly unbalanced)."""
    left, mid, right = rng.choice(NEST)
    depth = rng.choice((10, 1000, max_depth))
    closing = depth if rng.random() < 0.7 else rng.randint(0, depth)
    body = left * depth + mid + right * closing
    return f"def @main(%x: Tensor[(2,), float32], %c: bool) {{ {body} }}"


def mutate(rng: random.Random, text: str) -> str:
    """``text`` with 1..8 token- or byte-level mutations."""
    toks = TOKEN.findall(text)
    for _ in range(rng.randint(1, 8)):
        k = rng.randrange(8)
        i = rng.randrange(len(toks)) if toks else 0
        if k == 0 and toks:
            del toks[i]
        elif k == 1 and toks:
            toks.insert(i, toks[rng.randrange(len(toks))])
        elif k == 2 and len(toks) > 1:
            j = rng.randrange(len(toks))
            toks[i], toks[j] = toks[j], toks[i]
        elif k == 3:
            toks.insert(i, rng.choice(NOISE))
        elif k == 4:
            toks.insert(i, bytes(rng.randrange(256) for _ in range(rng.randint(1, 4))).decode("latin-1"))
        elif k == 5 and toks:
            toks = toks[: i]
        elif k == 7:
            _enlarge(rng, toks)
        elif toks:
            toks[i] = rng.choice(NOISE)
    return "".join(toks)


def _enlarge(rng: random.Random, toks: list) -> None:
    numbers = [j for j, t in enumerate(toks) if NUMBER.match(t)]
    if numbers:
        toks[rng.choice(numbers)] = rng.choice(HUGE)


def huge_numbers(rng: random.Random, text: str) -> str:
    """``text`` with one to three of its numbers (dims, indices, literals) made huge."""
    toks = TOKEN.findall(text)
    for _ in range(rng.randint(1, 3)):
        _enlarge(rng, toks)
    return "".join(toks)


BINDING = re.compile(r"^( *)(%\w+) = [^\n]*;$", re.M)
DEAD = ["tanh({a})", "add({a}, {b})", "nn.dense({a}, {b})", "({a}, {b})", "{a}.1", "sum({a}, axis=1)",
        "reshape({a}, newshape=(-1,))", "add({a}, const([1.0, 2.0], float32))", "if (const(True)) {{ {a} }} else {{ {b} }}"]


def unused_binding(rng: random.Random, text: str) -> str:
    """``text`` with ``%dead = op(...);`` that nothing uses inserted after one of its bindings."""
    sites = list(BINDING.finditer(text))
    if not sites:
        return text
    m = rng.choice(sites)
    names = [x.group(2) for x in sites if x.start() <= m.start() and x.group(1) == m.group(1)]
    call = rng.choice(DEAD).format(a=m.group(2), b=rng.choice(names))
    return f"{text[: m.end()]}\n{m.group(1)}%dead = {call};{text[m.end():]}"


def fuzz_input(rng: random.Random, corpus: list[str], max_depth: int = 100_000) -> str:
    r = rng.random()
    if r < 0.05:
        return nested(rng, max_depth)
    if r < 0.08:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 200))).decode("latin-1")
    if r < 0.16:
        text = unused_binding(rng, rng.choice(corpus))
        return text if rng.random() < 0.5 else mutate(rng, text)
    return mutate(rng, rng.choice(corpus))


def check_one(text: str) -> str | None:
    """None if ``text`` parses or raises ParseError; else a description of the failure."""
    try:
        pb.parse(text)
    except pb.ParseError:
        return None
    except BaseException as e:  # noqa: BLE001 - the point of the fuzzer
        if isinstance(e, KeyboardInterrupt):
            raise
        return f"{type(e).__name__}: {e}"
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--hang-seconds", type=float, default=10.0)
    ap.add_argument("--out", default="fuzz-failures")
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    rng = random.Random(seed)
    corpus = seeds(rng)
    start = time.perf_counter()
    tried = failures = 0
    while time.perf_counter() - start < args.seconds:
        text = fuzz_input(rng, corpus)
        t0 = time.perf_counter()
        problem = check_one(text)
        took = time.perf_counter() - t0
        if problem is None and took > args.hang_seconds:
            problem = f"took {took:.1f}s"
        tried += 1
        if problem is not None:
            failures += 1
            os.makedirs(args.out, exist_ok=True)
            path = os.path.join(args.out, f"failure-{seed}-{tried}.txt")
            with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
                f.write(text)
            print(f"FAIL #{tried}: {problem.splitlines()[0][:200]} (input saved to {path})")
    print(f"fuzz: seed {seed}, {tried} inputs tried in {time.perf_counter() - start:.1f}s, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
