"""Result tables, by name: importing this package registers every table."""

from caprl.tables import actor_critic, build, pg_spider, psst, sle, stackcap  # noqa: F401,E402  (registration side effect)
