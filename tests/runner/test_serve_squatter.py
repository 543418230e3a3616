"""`infer --server` against listeners that are not the job's server (a squatter on the port of
a server that died without cleaning up): the token never reaches them, and every odd
answer, before or after the proof, is one line and exit status 2, never a traceback.

The listeners are in-process recorders on 127.0.0.1 (``serve_support.Listener``); the
client is the real CLI in its own process. The same attack by real users on the real
cluster is in tests/isolation/test_serve_cluster.py.
"""

from __future__ import annotations

import json

import pytest
from runner_support import run_cli
from serve_support import Client, Listener, http_answer, raw_exchange, start_server

from slurm_tpu.runner.serve import auth
from slurm_tpu.runner.serve.client import ServeClient, ServerError

TOKEN = auth.new_token()


def _proof_of(head: bytes) -> bytes:
    """What the genuine server answers to a proof challenge in ``head``."""
    nonce = head.split(b"nonce=", 1)[1].split(b" ", 1)[0].decode()
    return http_answer(json.dumps({"proof": auth.proof(TOKEN, nonce)}).encode())


SQUATTERS = {
    # The issue's: 200 and '{}' to anything (the old client then died on KeyError 'metadata').
    "answers {} to everything": lambda n, head: http_answer(b"{}"),
    "a proof that is not the HMAC": lambda n, head: http_answer(json.dumps({"proof": "0" * 64}).encode()),
    "echoes the nonce": lambda n, head: http_answer(
        json.dumps({"proof": head.split(b"nonce=", 1)[1].split(b" ", 1)[0].decode()}).encode()
    ),
    "an old server's 401": lambda n, head: http_answer(b'{"error": "missing or wrong token"}', "401 Unauthorized"),
    "not HTTP": lambda n, head: b"SSH-2.0-OpenSSH_9.2\r\n",
    "closes at once": lambda n, head: b"",
    "JSON that is a list": lambda n, head: http_answer(b"[1, 2]"),
    "a huge answer": lambda n, head: http_answer(b'{"proof": "' + b"a" * (1 << 20) + b'"}'),
}


@pytest.fixture
def client_home(tmp_path, clean_env):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    return dict(clean_env, HOME=str(home), **{auth.TOKEN_ENV: TOKEN})


def _one_line_error(done) -> str:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slurm-tpu: error:") and "Traceback" not in done.stderr, done.stderr
    return lines[0]


@pytest.mark.parametrize("behaviour", list(SQUATTERS))
def test_the_token_never_reaches_a_listener_that_cannot_prove_it_holds_it(behaviour, client_home, models, tmp_path):
    squatter = Listener(SQUATTERS[behaviour])
    try:
        # By job id (the address file the dead server left) and by HOST:PORT with the token in the environment.
        auth.write_address(auth.Address("77", f"http://127.0.0.1:{squatter.port}", TOKEN), client_home)
        for target in ("77", f"127.0.0.1:{squatter.port}"):
            done = run_cli(["infer", "--server", target, "classifier", models["images"] / "img_00002.png"], client_home)
            line = _one_line_error(done)
            assert f"127.0.0.1:{squatter.port}" in line and "token was not sent" in line, line
        assert squatter.received, "the client never tried the listener"
        assert TOKEN.encode() not in squatter.everything
        assert b"Authorization" not in squatter.everything
    finally:
        squatter.close()


def test_a_reconnect_after_the_server_died_is_proven_again(tmp_path):
    """Connection 0 is the genuine server (it proves, answers once and closes); connection 1 is a
    squatter that took over. The second request must not carry the token to it."""

    def answer(number: int, head: bytes) -> bytes:
        if number == 0 and b"/v1/slurm-tpu/proof" in head:
            return _proof_of(head)
        if number == 0:
            return http_answer(b'{"model_version_status": []}', extra="Connection: close\r\n")
        return http_answer(b"{}")

    listener = Listener(answer)
    client = ServeClient(auth.Address("1", f"http://127.0.0.1:{listener.port}", TOKEN))
    try:
        assert client.json("GET", "/v1/models/c") == {"model_version_status": []}
        with pytest.raises(ServerError, match="did not prove"):
            client.json("GET", "/v1/models/c")
        assert len(listener.received) == 2
        assert f"Bearer {TOKEN}".encode() in listener.received[0]
        assert TOKEN.encode() not in listener.received[1]
    finally:
        client.close()
        listener.close()


@pytest.mark.parametrize(
    "metadata, task",
    [
        (b"{}", None),
        (b'{"metadata": {"signature_def": {"signature_def": {"serving_default": {"outputs": {"o": {}}}}}}}', None),
        (b'{"metadata": []}', None),
        (None, b"[1, 2]"),
        (None, b'{"classes": [], "lines": 3}'),
    ],
)
def test_unexpected_answers_of_a_proven_listener_are_one_line(metadata, task, client_home, models, served_metadata):
    """A listener that does hold the token (a server of another version, a bug) but answers
    what the client does not expect: one line, exit 2."""

    def answer(number: int, head: bytes) -> bytes:
        if b"/v1/slurm-tpu/proof" in head:
            return _proof_of(head)
        if b"/metadata" in head:
            return http_answer(metadata if metadata is not None else served_metadata)
        return http_answer(task)

    listener = Listener(answer)
    try:
        done = run_cli(
            ["infer", "--server", f"127.0.0.1:{listener.port}", "classifier", models["images"] / "img_00002.png"],
            client_home,
        )
        assert "the server at" in _one_line_error(done)
    finally:
        listener.close()


@pytest.fixture(scope="module")
def served_metadata(models) -> bytes:
    """The genuine server's metadata answer for the classifier."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CUDA_VISIBLE_DEVICES"))}
    server = start_server([(str(models["classifier"]), "classifier")], {}, env)
    try:
        status, _, body = Client(server).request("GET", "/v1/models/classifier/metadata")
        assert status == 200
        return body
    finally:
        server.stop(5)


def test_the_server_answers_the_challenge_with_the_hmac_and_nothing_else(models, clean_env):
    server = start_server([(str(models["classifier"]), "c")], {}, clean_env)
    try:
        nonce = auth.new_nonce()
        anonymous = Client(server, token=None)
        status, answer = anonymous.json("GET", f"{auth.PROOF_PATH}?nonce={nonce}")
        assert status == 200 and auth.proof_matches(server.token, nonce, answer["proof"])
        assert server.token not in json.dumps(answer)
        # One proof per connection before the token: a second one closes it.
        status, answer = anonymous.json("GET", f"{auth.PROOF_PATH}?nonce={auth.new_nonce()}")
        assert status == 401
        for bad in ("", "nonce=xyz", "nonce=" + "ab" * 8, "nonce=" + "AB" * 32):
            answer_bytes = raw_exchange(
                server.port, f"GET {auth.PROOF_PATH}?{bad} HTTP/1.1\r\nConnection: close\r\n\r\n".encode()
            )
            assert answer_bytes.startswith(b"HTTP/1.1 400"), answer_bytes
        # The proven connection then carries the token as any client's does.
        proven = Client(server)
        assert proven.json("GET", f"{auth.PROOF_PATH}?nonce={auth.new_nonce()}")[0] == 200
        assert proven.json("GET", "/v1/models/c")[0] == 200
    finally:
        server.stop(5)
