"""Every path flag of the commands reads a leading ``~`` as the home directory, also where the shell
leaves it (quoted, or ``--out=~/o``): ``--out`` wrote ``./~/o/report.json`` while ``--data-root``
expanded it. One run end to end, the other flags through the parsers."""
import json

import pytest

from entangle_ext import cli
from entangle_ext.cli import compare as cli_compare

pytestmark = pytest.mark.usefixtures("one_thread")

RUN_FLAGS = ["--data-root", "--weights", "--model-path", "--out", "--original", "--resume"]
COMPARE_FLAGS = ["--out", "--data-root", "--weights", "--model-path"]


@pytest.mark.parametrize("flag", RUN_FLAGS)
def test_run_path_flags_expand_the_home_directory(home, flag):
    argv = ["--setting", "digits", *([] if flag == "--out" else ["--out", "o"]), f"{flag}=~/p"]
    args = cli.build_parser().parse_args(argv)
    assert getattr(args, flag[2:].replace("-", "_")) == str(home / "p")


@pytest.mark.parametrize("flag", COMPARE_FLAGS)
def test_compare_path_flags_expand_the_home_directory(home, flag):
    args = cli_compare.build_parser().parse_args(["--setting", "digits", flag, "~/p"])
    assert getattr(args, flag[2:].replace("-", "_")) == str(home / "p")


def test_a_run_with_out_under_home_writes_there(home, capsys):
    pytest.importorskip("sklearn")
    rc = cli.main(["--setting", "digits", "--variant", "reduced", "--out=~/o", "--max-train-per-class", "5",
                   "--original-epochs", "1", "--epochs", "1", "--stage1-epochs", "1", "--no-progress"])
    assert rc == 0
    assert json.loads((home / "o" / "report.json").read_text())["method"]
    assert f"report: {home / 'o' / 'report.json'}" in capsys.readouterr().out
