"""The Slurm gateway: one program finder, one runner, one drain/resume (slurm/commands.py).

The finder and the runner run real programs (small scripts written here); the
drain reason goes through a real slurmctld and comes back through
``scontrol show node`` exactly as ``node_reason`` made it.
"""

from __future__ import annotations

import os

import pytest

from slurm_tpu.errors import SlurmCommandError
from slurm_tpu.slurm import installation
from slurm_tpu.slurm.commands import MAX_REASON, NO_REASON, Slurm, node_reason
from slurm_tpu.slurm.parse import parse_node_state
from slurm_tpu.slurm.spawn import run


def script(path, body: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


# ---- node_reason: the one place a reason is made safe -------------------------------


def test_a_reason_is_one_line_without_control_characters():
    forged = "slurm-tpu: usb-2-1.3 held by pid 7 (evil\nNodeName=n2 State=IDLE\r\x1b[2J\ttab)  "
    assert node_reason(forged) == "slurm-tpu: usb-2-1.3 held by pid 7 (evil NodeName=n2 State=IDLE [2J tab)"
    # scontrol drops a double quote at either end: dropped here, so Slurm keeps what we asked.
    assert node_reason('"quoted" reason "') == 'quoted" reason'
    assert node_reason("a\u2028b\x7fc") == "a b c"


def test_a_reason_is_cut_never_empty_and_stable():
    long = node_reason("slurm-tpu: " + "; ".join(f"usb-{i}-1 missing" for i in range(100)))
    assert (
        MAX_REASON - 1 <= len(long) <= MAX_REASON
        and long.endswith(";...")
        and long.startswith("slurm-tpu: usb-0-1 missing; ")
    )
    assert node_reason("") == node_reason(' \n\t"" ') == NO_REASON
    for text in (long, "slurm-tpu: x", 'a "b" c', "x" * 1000 + '"'):
        assert node_reason(node_reason(text)) == node_reason(text)


# ---- the program finder ---------------------------------------------------------------


def test_admin_commands_take_slurms_directories_first_then_path(tmp_path):
    prefix = tmp_path / "slurm"
    ours = script(prefix / "sbin" / "slurmd", "exit 0\n")
    script(prefix / "bin" / "scontrol", "exit 0\n")
    path_dir = tmp_path / "path"
    script(path_dir / "slurmd", "exit 0\n")  # an older Slurm earlier on PATH
    tool = script(path_dir / "restart-it", "exit 0\n")
    install = installation.from_prefix(str(prefix))
    environ = {"PATH": f"{path_dir}:relative/dir"}
    assert install.command("slurmd", environ) == ours == install.program("slurmd")
    assert install.command("restart-it", environ) == tool
    assert install.command("sh", {"PATH": ""}) in ("/usr/bin/sh", "/bin/sh")  # the system directories
    assert install.command(tool, {}) == tool  # a path is that file, PATH or not
    with pytest.raises(SlurmCommandError, match=r"restart-it not found in Slurm's directories .*PATH"):
        install.command("restart-it", {"PATH": "/usr/bin"})
    with pytest.raises(SlurmCommandError, match=f"{tmp_path}/nothing is not an executable file"):
        install.command(f"{tmp_path}/nothing", environ)
    # Slurm's own programs never come from PATH.
    with pytest.raises(SlurmCommandError, match="restart-it not found in"):
        install.program("restart-it")


# ---- the runner -----------------------------------------------------------------------


def test_a_failure_carries_stderr_and_its_last_line(tmp_path):
    failing = script(tmp_path / "fails", "echo out; echo first >&2; echo 'the real cause' >&2; exit 3\n")
    with pytest.raises(SlurmCommandError) as caught:
        run([failing, "an argument"])
    assert str(caught.value) == f"{failing} an argument failed: the real cause"
    assert caught.value.stderr == "first\nthe real cause" and caught.value.command == f"{failing} an argument"
    silent = script(tmp_path / "silent", "exit 4\n")
    with pytest.raises(SlurmCommandError, match=r"failed: exit status 4$"):
        run([silent])


def test_a_command_that_hangs_is_killed_at_its_timeout(tmp_path):
    hangs = script(tmp_path / "hangs", "exec sleep 600\n")
    with pytest.raises(SlurmCommandError, match=r"did not finish in 0.5 s"):
        run([hangs], timeout=0.5)


def test_arguments_reach_the_program_untouched_by_any_shell(tmp_path):
    echo = script(tmp_path / "bin" / "args", 'for a in "$@"; do printf "[%s]\\n" "$a"; done\n')
    slurm = Slurm(installation.from_prefix(str(tmp_path)), {"PATH": ""})
    hostile = ["$(touch pwned)", "; rm -rf /", "a b", "*"]
    assert slurm.run_command(["args", *hostile]) == "".join(f"[{a}]\n" for a in hostile)
    assert slurm.run_command([echo, "x"]) == "[x]\n"
    assert not os.path.exists("pwned") and not (tmp_path / "pwned").exists()
    with pytest.raises(SlurmCommandError, match="empty command"):
        slurm.run_command([])


# ---- drain and resume on a real slurmctld ---------------------------------------------


@pytest.mark.slurm
def test_drain_stores_the_clean_reason_and_resume_ends_it(cluster_factory):
    from harness.localcluster import NodeSpec

    cluster = cluster_factory([NodeSpec("n1"), NodeSpec("n2")])
    slurm = Slurm(environ=cluster.env())
    forged = 'slurm-tpu: pid 9 ("x\nNodeName=n2 State=DRAIN Reason=forged) holds usb-2-1.3 "'
    slurm.drain("n1", forged)
    n1 = parse_node_state(cluster.show_node("n1"))
    assert "DRAIN" in n1["state"] and n1["reason"] == node_reason(forged)
    # The one-line listing stays one line per node: the forged text made no record for n2.
    assert "DRAIN" not in parse_node_state(cluster.show_node("n2"))["state"]
    assert slurm.node_state("n1")["reason"] == node_reason(forged)
    slurm.resume("n1")
    assert "DRAIN" not in slurm.node_state("n1")["state"]
    with pytest.raises(SlurmCommandError, match=r"scontrol update NodeName=nx .*failed: "):
        slurm.drain("nx", "slurm-tpu: no such node")
