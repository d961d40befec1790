"""A parent that imports the app once and forks real RQ workers and web servers on request.

Importing the app (the anthropic SDK above all) costs several seconds of CPU per process; a drill that
kills and replaces workers dozens of times would spend its whole budget on imports, and every browser
test starts a server of its own. This process pays for them once; each worker is a fork of it running
`run_worker(create_app())`, exactly what `flask --app webapp worker` runs, and each web server a fork
serving `create_app()` with one thread per request, as `flask --app webapp run --with-threads` does;
each in its own session (so the test can SIGKILL its process group).

Protocol on stdin/stdout, one JSON object a line: the test writes {"log": path, "env": {...}} (with
"port": n for a web server) and reads back {"pid": n}. EOF on stdin ends the parent; its children are
the test's to stop.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import signal
import sys
import traceback


def main() -> None:
    import anthropic  # noqa: F401 - the expensive imports, paid once here
    import rq  # noqa: F401

    import jobs.moves  # noqa: F401
    import webapp.runtime.worker  # noqa: F401
    from webapp import create_app  # noqa: F401

    _import_all("webapp")  # what create_app imports as it builds the app (its blueprints, the CLI, ...)

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps dead workers: no zombies
    print(json.dumps({"ready": True}), flush=True)
    while line := sys.stdin.readline():
        order = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(order["log"], order["env"], order.get("port"))  # never returns
        print(json.dumps({"pid": pid}), flush=True)


def _import_all(package_name: str) -> None:
    package = importlib.import_module(package_name)
    for module in pkgutil.walk_packages(package.__path__, f"{package_name}."):
        if not module.name.startswith(f"{package_name}.migrations"):
            importlib.import_module(module.name)


def _child(log_path: str, env: dict[str, str], port: int | None) -> None:
    code = 1
    try:
        os.setsid()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        os.environ.update(env)
        from webapp import create_app

        if port is None:
            from webapp.runtime.worker import run_worker

            run_worker(create_app(), name=f"test-worker-{os.getpid()}")
        else:
            from werkzeug.serving import run_simple

            run_simple("127.0.0.1", port, create_app(), threaded=True)  # what `flask run --with-threads` calls
        code = 0
    except BaseException:  # the log must say why a worker or server ended
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    main()
