"""Reading files cso did not just write: bounded JSON and checked ``.npz`` members.

Every file cso reads back (packed filters, the tuned-plans store, the stored
machine description, ``cso-prepack``'s inputs) may be damaged or hostile.
The readers here bound what such a file can make the process do before its
content is validated field by field by its own loader:

- :func:`parse_json` refuses a document larger than ``max_bytes``, nested
  deeper than ``max_depth`` (Python's parser would raise ``RecursionError``)
  or holding a number that is not finite (``1e400``, ``NaN``, ``Infinity``),
  or an integer of more than 30 digits;
- :func:`read_npz` reads an archive's ``.npy`` members one at a time, each
  only after its name has been accepted and its header (dtype, shape,
  order) checked against what the caller expects, and never allocates more
  than the member's stored bytes: ``np.savez`` stores members uncompressed
  and ``np.savez_compressed`` deflates them (at most ~1032-fold), so a
  member can claim no more elements than the file can hold.

Both raise :class:`UntrustedFileError` (a ``ValueError``) with a message
naming what was wrong; the callers re-raise it as their own error type.
"""

from __future__ import annotations

import json
import os
import re
import struct
import tokenize
import zipfile

import numpy as np

MAX_JSON_DEPTH = 64
MAX_JSON_BYTES = 64 * 1024 * 1024
_MAX_INTEGER_DIGITS = 30
_MAX_DEFLATE_RATIO = 1100
# A JSON string literal, escapes included: removed before brackets are counted.
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")


# What zipfile and NumPy's header parser raise on damaged bytes: besides the
# documented OSError/BadZipFile/ValueError, a flipped byte in a header reaches
# ast.literal_eval (SyntaxError), struct (struct.error), the codecs
# (UnicodeDecodeError, a ValueError) or an unsupported zip feature
# (NotImplementedError).  All mean the same thing here: a damaged file.
_DAMAGED = (
    OSError,
    zipfile.BadZipFile,
    ValueError,
    EOFError,
    SyntaxError,
    TypeError,
    KeyError,
    IndexError,
    NotImplementedError,
    struct.error,
    tokenize.TokenError,  # NumPy tokenizes old-style .npy headers
)


