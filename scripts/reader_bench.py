"""How fast steplens reads a big trace, against the fastest bare parse of the same file, and how much memory it holds.

    python scripts/reader_bench.py FOLDER                    # 291 MB and 1.07 GB traces, 3 rounds
    python scripts/reader_bench.py FOLDER --copies 6 --rounds 1
    python scripts/reader_bench.py FOLDER --instructions        # instructions executed, on the source trace

FOLDER receives the scaled traces (scripts/scale_trace.py: copies of a workers=0 full trace, made once and kept),
a second name of each (for diff) and a folder of two ranks of each (for ranks). First every bare parser at hand
reads the smallest trace, each in a fresh process, orjson on runs of four sizes: the two fastest are the parses
the others are measured against (every command gets one sample a round, and right before it each of the two
parses one, the faster counting: two close parsers swap places from survey to survey). Each gives every event
as a Python object: a dict, or (events) a struct of the keys the profiler writes, steplens's own decode
(steplens/trace/reader.py's Event; it refuses any other key, so it is no parser of any JSON, but it reads every
value of these traces). Each parser is timed SURVEY times, its fastest kept.
Then, round after round, each trace is read by `steplens summarize`, `steplens diff` of the trace and its second
name, and `steplens ranks` of its two ranks, each right after the bare parses of the same trace (a machine's speed
drifts over minutes: a command is compared with the parse just before it, not one read minutes earlier), each in a
fresh process: its wall time, CPU time and peak memory (GNU time's maximum resident set). The table gives each
one's median over the rounds, and the median of its per-round ratio to the bare parse of what it reads: one parse
of the trace for summarize, two for diff and ranks (each reads two traces), and the ratio of the fastest round of
each to the fastest of the parses run just before it (as many samples on both sides): on a shared machine other
work only ever adds time, so each one's fastest round is the one least disturbed. The last column, the strictest:
each command's fastest round over the fastest parse of its trace in all the rounds.

--instructions: the instructions each command executes instead (valgrind --tool=cachegrind --cache-sim=no, with
PYTHONHASHSEED=0), on the unscaled source trace, once each: a count other work on a shared machine does not move,
where wall times on such a machine move by half between rounds. It counts work, not time (a cache miss costs more
than an instruction); valgrind runs a command about 50 times slower."""

import argparse
import gzip
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time

TIME = "/usr/bin/time"  # GNU time: the peak RSS of the command alone
VALGRIND = "valgrind"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(
    ROOT,
    "results/h200-reprofile/eager/runs/cd71033606ba42f6b997804deb9ae741/outputs/traces/trace-cycle2-steps7-9.pt.trace.json.gz",
)
# orjson on runs of whole events of each size (characters): 256 kB took 1.2-2.3 times as long as 16-64 kB here
PARSERS = ("orjson:16384", "orjson:32768", "orjson:65536", "orjson:262144", "events:16384", "events:32768",
           "msgspec:16384", "json", "ijson", "simdjson", "raw_decode")  # fmt: skip
SURVEY = 2  # samples of each parser in the survey: the fastest of them counts
READS = {"parse": 1, "summarize": 1, "diff": 2, "ranks": 2}  # the traces each command reads
RUN = 1 << 15  # characters of whole events parsed at once by the chunked parsers (orjson:N: N)
_NEXT = re.compile(r"[ \t\n\r]*\{")
_SEP = re.compile(r"[ \t\n\r]*,?[ \t\n\r]*")


