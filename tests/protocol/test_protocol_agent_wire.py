"""The node agent's wire formats (slurm_tpu.protocol.agent_wire): requests, answers, job queries."""

from __future__ import annotations

import os
import re

import pytest

from slurm_tpu.protocol import FormatError, agent_wire

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_request_round_trips_bytes_as_given():
    environ = {"SLURM_JOB_ID": "12", "ODD": "a=b\tc", "EMPTY": ""}
    data = agent_wire.encode_request("prolog", environ)
    assert data[4:] == b"STPU1\0prolog\0SLURM_JOB_ID=12\0ODD=a=b\tc\0EMPTY=\0"
    assert agent_wire.request_length(data[:4]) == len(data) - 4
    assert agent_wire.parse_request(data[4:]) == ("prolog", environ)
    assert agent_wire.parse_request(b"STPU1\0udev\0") == ("udev", {})


@pytest.mark.parametrize(
    "body, words",
    [
        (b"STPU2\0epilog\0", "not a slurm-tpu hook request"),
        (b"STPU1\0epilog", "not a slurm-tpu hook request"),  # no terminating NUL
        (b"STPU1\0shell\0", "unknown hook 'shell'"),
    ],
)
def test_what_is_no_request_is_refused(body, words):
    with pytest.raises(FormatError, match=words):
        agent_wire.parse_request(body)


@pytest.mark.parametrize("length", [0, agent_wire.MAX_REQUEST + 1])
def test_a_request_length_out_of_bounds_is_refused(length):
    with pytest.raises(FormatError, match=rf"request of {length} bytes \(at most {agent_wire.MAX_REQUEST}\)"):
        agent_wire.request_length(agent_wire.LENGTH.pack(length))


def test_the_answer_is_bounded_and_ends_with_the_status():
    assert agent_wire.encode_answer(7, b"one line\n") == agent_wire.LENGTH.pack(9) + b"one line\n\x07"
    big = agent_wire.encode_answer(256 + 1, b"x" * (agent_wire.MAX_OUTPUT + 5))
    assert len(big) == 4 + agent_wire.MAX_OUTPUT + 1 and big[-1] == 1


def test_the_c_client_speaks_the_same_format():
    with open(os.path.join(REPO, "hook_client", "slurm-tpu-hook-client.c"), encoding="utf-8") as handle:
        source = handle.read()
    defines = dict(re.findall(r"^#define (\w+) (.+?)(?:\s*/\*.*)?$", source, re.M))
    assert defines["MAGIC"] == f'"{agent_wire.MAGIC.decode()}"'
    assert eval(defines["MAX_OUTPUT"]) == agent_wire.MAX_OUTPUT
    assert 0 < eval(defines["MAX_REQUEST"]) <= agent_wire.MAX_REQUEST
    assert f'"/proc/self/fd/%d/{agent_wire.SOCKET}"' in source


@pytest.mark.parametrize(
    "selector, valid",
    [
        ("123", True),
        ("123_4", True),
        ("123+1", True),
        ("", False),
        ("12_", False),
        ("1_2_3", False),
        ("12;id", False),
        ("1" * 25, False),
        ("abc", False),
    ],
)
def test_job_selectors(selector, valid):
    assert agent_wire.valid_selector(selector) is valid


def test_a_job_querys_answer_round_trips():
    data = agent_wire.encode_query_answer("/usr/bin/scontrol", "/etc/slurm/slurm.conf", "JobId=12 x\n  y\n")
    assert agent_wire.parse_query_answer(data) == ("/usr/bin/scontrol", "/etc/slurm/slurm.conf", "JobId=12 x\n  y\n")
    assert agent_wire.parse_query_answer(b"") == ("", "", "")
