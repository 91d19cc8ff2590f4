"""The store a Dramatiq broker's own server can serve as: Redis/Valkey or RabbitMQ.

``Anarchon(store=None)`` uses the broker's server as the store; its URL is
read from the broker's client (a ``RedisBroker``'s connection pool, a
``RabbitmqBroker``'s pika parameters).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from dramatiq import Broker

from anarchon_core import ConfigurationError


def broker_store_url(broker: Broker) -> str:
    """The URL of the broker's own Redis/Valkey or RabbitMQ server, as a store URL."""
    pool = getattr(getattr(broker, "client", None), "connection_pool", None)
    if pool is not None:
        kw = pool.connection_kwargs
        if "path" not in kw:
            scheme = "rediss" if pool.connection_class.__name__ == "SSLConnection" else "redis"
            return f"{scheme}://{_userinfo(kw.get('username'), kw.get('password'))}" + (
                f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"
            )
    parameters: Any = getattr(broker, "parameters", None)
    if isinstance(parameters, list) and parameters:
        parameters = parameters[0]
    if parameters is not None and hasattr(parameters, "virtual_host"):
        creds = getattr(parameters, "credentials", None)
        scheme = "amqps" if getattr(parameters, "ssl_options", None) else "amqp"
        userinfo = _userinfo(getattr(creds, "username", None), getattr(creds, "password", None))
        vhost = quote(parameters.virtual_host, safe="")
        return f"{scheme}://{userinfo}{parameters.host}:{parameters.port}/{vhost}"
    raise ConfigurationError(
        f"Anarchon(store=None): the broker ({type(broker).__name__}) cannot serve as the store:"
        " pass store= a store URL (redis://, postgresql://, nats://, ...)"
    )


def _userinfo(user: str | None, password: str | None) -> str:
    if not user and not password:
        return ""
    return f"{quote(user or '', safe='')}:{quote(password or '', safe='')}@"