def event_texts(path):
    """The text of traceEvents' elements, in runs of whole events ('},' that a '{' follows: an event's end)."""
    import codecs

    decode = codecs.getincrementaldecoder("utf-8")().decode
    with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
        buf = decode(f.read(1 << 20))
        buf = buf[buf.index("[", buf.index('"traceEvents"')) + 1 :]
        while True:
            data = f.read(1 << 20)
            buf += decode(data, final=not data)
            pos = 0
            while True:
                end = pos + RUN
                while True:
                    cut = buf.rfind("},", pos, end)
                    if cut < 0 or _NEXT.match(buf, cut + 2):
                        break
                    end = cut + 1
                if cut < 0:  # no event ends within RUN: up to the first that ends after it (a long event, alone)
                    cut = pos + RUN - 1
                    while True:
                        cut = buf.find("},", cut)
                        if cut < 0 or _NEXT.match(buf, cut + 2):
                            break
                        cut += 1
                if cut < 0:
                    break
                yield buf[pos : cut + 1]
                pos = cut + 2
            buf = buf[pos:]
            if not data:
                break
        yield buf[: buf.rindex("]")]


def parse(name, path):
    """How many events the parser `name` finds in the trace, each made a Python object and dropped."""
    global RUN
    name, _, run = name.partition(":")
    if run:
        RUN = int(run)
    if name in ("orjson", "events", "msgspec", "json", "simdjson"):
        if name == "orjson":
            import orjson

            loads = orjson.loads
        elif name == "events":  # steplens's own decode (msgspec): each event a struct of the profiler's keys
            from steplens.trace.reader import _EVENTS as loads
        elif name == "msgspec":  # its generic decode: dicts, lists, numbers and strings, as orjson's
            import msgspec

            loads = msgspec.json.Decoder().decode
        elif name == "simdjson":
            import simdjson

            parser = simdjson.Parser()
            loads = lambda text: parser.parse(text.encode()).as_list()  # noqa: E731
        else:
            loads = json.loads
        return sum(len(loads("[" + text + "]")) for text in event_texts(path))
    if name == "ijson":
        import ijson

        with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
            return sum(1 for _ in ijson.items(f, "traceEvents.item", use_float=True))
    if name == "raw_decode":  # one json.raw_decode per event, as steplens read before
        decode, n = json.JSONDecoder().raw_decode, 0
        for text in event_texts(path):
            pos = _SEP.match(text).end()
            while pos < len(text):
                _, pos = decode(text, pos)
                pos = _SEP.match(text, pos).end()
                n += 1
        return n
    raise SystemExit(f"reader_bench.py: error: no parser {name!r}")


def measure(cmd):
    """(wall s, CPU s, peak RSS MB) of a command in a fresh process, started by /usr/bin/time: a child forked
    from this process would count this process's own memory in its peak (Linux keeps the high-water mark
    across exec). Its modules' bytecode is kept (an installed steplens's is): not compiled again each run."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    start = time.perf_counter()
    proc = subprocess.run([TIME, "-f", "%M %U %S", *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    wall = time.perf_counter() - start
    err = proc.stderr.decode().strip().splitlines()
    if proc.returncode:
        raise SystemExit(f"reader_bench.py: error: {' '.join(cmd)} exited {proc.returncode}: {err[-3:]}")
    kb, user, system = err[-1].split()
    return wall, float(user) + float(system), int(kb) / 1024


def instructions(cmd):
    """The instructions a command executes (cachegrind's I refs), in a fresh process, string hashing fixed."""
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONHASHSEED="0")
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as in measure()
    proc = subprocess.run(
        [VALGRIND, "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null", *cmd],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    err = proc.stderr.decode()
    found = re.search(r"I\s+refs:\s+([\d,]+)", err)
    if proc.returncode or not found:
        raise SystemExit(f"reader_bench.py: error: {' '.join(cmd)} under valgrind: {err.strip().splitlines()[-3:]}")
    return int(found.group(1).replace(",", ""))


def count_instructions(folder, source):
    """Each command's instructions on the source trace, and its ratio to the bare parse of what it reads: the fewer of
    orjson's (32 kB runs) and steplens's own decode into structs (events)."""
    sizes = {1: prepare(folder, 1, source)}
    mb = sizes[1]["json_bytes"] / 1e6
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} {platform.node()}: instructions (cachegrind), {sizes[1]['trace']}")
    print(f"# one copy of {source} by scripts/scale_trace.py, {mb:.0f} MB of JSON")
    counts = {}
    for name in ("orjson", "events"):
        counts[name] = instructions(next(commands(sizes, name))[2])
        print(f"parse {name:<8} {counts[name]:>16,} instructions", flush=True)
    counts["parse"] = min(counts["orjson"], counts["events"])
    for copies, task, cmd in commands(sizes, "orjson"):
        if task == "parse":
            continue
        counts[task] = instructions(cmd)
        ratio = counts[task] / (counts["parse"] * READS[task])
        print(
            f"{task:<10} {counts[task]:>16,} instructions  {ratio:5.2f} x the bare parse of what it reads", flush=True
        )
    return 0


