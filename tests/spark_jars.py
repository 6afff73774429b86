"""Builds the classes that the Iceberg Spark runtime jar used by the tests lacks.

The only Iceberg 1.10 Spark runtime the reachable registries carry
(`iceberg-spark-runtime-3.5_2.12-1.10.2.jar` inside the PyPI wheel
`snowpark-connect-deps-iceberg`) was built without two of the packages it relocates:

* Jackson, under `org.apache.iceberg.shaded.com.fasterxml.jackson` (table metadata is JSON):
  made here from Spark's own jackson-core, -databind, -annotations and -datatype-jsr310 2.15.2
  jars (pyspark's `jars/`);
* Apache HttpClient 5, under `org.apache.iceberg.shaded.org.apache.hc` (only the REST catalog
  client uses it): made from httpclient5 5.5.1 / httpcore5 5.3.6, which the npm package
  `wiremock` ships relocated under `wiremock.` inside `wiremock-standalone-<version>.jar`.

Relocating a class means renaming it and every reference to the moved packages inside class
files. All of those (class names, field and method descriptors, generic signatures, string
constants used for reflection) are CONSTANT_Utf8 entries of the class file's constant pool,
so only those entries are rewritten; the rest of the class file refers to the pool by index
and is copied unchanged. `META-INF/services` files are renamed and rewritten the same way.

The result is one extra jar to put on Spark's classpath beside the runtime jar. Before the jar
is written, every class that the runtime jar names under the two packages is checked to exist,
and so is every class the new jar itself names there.

Usage: spark_jars.py RUNTIME_JAR WIREMOCK_STANDALONE_JAR PYSPARK_JARS_DIR OUT_JAR
(tests/run calls it once; the output is cached beside the runtime jar.)
"""

from __future__ import annotations

import os
import re
import struct
import sys
import zipfile
from pathlib import Path

SHADED = "org/apache/iceberg/shaded/"
JACKSON_JARS = ("jackson-core", "jackson-databind", "jackson-annotations", "jackson-datatype-jsr310")
JACKSON_VERSION = "2.15.2"

#: (source prefix, target prefix) in internal ("/") form; each rule also applies in "." form.
JACKSON_RULES = [("com/fasterxml/jackson/", SHADED + "com/fasterxml/jackson/")]
WIREMOCK_RULES = [
    ("wiremock/org/apache/hc/", SHADED + "org/apache/hc/"),
    # httpclient5 logs through slf4j, which wiremock relocated too; Spark provides the original
    ("wiremock/org/slf4j/", "org/slf4j/"),
]

# --------------------------------------------------------------------------------------------
# Class files
# --------------------------------------------------------------------------------------------

CONSTANT_UTF8, CONSTANT_CLASS = 1, 7
#: Size in bytes (after the tag) of every constant pool entry kind other than Utf8.
_ENTRY_SIZE = {3: 4, 4: 4, 5: 8, 6: 8, 7: 2, 8: 2, 16: 2, 19: 2, 20: 2,
               9: 4, 10: 4, 11: 4, 12: 4, 17: 4, 18: 4, 15: 3}


def constant_pool(data: bytes) -> tuple[dict[int, tuple[int, int, int]], int]:
    """The constant pool: index -> (tag, start, end), the entry's byte range with its tag byte,
    in file order; and the offset where the pool ends. Long and Double take two indexes."""
    if data[:4] != b"\xca\xfe\xba\xbe":
        raise ValueError("not a class file")
    count = struct.unpack_from(">H", data, 8)[0]
    entries, pos, index = {}, 10, 1
    while index < count:
        tag = data[pos]
        if tag == CONSTANT_UTF8:
            end = pos + 3 + struct.unpack_from(">H", data, pos + 1)[0]
        else:
            end = pos + 1 + _ENTRY_SIZE[tag]
        entries[index] = (tag, pos, end)
        index += 2 if tag in (5, 6) else 1
        pos = end
    return entries, pos


def _patterns(rules: list[tuple[str, str]]) -> list[tuple[re.Pattern, bytes]]:
    """Byte patterns for each rule, in "/" form (class names, descriptors) and "." form (names
    in string constants and service files). Modified UTF-8 keeps ASCII as is, so matching bytes
    is exact."""
    out = []
    for src, dst in rules:
        for sep in ("/", "."):
            out.append((re.compile(re.escape(src.replace("/", sep).encode())), dst.replace("/", sep).encode()))
    return out


def relocate_bytes(text: bytes, patterns) -> bytes:
    for pattern, replacement in patterns:
        text = pattern.sub(replacement, text)
    return text


def relocate_class(data: bytes, patterns) -> bytes:
    entries, pool_end = constant_pool(data)
    out = [data[:10]]
    for tag, start, end in entries.values():
        if tag == CONSTANT_UTF8:
            text = relocate_bytes(data[start + 3:end], patterns)
            if len(text) > 0xFFFF:
                raise ValueError("a relocated constant outgrew the class file's 64 KiB limit")
            out.append(struct.pack(">BH", CONSTANT_UTF8, len(text)) + text)
        else:
            out.append(data[start:end])
    out.append(data[pool_end:])
    return b"".join(out)


