"""Helpers shared by the benchmark drivers (soak_bench.py, s3_bench.py): free ports,
percentiles and connections to the benchmark's Postgres."""

from __future__ import annotations

import socket

import psycopg


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(values: list[float], p: float) -> float:
    """The p-th percentile (nearest rank); NaN for no values."""
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def pg_connect(port: int, dbname: str) -> psycopg.Connection:
    return psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname=dbname, autocommit=True)
