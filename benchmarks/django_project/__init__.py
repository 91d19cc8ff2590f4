"""The Django project of the django-celery-beat benchmark (benchmarks/django_beat.py).

``settings`` (the database, broker, queue and namespace from ``BENCH_DJ_*``
variables), ``celery_app`` (the app every benchmark beat runs), ``rows``
(migrations and the rows, through Django's ORM).
"""
