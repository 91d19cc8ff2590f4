"""One benchmark instance: a scheduler with N jobs, recording when each slot ran.

Run by benchmarks.run in a process of its own; stops on SIGTERM and writes its
figures (store calls by method, CPU time, peak RSS) as the last line of its
output file. While it runs, it appends the slots it ran and those it reported
missed to ``<output file>.live`` every quarter of a second: the runner stops
the instances once every slot due in its window is one or the other.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import resource
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from anarchon_core import Event, EventKind, Run, Scheduler, open_store
from anarchon_core.engine.tallies import TALLIES

#: The store methods counted as round trips (each is one call to the server).
CALLS = (
    "claim",
    "claim_many",
    "takeover",
    "renew",
    "dispatch",
    "finish",
    "release",
    "change_many",
    "states",
)


def count_calls(store: Any, counts: Counter[str]) -> None:
    """Wrap the store's methods so that each call is counted by name; of the control
    entries' calls, those of the tallies (their reads and writes, per tick, in place of
    the records' reads), as ``tallies``."""
    for name in CALLS:
        method = getattr(store, name)

        def counted(*args: Any, _method: Any = method, _name: str = name, **kwargs: Any) -> Any:
            counts[_name] += 1
            return _method(*args, **kwargs)

        setattr(store, name, counted)
    for name in ("controls", "set_control"):
        method = getattr(store, name, None)
        if method is None:
            continue

        def tallied(*args: Any, _method: Any = method, **kwargs: Any) -> Any:
            if args and str(args[0]).startswith(TALLIES):
                counts["tallies"] += 1
            return _method(*args, **kwargs)

        setattr(store, name, tallied)


def peak_rss_mb() -> float:
    """This process's peak resident set since it started, in MB.

    ``VmHWM`` starts again at exec; ``getrusage``'s ``ru_maxrss`` does not on
    Linux (it keeps the peak of the forking parent).
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--every", type=float, required=True)
    parser.add_argument("--cron", help="a cron expression instead of --every")
    parser.add_argument("--jitter", type=float, default=0.0)
    parser.add_argument("--lookahead", type=float, default=0.0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--launched", type=float, help="when the runner launched it (epoch s)")
    args = parser.parse_args()

    counts: Counter[str] = Counter()
    store = open_store(args.store, namespace=args.namespace)
    count_calls(store, counts)
    runs: list[tuple[str, float, float]] = []
    lock = threading.Lock()

    def handler(run: Run) -> None:
        started = time.time()
        with lock:
            runs.append((run.slot_id, run.slot.timestamp(), started))

    told: list[str] = []

    def on_event(event: Event) -> None:
        if event.kind is EventKind.MISSED and event.slot_id is not None:
            with lock:
                told.append(event.slot_id)

    cron = Scheduler(store, instance=args.name, jitter=args.jitter, lookahead=args.lookahead)
    cron.add_listener(on_event)
    for n in range(args.jobs):
        if args.cron:
            cron.add_job(handler, name=f"job{n:05d}", cron=args.cron)
        else:
            cron.add_job(handler, name=f"job{n:05d}", every=args.every)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    # SIGUSR2 prints every thread's stack (the runner sends it to an instance that does
    # not stop).
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    # SIGUSR1 marks the start of the measured window: CPU and calls count from then.
    mark: dict[str, Any] = {"cpu": time.process_time(), "wall": time.monotonic()}
    mark["counts"] = Counter[str]()

    def on_mark(*_: Any) -> None:
        mark.update(cpu=time.process_time(), wall=time.monotonic(), counts=Counter(counts))
        mark["events"] = Counter(cron.stats)

    signal.signal(signal.SIGUSR1, on_mark)
    cron.start()
    # Ready: the first step placed every job and the store answered it; the start-up
    # time is from the runner's launch of this process (--launched) to then.
    ready: dict[str, float] = {}

    def await_ready() -> None:
        while not stop.is_set() and not cron.health().ready:
            time.sleep(0.05)
        ready["at"] = time.time()

    threading.Thread(target=await_ready, daemon=True).start()

    def write_live() -> None:
        """The slots run and reported missed since the last write, to ``<out>.live``."""
        ran = reported = 0
        with open(args.out + ".live", "a") as live:
            while True:
                stopped = stop.wait(0.25)
                with lock:
                    new_runs, new_told = runs[ran:], told[reported:]
                ran, reported = ran + len(new_runs), reported + len(new_told)
                lines = [json.dumps({"slot": slot_id}) for slot_id, _, _ in new_runs]
                lines += [json.dumps({"missed": slot_id}) for slot_id in new_told]
                live.write("".join(line + "\n" for line in lines))
                live.flush()
                if stopped:
                    return

    writer = threading.Thread(target=write_live, daemon=True)
    writer.start()
    with open(args.out + ".ready", "w"):
        pass  # the runner starts counting slots once every instance runs
    stop.wait()
    cron.stop()
    writer.join()
    cpu, wall = time.process_time() - mark["cpu"], time.monotonic() - mark["wall"]
    store.close()
    with open(args.out, "w") as out:
        for slot_id, slot, started in runs:
            out.write(json.dumps({"slot": slot_id, "at": slot, "started": started}) + "\n")
        for slot_id in told:
            out.write(json.dumps({"missed": slot_id}) + "\n")
        rss = peak_rss_mb()
        calls = dict(counts - mark["counts"])
        events = dict(Counter(cron.stats) - mark.get("events", Counter()))
        stats = {"calls": calls, "cpu": cpu, "wall": wall, "rss_mb": rss, "events": events}
        if args.launched is not None and "at" in ready:
            stats["startup"] = ready["at"] - args.launched
        out.write(json.dumps({"stats": stats}) + "\n")


if __name__ == "__main__":
    main()
