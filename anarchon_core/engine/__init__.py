"""The engine's parts, each named after its concern; :class:`~anarchon_core.Scheduler` wires them.

- :mod:`.context`: what every part shares (the instance, clock, events,
  store and jobs);
- :mod:`.table`: the jobs declared here and what this instance knows of each,
  behind the only lock;
- :mod:`.gateway`: the store as the engine calls it: what it can do (read
  once, from its type), and the batch calls with their per-item answers, refusals, outages
  and bugs;
- :mod:`.loop`: the scheduling thread, one step's phases in order, back-off,
  health, and stopping (a stop asked inside a step waits for its end, through
  :class:`~anarchon_core.deferral.StepGuard`);
- :mod:`.claims`: placing jobs on their schedule, the claims due in one batch,
  and the one place that acts on a claim's answer;
- :mod:`.runs`: beginning, executing, renewing and finishing runs, and
  handing them over on stop;
- :mod:`.backups`: checking the leases backed up, and taking slots over;
- :mod:`.requests`: run-now, catch-up and backfill requests read from the
  store's control entries;
- :mod:`.stored`: schedules defined in the store;
- :mod:`.registry`: this instance in the store's registry of live instances.
"""
