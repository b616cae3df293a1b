"""Log every garbage collection of every Python process started with this folder on PYTHONPATH
(the engine, the drafter process, the server, `bench serve`): one line per collection,
"generation milliseconds unix_time", in GC_LOG_DIR/gc_PID.txt (default /tmp/gc_log).

    PYTHONPATH=scripts/gc_log .venv/bin/minedraft bench offline ...
    PYTHONPATH=$PWD/scripts/gc_log MODES="ar psd" RATES=0.5 bash scripts/serve_sweep.sh /tmp/gcs "x="

The file is rewritten every 5 seconds and at exit, so a server stopped by a signal keeps its log.
"""

import atexit
import gc
import os
import threading
import time

_collections: list[tuple[int, float, float]] = []
_started = [0.0]
_folder = os.environ.get("GC_LOG_DIR", "/tmp/gc_log")


def _time(phase: str, info: dict) -> None:
    if phase == "start":
        _started[0] = time.perf_counter()
    else:
        _collections.append((info["generation"], (time.perf_counter() - _started[0]) * 1e3, time.time()))


def _write() -> None:
    os.makedirs(_folder, exist_ok=True)
    with open(os.path.join(_folder, f"gc_{os.getpid()}.txt"), "w") as f:
        f.writelines(f"{g} {ms:.2f} {at:.3f}\n" for g, ms, at in list(_collections))


def _write_every_5_s() -> None:
    while True:
        time.sleep(5)
        _write()


gc.callbacks.append(_time)
atexit.register(_write)
threading.Thread(target=_write_every_5_s, daemon=True).start()
