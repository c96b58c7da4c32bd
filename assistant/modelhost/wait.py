"""``python -m assistant.modelhost.wait``: wait until the model process has loaded the model
or has said why it cannot; exit 0 when it answers, 1 otherwise, printing its status."""

import argparse
import sys
import time

from assistant.engines.base import EngineUnavailable
from assistant.engines.model_process import ModelProcessEngine

from . import protocol


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m assistant.modelhost.wait")
    parser.add_argument("--socket", default=None, help="default: CHATSITE_MODEL_SOCKET")
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args()
    engine = ModelProcessEngine("wait", {"SOCKET": args.socket or protocol.default_socket_path()})
    deadline = time.monotonic() + args.timeout
    status = None
    while time.monotonic() < deadline:
        try:
            status = engine.status_fetch()
        except EngineUnavailable:
            status = None  # not bound yet
        if status is not None and status.state != "starting":
            break
        time.sleep(0.1)
    if status is not None and status.state == "up":
        print(f"model process: up (pid {status.pid}, {status.engine})")
        return
    reason = f"{status.code}: {status.message}" if status else "no model process answers"
    print(f"model process: not answering ({reason})", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
    main()