class UntrustedFileError(ValueError):
    """A file whose content cso refuses before using it."""


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in JSON ``text`` (strings ignored)."""
    depth = deepest = 0
    for bracket in _BRACKETS.findall(_JSON_STRING.sub("", text)):
        if bracket in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _finite_float(text: str) -> float:
    value = float(text)
    if not np.isfinite(value):
        raise UntrustedFileError(f"number {text[:40]} is out of range")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_INTEGER_DIGITS:
        raise UntrustedFileError(f"integer of {len(text)} digits is out of range")
    return int(text)


def _no_constant(name: str):
    raise UntrustedFileError(f"{name} is not a number cso accepts")


def parse_json(data, *, what: str, max_depth: int = MAX_JSON_DEPTH,
               max_bytes: int = MAX_JSON_BYTES):
    """Parse ``data`` (``str`` or UTF-8 ``bytes``) as bounded JSON.

    Parameters
    ----------
    data : str or bytes
    what : str
        Names the document in error messages (e.g. a path).
    max_depth, max_bytes : int
        Nesting and size limits.

    Raises
    ------
    UntrustedFileError
        Too large, too deep, not UTF-8, not JSON, or holding a non-finite or
        overlong number.
    """
    if len(data) > max_bytes:
        raise UntrustedFileError(f"{what}: {len(data)} bytes of JSON, more than {max_bytes}")
    if isinstance(data, (bytes, bytearray)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as error:
            raise UntrustedFileError(f"{what}: not UTF-8 text ({error})") from None
    depth = json_depth(data)
    if depth > max_depth:
        raise UntrustedFileError(f"{what}: JSON nested {depth} deep, more than {max_depth}")
    try:
        return json.loads(
            data,
            parse_float=_finite_float,
            parse_int=_bounded_int,
            parse_constant=_no_constant,
        )
    except UntrustedFileError as error:
        raise UntrustedFileError(f"{what}: {error}") from None
    except (ValueError, RecursionError) as error:
        raise UntrustedFileError(f"{what}: not valid JSON ({error})") from None


def read_json_file(path, *, what: str | None = None, max_bytes: int = MAX_JSON_BYTES):
    """:func:`parse_json` of the file at ``path``, read only up to ``max_bytes + 1``.

    ``FileNotFoundError`` and other ``OSError``\\ s propagate; the caller
    decides what a missing file means.
    """
    with open(os.fspath(path), "rb") as handle:
        data = handle.read(max_bytes + 1)
    return parse_json(data, what=what or os.fspath(path), max_bytes=max_bytes)


class NpzMembers:
    """The ``.npy`` members of an ``.npz`` archive, read one at a time on request.

    Parameters
    ----------
    path : str or path-like

    Notes
    -----
    Use as a context manager.  :attr:`names` lists the members (without
    ``.npy``) before anything is read; :meth:`header` reads one member's
    header; :meth:`read` its array, after checking the header against the
    caller's expectation.
    """

    _MAX_HEADER = 10000

    def __init__(self, path):
        self.path = os.fspath(path)
        try:
            self._zip = zipfile.ZipFile(self.path)
        except FileNotFoundError:
            raise
        except _DAMAGED as error:
            raise UntrustedFileError(
                f"{self.path}: not a readable .npz archive ({error})"
            ) from None
        self._infos = {}
        archive_bytes = os.path.getsize(self.path)
        for info in self._zip.infolist():
            name = info.filename
            problem = None
            if not name.endswith(".npy"):
                problem = "is not an .npy array"
            elif info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                problem = "is compressed other than by deflate (np.savez_compressed)"
            elif info.header_offset + info.compress_size > archive_bytes or (
                info.file_size > _MAX_DEFLATE_RATIO * info.compress_size + 1024
                if info.compress_type == zipfile.ZIP_DEFLATED
                else info.file_size != info.compress_size
            ):
                # Sizes past what the file can hold: a reader would be asked to
                # allocate them (deflate expands at most ~1032-fold).
                problem = "claims more bytes than the archive holds"
            if problem:
                self.close()
                raise UntrustedFileError(f"{self.path}: member {name!r} {problem}")
            self._infos[name[: -len(".npy")]] = info

    @property
    def names(self) -> list:
        return list(self._infos)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        self._zip.close()

    def header(self, name: str) -> tuple:
        """``(dtype, shape, fortran_order)`` of member ``name`` from its header alone."""
        info = self._infos[name]
        try:
            with self._zip.open(info) as stream:
                return self._read_header(stream, name)
        except UntrustedFileError:
            raise
        except _DAMAGED as error:
            raise UntrustedFileError(f"{self.path}: member {name!r} is damaged ({error})") from None

    def _read_header(self, stream, name):
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(
                stream, max_header_size=self._MAX_HEADER
            )
        elif version == (2, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(
                stream, max_header_size=self._MAX_HEADER
            )
        else:
            raise UntrustedFileError(f"{self.path}: member {name!r} has .npy version {version}")
        if dtype.hasobject or dtype.kind not in "biuf" or dtype.subdtype is not None:
            raise UntrustedFileError(
                f"{self.path}: member {name!r} holds {dtype}, not plain numbers"
            )
        return dtype, tuple(shape), fortran_order

    def read(self, name: str, *, max_elements: int | None = None) -> np.ndarray:
        """Member ``name`` as a C-ordered array, its header checked before any allocation.

        Raises
        ------
        UntrustedFileError
            A Fortran-ordered or non-numeric member, or one whose header
            claims more elements than ``max_elements`` or more bytes than the
            archive stores for it.
        """
        info = self._infos[name]
        try:
            with self._zip.open(info) as stream:
                dtype, shape, fortran_order = self._read_header(stream, name)
                count = 1
                for extent in shape:
                    count *= int(extent)
                if fortran_order and len(shape) > 1:
                    raise UntrustedFileError(f"{self.path}: member {name!r} is Fortran-ordered")
                if max_elements is not None and count > max_elements:
                    raise UntrustedFileError(
                        f"{self.path}: member {name!r} claims {count} elements, more than the "
                        f"{max_elements} expected"
                    )
                nbytes = count * dtype.itemsize
                if nbytes > info.file_size - stream.tell():
                    raise UntrustedFileError(
                        f"{self.path}: member {name!r} claims {nbytes} bytes; it stores fewer"
                    )
                data = stream.read(nbytes)
        except UntrustedFileError:
            raise
        except _DAMAGED as error:
            raise UntrustedFileError(f"{self.path}: member {name!r} is damaged ({error})") from None
        if len(data) != nbytes:
            raise UntrustedFileError(f"{self.path}: member {name!r} is truncated")
        return np.frombuffer(data, dtype=dtype).reshape(shape).copy()