def prepare(folder, copies, source):
    """The scaled trace (made once), its second name, and its two-rank folder."""
    trace = os.path.join(folder, f"w0-x{copies}.pt.trace.json.gz")
    if not os.path.exists(trace):
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "scale_trace.py"), source, trace,
                        "--copies", str(copies)], check=True)  # fmt: skip
    second = os.path.join(folder, f"w0-x{copies}-b.pt.trace.json.gz")
    ranks = os.path.join(folder, f"ranks-x{copies}")
    for link in (second, *(os.path.join(ranks, f"rank{r}", "t.pt.trace.json.gz") for r in (0, 1))):
        os.makedirs(os.path.dirname(link), exist_ok=True)
        if not os.path.exists(link):
            os.link(trace, link)
    with gzip.open(trace, "rb") as f:
        json_bytes = sum(len(b) for b in iter(lambda: f.read(1 << 24), b""))
    return {"trace": trace, "second": second, "ranks": ranks, "json_bytes": json_bytes}


def commands(sizes, parser):
    py, me = sys.executable, os.path.abspath(__file__)
    for copies, p in sizes.items():
        yield copies, "parse", [py, me, "--parse", parser, p["trace"]]
        yield copies, "summarize", [py, "-m", "steplens", "summarize", "--json", p["trace"]]
        yield copies, "diff", [py, "-m", "steplens", "diff", "--json", p["trace"], p["second"]]
        yield copies, "ranks", [py, "-m", "steplens", "ranks", "--json", p["ranks"]]


def rounds(sizes, fastest, n_rounds):
    """Every command in turn, each right after a bare parse of its trace by each of the survey's fastest parsers
    (in turns of order; the faster counts: a survey of two samples can pick the slower of two close ones), round
    after round: {(copies, task): [(wall, CPU, peak RSS, the wall of the parse just before), ...]} (a parse's
    own: None)."""
    rows, me = {}, os.path.abspath(__file__)
    for r in range(1, n_rounds + 1):
        for copies, task, cmd in commands(sizes, fastest[0]):
            if task == "parse":
                continue
            parses = []
            for name in fastest if r % 2 else fastest[::-1]:
                parses.append(measure([sys.executable, me, "--parse", name, sizes[copies]["trace"]]))
                wall, cpu, rss = parses[-1]
                print(
                    f"round {r} x{copies:<3} parse {name:<14} wall {wall:7.2f} s  cpu {cpu:7.2f} s  peak {rss:6.1f} MB"
                )
            rows.setdefault((copies, "parse"), []).append((*min(parses), None))
            wall, cpu, rss = measure(cmd)
            rows.setdefault((copies, task), []).append((wall, cpu, rss, min(parses)[0]))
            print(
                f"round {r} x{copies:<3} {task:<10} wall {wall:7.2f} s  cpu {cpu:7.2f} s  peak {rss:6.1f} MB",
                flush=True,
            )
    return rows


