"""`mapstream serve` as a process: it prints where it listens, serves a client, and SIGTERM
shuts it down gracefully (the client told, the process ending by itself with status 0)."""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

from mapstream.client import Client

from serve_helpers import frames, results


def test_the_command_serves_until_sigterm_then_stops_cleanly():
    process = subprocess.Popen(
        [sys.executable, "-m", "mapstream", "serve", "--model", "tiny", "--device", "cpu", "--no-auth", "--port", "0",
         "--host", "127.0.0.1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        line = process.stdout.readline()  # the first line says where it listens
        match = re.search(r"on (ws://127\.0\.0\.1:\d+)", line)
        assert match, line + process.stderr.read() if process.poll() is not None else line
        session = Client(match.group(1)).open_session(settings={"num_scale_frames": 1})
        assert session.info["model"] == "tiny (synthetic weights)" and session.info["warnings"]
        for image in frames(30, 3):
            session.send(image)
        got = []
        deadline = time.monotonic() + 60
        while len(got) < 3 and time.monotonic() < deadline:
            got += results([session.receive(60)])
        assert [r.index for r in got] == [0, 1, 2]
        process.send_signal(signal.SIGTERM)
        last = session.receive(60)
        assert last.type == "error" and last.data["code"] == "shutting_down" and last.fatal
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        assert out.strip().endswith("stopped") and "SIGTERM: shutting down" in err
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=10)
