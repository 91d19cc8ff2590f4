"""``anarchon import``: other schedulers' schedules written as anarchon's stored schedules.

Each source module reads one scheduler's schedules as :class:`~.plan.Found`
items (the stored schedule an entry becomes, or why it is not carried),
translating through the readers the beat scheduler itself uses
(:func:`anarchon_celery.schedules.read_entry`,
:func:`anarchon_celery.rows.read_row`); :mod:`.plan` compares them with what
the store holds and writes the difference:

- :mod:`.beat`: a ``beat_schedule`` mapping, or a Celery app's;
- :mod:`.redbeat`: celery-redbeat's entries in Redis;
- :mod:`.djangobeat`: django-celery-beat's tables, by SQL or through Django.
"""
