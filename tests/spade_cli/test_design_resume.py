"""`spade design -o DIR` after a stop: the designs answered before it are kept, the rest asked for.

The server is a small OpenAI-compatible stand-in in this process: it answers a design request
with a seed env (plus a line naming the prompt, so each slot's design is its own) and, while
`failing` is set, answers HTTP 500 once it has answered `answers` requests, as a vLLM server that
died halfway through a batch would leave a run.
"""

import hashlib
import http.server
import json
import threading

import orjson
import pytest
from typer.testing import CliRunner

from spade_cli.app import app
from stages import seed_library

SEED_SOURCE = seed_library.files("game")[0].read_text()


class Server:
    def __init__(self, answers: int | None):
        self.answers, self.asked, self.lock = answers, [], threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = body["messages"][0]["content"]
                with server.lock:
                    refused = server.answers is not None and len(server.asked) >= server.answers
                    if not refused:
                        server.asked.append(prompt)
                if refused:
                    self.send_response(500)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                tag = hashlib.sha256(prompt.encode()).hexdigest()[:12]
                text = f"```python\n{SEED_SOURCE}\n# {tag}\n```"
                reply = json.dumps({"choices": [{"message": {"content": text},
                                                 "finish_reason": "stop"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/v1"

    def close(self):
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def serve():
    servers = []

    def start(answers=None):
        servers.append(Server(answers))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def design(server, out):
    return CliRunner().invoke(app, ["design", "--backend", "openai", "--base-url", server.url,
                                    "-m", "stand-in", "-b", "6", "--seed", "3", "-o", str(out)])


def designs(out):
    return [orjson.loads(line) for line in (out / "design-00000.jsonl").read_bytes().splitlines()]


def test_a_rerun_after_the_server_died_asks_only_for_the_missing_designs(serve, tmp_path):
    out = tmp_path / "design-a0"
    dying = serve(answers=4)
    first = design(dying, out)
    assert first.exit_code == 69, first.output  # the backend became unavailable
    assert not (out / "design-00000.jsonl").exists()
    journal = list(out.glob("_journal-*.jsonl"))
    assert len(journal) == 1 and len(journal[0].read_bytes().splitlines()) == 4

    revived = serve()
    second = design(revived, out)
    assert second.exit_code == 0, second.output
    assert len(revived.asked) == 2 and not set(revived.asked) & set(dying.asked)
    assert "(4 made before a stop, kept)" in second.output
    assert not list(out.glob("_journal-*"))
    resumed = designs(out)
    assert [d["slot"] for d in resumed] == list(range(6))

    clean = serve()
    assert design(clean, tmp_path / "clean").exit_code == 0
    content = lambda records: [(d["slot"], d["prompt"], d["completion"]) for d in records]
    assert content(resumed) == content(designs(tmp_path / "clean"))
    # `policy` names the server that answered each one (its URL, where no --policy is given)
    assert {d["policy"].split("#")[0] for d in resumed} == {dying.url, revived.url}


def test_a_changed_config_starts_over_without_the_old_journal(serve, tmp_path):
    out = tmp_path / "design-a0"
    assert design(serve(answers=3), out).exit_code == 69
    other = serve()
    result = CliRunner().invoke(app, ["design", "--backend", "openai", "--base-url", other.url,
                                      "-m", "stand-in", "-b", "6", "--seed", "4", "-o",
                                      str(out)])
    assert result.exit_code == 0, result.output
    assert len(other.asked) == 6 and "made before a stop" not in result.output
    assert not list(out.glob("_journal-*"))
