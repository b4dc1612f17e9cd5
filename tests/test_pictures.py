"""The pictures' layout and colours, measured on the drawn figure (matplotlib, Agg): no text crosses an axis line or
another text, no point or label falls outside the figure, and each legend entry has a colour of its own."""

import itertools
import os

import pytest
from conftest import ROOT

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from steplens.evidence import picture, summarize  # noqa: E402
from steplens.project import compare, comparison  # noqa: E402
from steplens.project.runs import gather_offline  # noqa: E402
from steplens.scopes import FORWARD_BACKWARD, NEXT_BATCH, OPTIMIZER, SAVE, TO_DEVICE  # noqa: E402

BEST_SET = os.path.join(ROOT, "results", "h200-pictures", "best-set", "trace-cycle1-steps2-4.pt.trace.json.gz")
TUNING = os.path.join(ROOT, "results", "h200-inductor-tuning", "offline")
PX = 0.5  # pixels two boxes may share at an edge (rounding), not an overlap


def overlap(a, b):
    """True when two window boxes share more than an edge."""
    return min(a.x1, b.x1) - max(a.x0, b.x0) > PX and min(a.y1, b.y1) - max(a.y0, b.y0) > PX


def texts(fig):
    """(what, window box) of every text drawn: titles, axis labels, the tick labels in view, notes, legends."""
    renderer = fig.canvas.get_renderer()
    out = []
    for ax in fig.axes:
        (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
        shown = [t for t in ax.get_xticklabels() if x0 <= t.get_position()[0] <= x1]
        shown += [t for t in ax.get_yticklabels() if y0 <= t.get_position()[1] <= y1]
        ticks = set(map(id, ax.get_xticklabels() + ax.get_yticklabels()))
        others = [t for t in ax.findobj(matplotlib.text.Text) if id(t) not in ticks]
        legend = ax.get_legend()
        others += legend.get_texts() if legend else []
        out += [t for t in shown + others if t.get_visible() and t.get_text().strip()]
    for legend in fig.legends:
        out += legend.get_texts()
    unique = list({id(t): t for t in out}.values())
    return [(t.get_text()[:40], t.get_window_extent(renderer)) for t in unique]


def assert_clear(fig):
    """No text crosses another, an axis line of its axes, or the figure's edge."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    found = texts(fig)
    assert found, "no text found to check"
    edge = fig.bbox
    for what, box in found:
        assert edge.x0 <= box.x0 and box.x1 <= edge.x1 and edge.y0 <= box.y0 and box.y1 <= edge.y1, (
            f"{what!r} falls outside the figure"
        )
    for (a, ba), (b, bb) in itertools.combinations(found, 2):
        assert not overlap(ba, bb), f"{a!r} overlaps {b!r}"
    for ax in fig.axes:
        lines = [ax.spines[s].get_window_extent(renderer) for s in ("bottom", "left") if ax.spines[s].get_visible()]
        for (what, box), line in itertools.product(found, lines):
            assert not overlap(box, line), f"{what!r} crosses an axis line"


def made_row(step, cpu_ms=10.0, gpu=True, memory=False):
    """One step's lanes as picture.lanes_of gives them."""
    return {
        "step": step,
        "cpu_ms": cpu_ms,
        "gpu_ms": cpu_ms if gpu else None,
        "cpu": [(NEXT_BATCH, 0.0, 4.0), (TO_DEVICE, 4.0, 1.0), (FORWARD_BACKWARD, 5.0, 4.0), (OPTIMIZER, 9.0, 1.0)],
        "gpu": [("input gap", 0.0, 5.0), ("busy", 5.0, 4.0), ("waiting for the host", 9.0, 1.0)] if gpu else [],
        "memory": [(0.0, 100e6), (5.0, 300e6), (10.0, 120e6)] if memory else None,
    }


VERDICT = "The GPU idles for 50% of the step, and waiting for input is its largest wait: " + "words " * 30


@pytest.mark.parametrize(
    "groups, has_gpu",
    [
        ([("", [made_row(2), made_row(3), made_row(4, gpu=False)])], True),  # the last step has no GPU slot
        ([("", [made_row(2, memory=True), made_row(3, gpu=False)])], True),  # memory lanes, and a gap in the last
        ([("", [made_row(2, gpu=False)])], False),  # one step of a CPU-only trace
        ([("rank 0 ", [made_row(2), made_row(3)]), ("rank 1 ", [made_row(2), made_row(3, gpu=False)])], True),
    ],
    ids=["no-slot-last", "memory", "cpu-one-step", "ranks"],
)
def test_the_step_picture_s_labels_clear_the_axes_and_each_other(groups, has_gpu):
    """Each step picture's lane labels and notes stay off the x axis's line and off each other, whatever its steps."""
    fig = picture.figure(groups, "workers=0, batch 128: cycle 1, ProfilerStep#2-4", VERDICT, has_gpu, False)
    try:
        assert_clear(fig)
    finally:
        plt.close(fig)


def test_a_stored_graph_trace_s_last_step_note_stays_above_the_axis():
    """The stored H200 best-set trace (CUDA graphs): its last step has no complete GPU slot, and that note and its
    label were drawn across the x axis; now every text keeps clear."""
    ev = summarize.summarize_file(BEST_SET, lanes=True)
    rows = picture.lanes_of(ev)
    assert rows[-1]["gpu_ms"] is None, "the stored trace's last step should have no complete GPU slot"
    fig = picture.figure([("", rows)], "best set", ev["verdict"]["sentence"], True, True, "no memory events")
    try:
        assert_clear(fig)
        ax = fig.axes[0]
        renderer = fig.canvas.get_renderer()
        axis_y = ax.spines["bottom"].get_window_extent(renderer).y1
        note = next(t for t in ax.texts if "no complete GPU slot" in t.get_text())
        assert note.get_window_extent(renderer).y0 > axis_y, "the note lies above the x axis"
    finally:
        plt.close(fig)


def legend_colours(rows, memory=True):
    """{label: colour} of the step picture's legend for these rows (the GPU's kinds included)."""
    from matplotlib.patches import Patch

    handles = picture.legend(rows, True, memory, Patch)
    return {h.get_label(): to_hex(h.get_facecolor()) for h in handles}


def test_the_input_gap_and_input_next_batch_have_different_colours():
    """The GPU's input gap and the CPU's input/next_batch scope are told apart in the legend."""
    colours = legend_colours([made_row(2)])
    assert colours[NEXT_BATCH] != colours["GPU input gap"], colours


def test_every_legend_entry_has_a_colour_of_its_own():
    """Every entry of the fullest legend (the four scopes, a save, an input source that is not a scope, the GPU's
    four kinds, the memory line) has its own colour; none is white, the lanes' background."""
    row = made_row(2)
    row["cpu"] = row["cpu"] + [(SAVE, 9.5, 0.5), ("input", 0.0, 3.0)]
    colours = legend_colours([row])
    assert len(colours) == 11, sorted(colours)
    assert len(set(colours.values())) == len(colours), colours
    assert "#ffffff" not in colours.values()


def tuning_result():
    records, _ = gather_offline(TUNING)
    return comparison.compare_records(records, baseline="inductor_tuning=off", per_host=True)


def test_the_comparison_picture_with_several_machines_keeps_every_point_and_label_inside():
    """steplens compare --per-host on the stored inductor-tuning runs (two starts of an NVIDIA H200 machine): every
    run's point lies inside its panel, the fastest included, and no title, axis label or legend crosses another."""
    result = tuning_result()
    assert len(result["tables"]) == 2, "the stored runs come from two machines"
    fig = compare.figure(result)
    try:
        assert_clear(fig)
        renderer = fig.canvas.get_renderer()
        for ax, table in zip(fig.axes, result["tables"]):
            box = ax.get_window_extent(renderer)
            for points in ax.collections:
                size = (points.get_sizes()[0] ** 0.5) * fig.dpi / 72 / 2  # the marker's radius, in pixels
                for x, y in ax.transData.transform(points.get_offsets()):
                    assert box.x0 + size <= x <= box.x1 - size and box.y0 + size <= y <= box.y1 - size, (
                        f"a point of {table['machine_label'][:30]} is cut at the panel's edge"
                    )
            drawn = sum(len(p.get_offsets()) for p in ax.collections)
            assert drawn == len(table["bench_runs"]), "every bench run is drawn once"
    finally:
        plt.close(fig)
