"""The MySQL store in a process where a Django project runs on PyMySQL.

``python -m tests.stores.mysql_beside_django URL`` does what such a
project's settings and Django's MySQL backend do (``install_as_MySQLdb()``,
then ``MySQLdb.converters``, which loads PyMySQL's error classes a second
time), then asks the store for what its error handling decides: a claim
that loses the race for a new row must be retried and answered, and a
server that cannot be reached must be an outage. Prints ``ok`` when both
hold.
"""

from __future__ import annotations

import sys
import uuid

import pymysql

pymysql.install_as_MySQLdb()
import MySQLdb.converters  # noqa: E402, F401 - as django.db.backends.mysql.base does

from anarchon_core import ClaimRequest, ClaimStatus, StoreUnavailable, open_store  # noqa: E402
from anarchon_core.stores import mysql  # noqa: E402


def main(url: str) -> None:
    namespace = f"dj{uuid.uuid4().hex[:8]}"
    mine = open_store(url, namespace=namespace)
    other = open_store(url, namespace=namespace)
    write = mysql.MySQLStore._writes
    raced: list[bool] = []

    def writes_after_a_rival(self: mysql.MySQLStore, *args: object) -> object:
        if self is mine and not raced:  # another instance makes the new row first
            raced.append(True)
            other.claim("new", 5000, "other", 10)
        return write(self, *args)

    mysql.MySQLStore._writes = writes_after_a_rival  # type: ignore[method-assign]
    try:
        [claim] = mine.claim_many([ClaimRequest("new", 5000, 0)], "mine")
    finally:
        mysql.MySQLStore._writes = write  # type: ignore[method-assign]
    assert raced and claim.status is ClaimStatus.TAKEN, claim
    mine.close()
    other.close()
    unreachable = open_store("mysql://root@127.0.0.1:9/x?timeout=1", namespace=namespace)
    try:
        unreachable.claim("job", 1000, "mine", 10)
    except StoreUnavailable:
        print("ok")
    finally:
        unreachable.close()


if __name__ == "__main__":
    main(sys.argv[1])