def table(rows, sizes):
    """The Markdown table of the rounds: medians, the peak, and three ratios to the bare parse (the last: each
    command's fastest round over the fastest parse of its trace anywhere in the rounds, the strictest)."""
    print(
        "\n| trace | command | traces read | wall s (median) | CPU s | peak RSS MB (max) "
        "| wall / the parse just before, of what it reads (median of rounds) | fastest round / fastest parse before "
        "| fastest round / fastest parse of the run |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for (copies, task), got in rows.items():
        parse_walls = [w for w, _, _, _ in rows[(copies, "parse")]]
        # each against the parse just before it; diff and ranks read two traces: their bare parse is two parses
        ratios = [w / ((before or w) * READS[task]) for w, _, _, before in got]
        befores = [before for *_, before in got if before is not None] or parse_walls  # as many as its rounds
        mb = sizes[copies]["json_bytes"] / 1e6
        print(
            f"| {mb:.0f} MB | {task} | {READS[task]} | {statistics.median(w for w, _, _, _ in got):.1f} | "
            f"{statistics.median(c for _, c, _, _ in got):.1f} | {max(m for _, _, m, _ in got):.0f} | "
            f"{statistics.median(ratios):.2f} | "
            f"{min(w for w, _, _, _ in got) / (min(befores) * READS[task]):.2f} | "
            f"{min(w for w, _, _, _ in got) / (min(parse_walls) * READS[task]):.2f} |"
        )


def main(argv=None):
    p = argparse.ArgumentParser(prog="reader_bench.py", description=__doc__.split("\n")[0])
    p.add_argument("folder", nargs="?", help="where the scaled traces are made and kept")
    p.add_argument("--copies", type=int, nargs="+", default=[6, 22], help="scaled traces' copies (default: 6 22)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of every command (default: 3)")
    p.add_argument("--source", default=SOURCE, help="the trace to scale (default: the workers=0 full H200 trace)")
    p.add_argument("--instructions", action="store_true", help="count instructions (valgrind) instead of timing")
    p.add_argument("--parse", nargs=2, metavar=("PARSER", "TRACE"), help="one bare parse (what each round runs)")
    args = p.parse_args(argv)
    if args.parse:
        print(parse(*args.parse))
        return 0
    if not args.folder:
        p.error("a folder for the scaled traces is needed")
    # the package's bytecode, written once: each command then loads it, as an installed steplens does
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(ROOT, "steplens")], check=True)
    if args.instructions:
        if shutil.which(VALGRIND) is None:
            p.error("valgrind is needed to count instructions: apt-get install valgrind")
        os.makedirs(args.folder, exist_ok=True)
        return count_instructions(args.folder, args.source)
    if not os.access(TIME, os.X_OK):
        p.error(f"{TIME} (GNU time) is needed to measure each command's peak memory: apt-get install time")
    if args.rounds < 1 or min(args.copies) < 1:
        p.error("--rounds and --copies must be at least 1")
    os.makedirs(args.folder, exist_ok=True)
    sizes = {c: prepare(args.folder, c, args.source) for c in sorted(args.copies)}
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M')} {platform.node()}: {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}"
    )
    for c, s in sizes.items():
        print(
            f"# x{c}: {s['trace']}, {s['json_bytes'] / 1e6:.0f} MB of JSON, {os.path.getsize(s['trace']) / 1e6:.0f} MB"
        )
    # 1) the bare parsers, SURVEY times each on the smallest trace: the fastest is the reference
    smallest = sizes[min(sizes)]["trace"]
    parsers = {}
    for name in PARSERS:
        try:
            samples = [measure([sys.executable, os.path.abspath(__file__), "--parse", name, smallest])
                       for _ in range(SURVEY)]  # fmt: skip
        except SystemExit as e:
            print(f"# parser {name}: not measured ({e})")
            continue
        wall, cpu, rss = min(samples)
        parsers[name] = wall
        print(f"parser {name:<10} x{min(sizes)}  wall {wall:6.2f} s  cpu {cpu:6.2f} s  peak {rss:5.0f} MB")
    fastest = sorted(parsers, key=parsers.get)[:2]
    print(f"# the fastest bare parses: {' and '.join(fastest)} (before each command, both; the faster counts)")
    rows = rounds(sizes, fastest, args.rounds)
    table(rows, sizes)
    print(f"# ended {time.strftime('%Y-%m-%d %H:%M')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
