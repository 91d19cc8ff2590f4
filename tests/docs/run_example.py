"""Run one Python example of the documentation: ``python run_example.py LABEL [CONTEXT] < code``.

The example runs as ``__main__``, in the working directory it is started in
(the tests give it a temporary one), after the setup of the named context, if
any. A context stands for what the page around the example has already
introduced; a fence asks for one with ``<!-- example-context: NAME -->``.

``Scheduler.run_forever`` does not block here: it starts the scheduler and
stops it again at once, so an example that ends with it declares its jobs,
opens its store and returns.
"""

from __future__ import annotations

import sys

_DRAMATIQ_BROKER = """\
import dramatiq
from dramatiq.brokers.stub import StubBroker

broker = StubBroker()
dramatiq.set_broker(broker)
"""

#: Context name -> the setup it runs before the example.
CONTEXTS = {
    # A page's jobs, declared on a scheduler as in the Quick start.
    "scheduler": """\
import anarchon_core as anarchon

cron = anarchon.Scheduler("memory://")
""",
    # The reader's Celery app. Declaring tasks and settings connects to nothing.
    "celery-app": """\
from celery import Celery

app = Celery("proj", broker="redis://127.0.0.1:6379/0")
""",
    # The reader's Dramatiq broker, without anarchon's middleware.
    "dramatiq-broker": _DRAMATIQ_BROKER,
    # The same broker after the Setup of docs/dramatiq.md.
    "dramatiq-anarchon": _DRAMATIQ_BROKER
    + """\
from anarchon_dramatiq import Anarchon, every

broker.add_middleware(Anarchon())
""",
}


def _start_and_stop(self: object) -> None:
    """``run_forever`` for examples: start, then stop gracefully at once."""
    self.start()  # type: ignore[attr-defined]
    self.stop(timeout=0)  # type: ignore[attr-defined]


def main() -> None:
    label = sys.argv[1]
    context = sys.argv[2] if len(sys.argv) > 2 else ""
    code = sys.stdin.read()

    import anarchon_core

    anarchon_core.Scheduler.run_forever = _start_and_stop  # type: ignore[method-assign]
    namespace = {"__name__": "__main__"}
    if context:
        exec(compile(CONTEXTS[context], f"<context {context}>", "exec"), namespace)
    exec(compile(code, label, "exec"), namespace)


if __name__ == "__main__":
    main()
