"""One small registry type for everything looked up by name (models, objectives, decoders, ...)."""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

from caprl.errors import CaprlError

T = TypeVar("T")


class Registry(Generic[T]):
    """A name -> entry mapping filled by a decorator; lookups of unknown names are clear errors."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(entry: T) -> T:
            self.add(name, entry)
            return entry

        return decorator

    def register_class(self, name: str) -> Callable[[T], T]:
        """Like :meth:`register`, and the class learns its registry name (``cls.name``)."""

        def decorator(cls: T) -> T:
            cls.name = name  # type: ignore[attr-defined]
            self.add(name, cls)
            return cls

        return decorator

    def add(self, name: str, entry: T) -> None:
        if name in self._entries:
            raise ValueError(f"{self.kind} '{name}' registered twice")
        self._entries[name] = entry

    def get(self, name: str, where: str = "") -> T:
        if name not in self._entries:
            prefix = f"{where}: " if where else ""
            raise CaprlError(f"{prefix}unknown {self.kind} '{name}'; registered: {', '.join(sorted(self._entries))}")
        return self._entries[name]

    __getitem__ = get

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def items(self) -> list[tuple[str, T]]:
        return sorted(self._entries.items())
