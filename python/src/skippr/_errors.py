"""The one exception the package raises for a setting skipprd would refuse."""

from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

#: One step of a field path: a mapping key or a list index.
Segment = Union[str, int]


def display_path(segments: Sequence[Segment]) -> str:
    """``("data_sources", "db", "Postgres", "tables", 1)`` -> ``data_sources.db.Postgres.tables[1]``."""
    out = ""
    for seg in segments:
        if isinstance(seg, int):
            out += f"[{seg}]"
        else:
            out += f".{seg}" if out else seg
    return out


class ConfigError(ValueError):
    """A setting, or a whole ``skippr.yml``, that ``skipprd`` would refuse.

    ``str(error)`` reads ``[<file>[:<line>:<column>]: ][<field.path>: ]<message>``, the same
    shape as skipprd's own errors. The parts are also attributes: ``file``, ``line`` and
    ``column`` (1-based; set when the problem comes from a file), ``path`` (the field, e.g.
    ``data_sources.app_db.Postgres.port`` or ``DataSourcePostgres.port``) and ``message``.
    """

    def __init__(
        self,
        message: str,
        path: str = "",
        *,
        file: Optional[str] = None,
        line: Optional[int] = None,
        column: Optional[int] = None,
    ) -> None:
        self.message = message
        self.path = path
        self.file = file
        self.line = line
        self.column = column
        # Where the problem is inside the object that raised it, so that a caller that knows
        # where that object sits (the file loader) can name the full path and line.
        self.owner: str = ""
        self.segments: Tuple[Segment, ...] = ()
        super().__init__(self._render())

    def _render(self) -> str:
        out = ""
        if self.file is not None:
            out += self.file
            if self.line is not None:
                out += f":{self.line}"
                if self.column is not None:
                    out += f":{self.column}"
            out += ": "
        if self.path:
            out += f"{self.path}: "
        return out + self.message

    def __str__(self) -> str:
        return self._render()


def field_error(owner: str, segments: Sequence[Segment], message: str) -> ConfigError:
    """An error about ``owner``'s field at ``segments`` (``owner`` is e.g. ``DataSourcePostgres``)."""
    segs = tuple(segments)
    path = owner
    rest = display_path(segs)
    if rest:
        path = f"{owner}{rest}" if rest.startswith("[") else f"{owner}.{rest}"
    err = ConfigError(message, path)
    err.owner = owner
    err.segments = segs
    return err
