"""The console command stops in one line: Ctrl-C in any subcommand, and roofline's --model without torch."""

import sys
import types

import pytest

from steplens import cli
from steplens.evidence import roofline


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_ctrl_c_in_any_subcommand_is_one_line_and_exit_130(name, monkeypatch, capsys):
    def interrupted(argv):
        raise KeyboardInterrupt

    module = types.ModuleType(cli.COMMANDS[name][0])
    module.main = interrupted
    monkeypatch.setitem(sys.modules, cli.COMMANDS[name][0], module)
    assert cli.main([name, "x"]) == 130
    out, err = capsys.readouterr()
    assert out == "" and err == f"steplens {name}: interrupted\n"


def test_roofline_model_without_torch_says_what_to_install(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    with pytest.raises(ValueError, match="pip install torch"):
        roofline.load_builder("train:build_model")
    trace = tmp_path / "t.pt.trace.json"
    trace.write_text('{"traceEvents": []}')
    code = roofline.main([str(trace), "--model", "train:build_model"])
    out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "--model needs torch" in err and "pip install torch" in err, err


@pytest.mark.parametrize("argv", [[], ["--help"]])
def test_ctrl_c_before_a_subcommand_runs_is_one_line_and_exit_130(argv, monkeypatch, capsys):
    """Everything main does is inside its handler: here, writing the usage."""

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "usage", interrupted)
    assert cli.main(argv) == 130
    out, err = capsys.readouterr()
    assert out == "" and err == "steplens: interrupted\n"
