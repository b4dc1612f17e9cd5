"""The console command: steplens SUBCOMMAND ... (each subcommand's --help says the rest).

steplens summarize TRACE [TRACE ...]     the evidence and the verdict of a trace
steplens picture TRACE [--out X.png]     one profiled cycle drawn to scale
steplens roofline TRACE [--model M:F]    each kernel class against the GPU's compute or memory limit
steplens snapshot FILE [--json]          a CUDA memory snapshot's peak and what is live at it
steplens diff BEFORE AFTER               what a change did to the step: delays, kernels, operators, host
steplens decide BEFORE AFTER --offline ROOT|-p P --before G --after G   the tutorial's decision on a change
steplens compare --offline ROOT | -p P   paired comparison of repeated bench runs
steplens ranks DIR                       the evidence across the ranks of a DDP run
steplens report ROOT [UUID ...]          what a set of runs measured, in a few lines
steplens viewer [--path ROOT]            Polyaxon's own UI over offline runs, on 127.0.0.1
"""

import importlib
import signal
import sys

# subcommand: (module, one line). Each module's main(argv) parses its own flags, so `python -m` and the
# command share them; modules are imported only when their subcommand runs (compare needs no matplotlib
# until it draws, summarize no torch ever).
COMMANDS = {
    "summarize": ("steplens.evidence.summarize", "the evidence and the verdict of PyTorch profiler traces"),
    "picture": ("steplens.evidence.picture", "draw one profiled cycle to scale (needs matplotlib)"),
    "roofline": ("steplens.evidence.roofline", "each kernel class's work and rate against the GPU's peaks"),
    "snapshot": ("steplens.evidence.snapshot", "a CUDA memory snapshot's peak, its blocks by allocating line"),
    "diff": ("steplens.project.diff", "what a change did to the step, from two traces or profile runs"),
    "decide": (
        "steplens.project.decide",
        "which of the tutorial's three outcomes a change had (traces and bench runs)",
    ),
    "compare": ("steplens.project.compare", "paired comparison of repeated bench runs"),
    "ranks": ("steplens.project.ranks", "the evidence across the ranks of a DDP run"),
    "report": ("steplens.project.report", "what a set of offline runs measured"),
    "viewer": ("steplens.viewer", "Polyaxon's UI over offline runs, on 127.0.0.1 (needs haupt)"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {about}" for name, (_, about) in COMMANDS.items()]
    return "usage: steplens SUBCOMMAND [ARGS ...]\n\nsubcommands:\n" + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    name = argv[0] if argv and argv[0] in COMMANDS else None
    try:  # from the first line: Ctrl-C at any moment of the command is one line and the shell's code for SIGINT
        return run(argv)
    except KeyboardInterrupt:
        print(f"steplens{' ' + name if name else ''}: interrupted", file=sys.stderr)
        return 130


def run(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        from steplens import __version__

        print(f"steplens {__version__}")
        return 0
    if argv[0] not in COMMANDS:
        print(f"steplens: error: unknown subcommand {argv[0]!r} (one of: {', '.join(COMMANDS)})", file=sys.stderr)
        return 2
    if hasattr(signal, "SIGPIPE"):  # `steplens summarize --json T | head` ends quietly, as other commands do
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return module.main(argv[1:])