_DESCRIPTOR_CLASS = re.compile(rb"L([\w/$]+)[;<]")


def referenced_classes(data: bytes) -> set[str]:
    """Internal names of the classes a class file names: its Class entries and the object types
    in its descriptors and signatures."""
    entries, _ = constant_pool(data)
    utf8 = {i: data[start + 3:end] for i, (tag, start, end) in entries.items() if tag == CONSTANT_UTF8}
    names = set()
    for tag, start, _ in entries.values():
        if tag != CONSTANT_CLASS:
            continue
        name = utf8[struct.unpack_from(">H", data, start + 1)[0]]
        if name.startswith(b"["):  # array class: its element type, if an object
            names.update(m.group(1).decode() for m in _DESCRIPTOR_CLASS.finditer(name))
        else:
            names.add(name.decode())
    for text in utf8.values():
        names.update(m.group(1).decode() for m in _DESCRIPTOR_CLASS.finditer(text))
    return names


# --------------------------------------------------------------------------------------------
# Jars
# --------------------------------------------------------------------------------------------


def relocated_entries(jar: Path, rules, keep: str):
    """(name, bytes) of the relocated entries of `jar`: the classes and resources whose name
    starts with `keep`, the service files of interfaces there, and the licence files (the
    manifest, module descriptors and multi-release variants stay behind)."""
    patterns = _patterns(rules)
    with zipfile.ZipFile(jar) as z:
        for name in z.namelist():
            if name.endswith("/") or name.endswith("module-info.class"):
                continue
            if name.startswith("META-INF/services/" + keep.replace("/", ".")):
                service = relocate_bytes(name[len("META-INF/services/"):].encode(), patterns).decode()
                yield "META-INF/services/" + service, relocate_bytes(z.read(name), patterns)
            elif name.startswith(keep):
                data = z.read(name)
                if name.endswith(".class"):
                    data = relocate_class(data, patterns)
                yield relocate_bytes(name.encode(), patterns).decode(), data
            elif name in ("META-INF/LICENSE", "META-INF/NOTICE"):
                yield f"META-INF/licenses/{jar.stem}/{name[9:]}", z.read(name)


def missing_classes(class_files: dict[str, bytes], available: set[str], prefixes: tuple[str, ...]) -> set[str]:
    """Classes under `prefixes` that some class of `class_files` names but `available` lacks."""
    missing = set()
    for data in class_files.values():
        for name in referenced_classes(data):
            if name.startswith(prefixes) and name not in available:
                missing.add(name)
    return missing


def _entry(name: str) -> zipfile.ZipInfo:
    """A jar entry with a fixed date: the same inputs give the same jar."""
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


def build(runtime_jar: Path, wiremock_jar: Path, pyspark_jars: Path, out_jar: Path) -> None:
    entries: dict[str, bytes] = {}
    sources = [(pyspark_jars / f"{name}-{JACKSON_VERSION}.jar", JACKSON_RULES, "com/fasterxml/jackson/")
               for name in JACKSON_JARS]
    sources.append((wiremock_jar, WIREMOCK_RULES, "wiremock/org/apache/hc/"))
    for jar, rules, keep in sources:
        if not jar.exists():
            raise SystemExit(f"spark_jars: {jar} is missing")
        for name, data in relocated_entries(jar, rules, keep):
            if name in entries and not name.startswith("META-INF/services/"):
                raise SystemExit(f"spark_jars: {name} comes from two jars")
            # two jars may provide the same service: keep every provider line
            entries[name] = entries[name] + b"\n" + data if name in entries else data

    prefixes = (SHADED + "com/fasterxml/jackson/", SHADED + "org/apache/hc/")
    new_classes = {n: d for n, d in entries.items() if n.endswith(".class")}
    with zipfile.ZipFile(runtime_jar) as z:
        runtime_classes = {n: z.read(n) for n in z.namelist()
                           if n.endswith(".class") and not n.endswith("module-info.class")}
    available = {n[:-6] for n in runtime_classes} | {n[:-6] for n in new_classes}
    missing = missing_classes(runtime_classes, available, prefixes) | missing_classes(new_classes, available, prefixes)
    if missing:
        raise SystemExit(f"spark_jars: still missing {len(missing)} classes, e.g. {sorted(missing)[:10]}")

    tmp = out_jar.with_name(out_jar.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(_entry("META-INF/MANIFEST.MF"), "Manifest-Version: 1.0\nCreated-By: skippr tests/spark_jars.py\n\n")
        for name in sorted(entries):
            z.writestr(_entry(name), entries[name])
    os.replace(tmp, out_jar)  # a half-written jar never looks finished
    print(f"spark_jars: wrote {out_jar} ({len(new_classes)} classes)")


if __name__ == "__main__":
    if len(sys.argv) != 5:
        raise SystemExit(__doc__)
    build(*(Path(a) for a in sys.argv[1:]))
