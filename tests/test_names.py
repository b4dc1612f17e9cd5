"""Any string in a name is safe to print: summarize never raises on it and never writes a character that is not
printable (control characters, lone surrogates, bidirectional overrides), and its --json stays valid JSON."""

import contextlib
import io
import json
import os
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from steplens.evidence import summarize
from steplens.text import safe_text

NASTY = ["\udc80", "\ud800", "\x00", "\x07", "\x1b", "\x7f", "\x85", "\u202e", "\u2028", "\n", "\t", "\\"]
TEXT = st.text(st.one_of(st.characters(), st.sampled_from(NASTY)), max_size=20)


def trace(kernel="void gemm()", step="", scope="train/forward_backward"):
    """Three steps, each a scope around a launch and its kernel: a small GPU trace whose names are given."""
    cpu, events = {"pid": 1, "tid": 1}, []
    for n in range(3):
        t = 100.0 * n
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}{step}", "ts": t, "dur": 90, **cpu},
            {"ph": "X", "cat": "user_annotation", "name": scope, "ts": t + 5, "dur": 60, **cpu},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t + 10, "dur": 2, **cpu}
            | {"args": {"correlation": n + 1}},
            {"ph": "X", "cat": "kernel", "name": kernel, "ts": t + 20, "dur": 30, "pid": 0, "tid": 7}
            | {"args": {"correlation": n + 1, "stream": 7}},
        ]
    return {"traceEvents": events}


def run(doc, *flags):
    fd, path = tempfile.mkstemp(suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)  # ensure_ascii: a lone surrogate is written as its \\u escape, as a JSON writer may
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = summarize.main([path, *flags])
    finally:
        os.unlink(path)
    return code, out.getvalue(), err.getvalue()


def printable(text):
    return all(ch.isprintable() or ch == "\n" for ch in text)


@settings(max_examples=30, deadline=None)
@given(kernel=TEXT, step=TEXT, scope=TEXT)
def test_any_name_prints_as_printable_text_and_valid_json(kernel, step, scope):
    doc = trace("gemm" + kernel, step, scope or "x")
    code, out, err = run(doc)
    assert code in (0, 1) and "Traceback" not in err
    assert printable(out) and printable(err), (out, err)
    assert (out + err).encode("utf-8")
    code, out, _ = run(doc, "--json")
    if code == 0:
        assert json.loads(out)["trace"]


def test_a_kernel_name_that_clears_the_screen_is_printed_escaped():
    code, out, _ = run(trace(kernel="\x07\x1b[2Jgemm\udc80"), "--full")
    assert code == 0 and "\\x07\\x1b[2Jgemm\\udc80" in out and "\x1b" not in out
    assert "damaged: 3 complete events whose name holds a control character" in out


def test_steps_whose_names_hold_a_nul_are_named_in_one_line():
    code, _, err = run(trace(step="\x00"))  # every step's name is damaged: no step is left, one line says why
    assert code == 1 and err.count("\n") == 1 and "3 ProfilerStep slices whose name is not ProfilerStep#N" in err


def test_safe_text_escapes_what_is_not_printable_and_keeps_the_rest():
    assert safe_text("gemm<128>") == "gemm<128>"
    assert safe_text("a\x00b\x9b\u202ec\U000e0001") == "a\\x00b\\x9b\\u202ec\\U000e0001"
    assert safe_text("\ud800") == "\\ud800" and safe_text("é ü") == "é ü"


def test_text_that_is_not_ascii_is_no_damage_and_a_bell_outside_the_scopes_withholds_nothing():
    """A no-break space, an ideographic space or a joiner in a user's own annotation is text, not damage; a control
    character in an annotation the figures never read is named, and the verdict stays."""
    for name in ("my\u00a0scope", "\u30c7\u30fc\u30bf\u3000\u8aad\u307f\u8fbc\u307f", "a\u200db"):
        code, out, _ = run(trace(scope=name), "--json")
        ev = json.loads(out)
        assert code == 0 and ev["damage"] == [] and ev["verdict"]["stage"] is not None, name
    code, out, _ = run(trace(scope="odd\x07name"), "--json")
    ev = json.loads(out)
    assert [d["kind"] for d in ev["damage"]] == ["unprintable_name"] and ev["damage_withheld"] is None
