"""OpenFold's training data in the MLPerf reference's processed layout, read as the reference reads it.

The layout (mlcommons/hpc@2c627d4 openfold/README.md:79-91, written by
scripts/preprocess_pdb_mmcif.py and scripts/preprocess_open_protein_set.py; the paths train.py
is given, README.md:139-142):

    pdb_mmcif/processed/chains.csv        one row per protein chain of every PDB entry
    pdb_mmcif/processed/obsolete.dat      PDB's list of obsolete entries and their successors
    pdb_mmcif/processed/dicts/<xy>        a pickled dict {pdb_id: mmcif_dict} of the entries whose
                                          id's middle two characters are xy
    open_protein_set/processed/pdb_alignments/super.index   JSON {pdb_chain_id: {"db", "files"}}
    open_protein_set/processed/pdb_alignments/<n>.db        the alignment files, concatenated

What the reference reads, and how this module reads it (each function cites the lines it follows):

* chains.csv (`read_chains`): columns pdb_chain_id, pdb_id, author_chain_id, mmcif_chain_ids
  (';'-joined), release_date (YYYY-MM-DD), resolution (empty: none), pdb_cluster_id (-1: in no
  cluster), sequence_length, sequence; each row checked, a bad one is one line naming the file
  and the line.
* obsolete.dat (`read_obsolete`): the OBSLTE lines' old and new ids, at PDB's fixed columns.
* the dicts (`load_mmcif_dict`): the reference pickles builtin objects only (dicts, lists,
  strings, floats, tuples of ints, and zlib-compressed bytes for the atom arrays), so they are
  read by `loads_builtins`, a pickle reader that builds exactly those and never names a class or
  a function: a pickle that names one (os.system, numpy's reconstructor, anything) is refused,
  the file and the name in the message, before anything is built. Never pickle.load. The entry's
  structure and the atom arrays' sizes are checked before a byte is decompressed.
* super.index and the shards (`AlignmentIndex`): every entry's shard is a path inside the
  alignments directory (no absolute path, no '..', no symbolic link out of it), and every byte
  range is checked against the shard's size before it is read with pread; a3m and hhr files
  are parsed as the reference's training path parses them (`parse_a3m`, `parse_hhr`).
* the training set (`training_chains`, `sampler_weights`, `training_index_seed_pairs`) and the
  CAMEO validation set (`validation_chains`, `validation_index_seed_pairs`), selected, weighted
  and sampled as openfold/datasets.py and openfold/samplers.py do.

Every bad input is a KitError: one line naming the file (and key or line) at fault.
"""

from __future__ import annotations

import csv
import io
import math
import os
import pickletools
import random
import re
import string
import zlib
from collections import Counter
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path, PurePosixPath

import numpy as np

from hpckit.common import rawread
from hpckit.common.errors import KitError
from hpckit.common.inputs import MAX_INPUT_BYTES, read_bytes, read_json, read_text

# ----------------------------------------------------------------- the layout

PDB_MMCIF_DIR = "pdb_mmcif/processed"
CHAINS_CSV = "chains.csv"              # preprocess_pdb_mmcif.py:372
OBSOLETE_DAT = "obsolete.dat"          # preprocess_pdb_mmcif.py:380 (the downloaded file's name, copied)
DICTS_DIR = "dicts"                    # preprocess_pdb_mmcif.py:330
ALIGNMENTS_DIR = "open_protein_set/processed/pdb_alignments"   # preprocess_open_protein_set.py:654
SUPER_INDEX = "super.index"            # preprocess_open_protein_set.py:621; datasets.py:173,271
SHARD_NAME = "{}.db"                   # preprocess_open_protein_set.py:486

# chains.csv's columns, in the order the preprocessing writes them (preprocess_pdb_mmcif.py:233-243)
CHAINS_COLUMNS = ("pdb_chain_id", "pdb_id", "author_chain_id", "mmcif_chain_ids", "release_date", "resolution",
                  "pdb_cluster_id", "sequence_length", "sequence")

# the alignment files the training path reads from a chain's entry (datasets.py:109,121-123)
TEMPLATE_HITS = "pdb70_hits.hhr"
MSA_FILES = ("uniref90_hits.a3m", "bfd_uniclust_hits.a3m", "mgnify_hits.a3m")

# train.py's defaults (train.py:85-107), the dates and length the MLPerf runs use
TRAIN_MAX_PDB_RELEASE_DATE = "2021-09-16"
VAL_MIN_CAMEO_SUBMISSION_DATE = "2021-09-17"
VAL_MAX_CAMEO_SUBMISSION_DATE = "2021-12-11"
VAL_MAX_SEQUENCE_LENGTH = 700

ATOM_TYPE_NUM = 37      # residue_constants.py:521-564: the atom37 layout of all_atom_positions / all_atom_mask
# hhblits' alphabet to the MSA's integer codes (residue_constants.py:722-750): create_msa_features
# maps every aligned residue through it (features.py:146); a letter outside it is a KeyError there
HHBLITS_AA_TO_ID = {"A": 0, "B": 2, "C": 1, "D": 2, "E": 3, "F": 4, "G": 5, "H": 6, "I": 7, "J": 20, "K": 8,
                    "L": 9, "M": 10, "N": 11, "O": 20, "P": 12, "Q": 13, "R": 14, "S": 15, "T": 16, "U": 1,
                    "V": 17, "W": 18, "X": 20, "Y": 19, "Z": 3, "-": 21}

_PDB_ID = re.compile(r"[0-9a-z]{4}")          # mmcif.py:270-277: 4 characters, lower case
_CHAIN_ID = re.compile(r"[0-9A-Za-z]{1,4}")    # PDB's author and label chain ids (auth_asym_id, label_asym_id)
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_INT = re.compile(r"-?\d{1,18}")


@dataclass(frozen=True)
class Layout:
    """The four paths train.py takes (README.md:139-142), under one data root."""
    chains: Path
    obsolete: Path
    dicts: Path
    alignments: Path

    @classmethod
    def under(cls, root: str | os.PathLike) -> "Layout":
        root = Path(root)
        return cls(chains=root / PDB_MMCIF_DIR / CHAINS_CSV, obsolete=root / PDB_MMCIF_DIR / OBSOLETE_DAT,
                   dicts=root / PDB_MMCIF_DIR / DICTS_DIR, alignments=root / ALIGNMENTS_DIR)


# ----------------------------------------------------------------- chains.csv

@dataclass(frozen=True)
class Chain:
    """One row of chains.csv (preprocess_pdb_mmcif.py:233-243), and the column each selection
    adds: pdb_cluster_size for training (datasets.py:503-512), cameo_target_id for validation
    (datasets.py:421-431)."""
    pdb_chain_id: str       # f"{pdb_id}_{author_chain_id}"
    pdb_id: str
    author_chain_id: str
    mmcif_chain_ids: str    # ';'-joined, as in the file
    release_date: str
    resolution: float       # nan: none recorded (an empty cell)
    pdb_cluster_id: int     # -1: in no cluster
    sequence_length: int
    sequence: str
    pdb_cluster_size: int | None = None
    cameo_target_id: str | None = None

    def csv_row(self) -> list[str]:
        """The row as the preprocessing's DataFrame.to_csv writes it (resolution a float: repr,
        nan an empty cell)."""
        res = "" if math.isnan(self.resolution) else repr(float(self.resolution))
        return [self.pdb_chain_id, self.pdb_id, self.author_chain_id, self.mmcif_chain_ids, self.release_date,
                res, str(self.pdb_cluster_id), str(self.sequence_length), self.sequence]


def _check_date(text: str) -> bool:
    if not _DATE.fullmatch(text):
        return False
    try:
        datetime.strptime(text, "%Y-%m-%d")   # as _get_pdb_release_dates parses every row (datasets.py:491-500)
    except ValueError:
        return False
    return True


def _chain_from_row(cells: dict, where: str) -> Chain:
    def bad(column: str, why: str) -> KitError:
        value = cells.get(column, "")
        shown = value if len(value) <= 40 else value[:37] + "..."
        return KitError(f"{where}: column {column} {shown!r}: {why}")

    pdb_id, author = cells["pdb_id"], cells["author_chain_id"]
    if not _PDB_ID.fullmatch(pdb_id):
        raise bad("pdb_id", "not a PDB id (4 lower-case letters or digits)")
    if not _CHAIN_ID.fullmatch(author):
        raise bad("author_chain_id", "not a chain id (1 to 4 letters or digits)")
    if cells["pdb_chain_id"] != f"{pdb_id}_{author}":
        raise bad("pdb_chain_id", f"is not pdb_id_author_chain_id ({pdb_id}_{author})")
    mmcif_ids = cells["mmcif_chain_ids"].split(";")
    if not all(_CHAIN_ID.fullmatch(c) for c in mmcif_ids):
        raise bad("mmcif_chain_ids", "not ';'-joined chain ids")
    if not _check_date(cells["release_date"]):
        raise bad("release_date", "not a date YYYY-MM-DD")
    text = cells["resolution"]
    if text == "":
        resolution = float("nan")   # na_values="" (mmcif.py:154-158)
    else:
        try:
            resolution = float(text)
        except ValueError:
            raise bad("resolution", "not a number") from None
        if not math.isfinite(resolution) or resolution < 0:
            raise bad("resolution", "not a resolution in A (>= 0, or an empty cell)")
    if not _INT.fullmatch(cells["pdb_cluster_id"]) or int(cells["pdb_cluster_id"]) < -1:
        raise bad("pdb_cluster_id", "not a cluster id (an integer >= 0, or -1)")
    sequence = cells["sequence"]
    if not sequence or not sequence.isascii() or not sequence.isalpha() or not sequence.isupper():
        raise bad("sequence", "not a protein sequence (upper-case one-letter codes)")
    if not _INT.fullmatch(cells["sequence_length"]) or int(cells["sequence_length"]) != len(sequence):
        raise bad("sequence_length", f"is not the sequence's length ({len(sequence)})")
    return Chain(cells["pdb_chain_id"], pdb_id, author, cells["mmcif_chain_ids"], cells["release_date"],
                 resolution, int(cells["pdb_cluster_id"]), len(sequence), sequence)


def read_chains(path: str | os.PathLike) -> list[Chain]:
    """chains.csv, as load_mmcif_chains_df reads it (mmcif.py:146-164: pd.read_csv with
    na_values="", keep_default_na=False: only an empty cell is missing, "NA" is a chain id), in
    the file's order (the datasets index their chains in it). Every row is checked: the columns
    the preprocessing writes (CHAINS_COLUMNS; others are ignored), a PDB id, chain ids, a date,
    numbers where numbers are, sequence_length the sequence's length, pdb_chain_id unique; a bad
    row is one KitError naming the file and its line."""
    path = Path(path)
    text = read_text(path, str(path))
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader, None)
        if header is None:
            raise KitError(f"{path}: empty (chains.csv starts with a header line naming its columns)")
        missing = [c for c in CHAINS_COLUMNS if c not in header]
        if missing:
            raise KitError(f"{path} line 1: no column {', '.join(missing)} (the reference's chains.csv has "
                           f"{', '.join(CHAINS_COLUMNS)})")
        if len(set(header)) != len(header):
            raise KitError(f"{path} line 1: a column is named twice")
        at = {c: header.index(c) for c in CHAINS_COLUMNS}
        chains: list[Chain] = []
        seen: dict[str, int] = {}
        for row in reader:
            if not row:    # pandas skips blank lines
                continue
            where = f"{path} line {reader.line_num}"
            if len(row) != len(header):
                raise KitError(f"{where}: {len(row)} fields, the header names {len(header)}")
            chain = _chain_from_row({c: row[i] for c, i in at.items()}, where)
            if chain.pdb_chain_id in seen:
                raise KitError(f"{where}: pdb_chain_id {chain.pdb_chain_id} again (first on line "
                               f"{seen[chain.pdb_chain_id]})")
            seen[chain.pdb_chain_id] = reader.line_num
            chains.append(chain)
    except csv.Error as e:
        raise KitError(f"{path} line {reader.line_num}: not CSV ({e})") from None
    return chains


# ----------------------------------------------------------------- obsolete.dat

def read_obsolete(path: str | os.PathLike) -> dict[str, str]:
    """{obsolete pdb_id: its successor}, as _load_pdb_obsolete_mapping reads obsolete.dat
    (templates.py:190-204): each stripped line that starts with OBSLTE and is longer than 30
    characters holds the old id at columns 20-23 and the new at 29-32 (lower-cased); shorter
    OBSLTE lines (an entry withdrawn without a successor) and every other line are skipped. An
    id that is not 4 letters or digits is one KitError naming the file and line."""
    path = Path(path)
    mapping = {}
    for n, line in enumerate(read_text(path, str(path)).strip().split("\n"), 1):
        line = line.strip()
        if line.startswith("OBSLTE") and len(line) > 30:
            old, new = line[20:24].lower(), line[29:33].lower()
            if not (_PDB_ID.fullmatch(old) and _PDB_ID.fullmatch(new)):
                raise KitError(f"{path} line {n}: not an OBSLTE record (PDB ids at columns 21-24 and 30-33: "
                               f"{line[:40]!r})")
            mapping[old] = new
    return mapping


# ----------------------------------------------------------------- the mmCIF dicts

# Opcodes that build a builtin value from the pickle's own bytes; anything else (a global: GLOBAL,
# STACK_GLOBAL, INST; a call or object construction: REDUCE, NEWOBJ, OBJ, BUILD; an extension code,
# a persistent id, an out-of-band buffer; Python 2's byte strings) is refused.
_CONSTANTS = {"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4",
              "FLOAT", "BINFLOAT", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "BINBYTES",
              "SHORT_BINBYTES", "BINBYTES8"}
# check_pickle_shape only: protocol 0-2 byte strings and protocol 5's bytearray, constants to the
# shape (loads_builtins refuses them: the reference's dicts, protocol 4, hold none)
_SHAPE_CONSTANTS = _CONSTANTS | {"STRING", "BINSTRING", "SHORT_BINSTRING", "BYTEARRAY8"}
_SINGLETONS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}
_NAMING = {"GLOBAL", "INST"}
_CONTAINER_TYPES = {list, dict, set, tuple, frozenset}
# what a dict key or a set item may be: values whose hash is computed without recursion, in time
# bounded by their size (a tuple key nested 100,000 deep overflowed the C stack when hashed; one
# doubled through the memo 100 times never finished); the reference's keys are strings
_FLAT_TYPES = {str, int, float, bool, type(None), bytes}

# Bounds of loads_builtins (docs/security.md "Bounds"): the reference's mmCIF dicts nest 6 deep
# ({pdb_id: {"atoms": {chain: {name: (bytes, shape)}}}}) and a dicts file holds some hundred
# entries of some hundred values each; these are far above both and far below what would
# exhaust the machine.
MAX_PICKLE_DEPTH = 32
MAX_PICKLE_VALUES = 1 << 24    # values decoded, each container counted once for every place it stands
MAX_PICKLE_INT_BITS = 64       # the dicts' integers are array dimensions


class PickleRefused(ValueError):
    """A pickle that names a global or builds an object; `name` says which."""


def describe(value, limit: int = 40) -> str:
    """A short, safe description of an untrusted value for an error message: never its whole
    repr (a structure shared through a pickle's memo can be exponentially large, a string
    gigabytes long, an integer thousands of digits), only its type and size, or the first
    characters of a string or bytes, or a number of few digits."""
    kind = type(value)
    if kind in (str, bytes):
        shown = repr(value[:limit])
        return shown if len(value) <= limit else f"{shown}... ({len(value)} {'characters' if kind is str else 'bytes'})"
    if kind is bool or value is None:
        return repr(value)
    if kind is int:
        return repr(value) if value.bit_length() <= 64 else f"an integer of {value.bit_length()} bits"
    if kind is float:
        return repr(value)
    if kind in _CONTAINER_TYPES:
        return f"a {kind.__name__} of {len(value)}"
    return f"a {kind.__name__}"


def loads_builtins(raw: bytes, max_depth: int = MAX_PICKLE_DEPTH, max_values: int = MAX_PICKLE_VALUES):
    """The value of a pickle that holds only builtin values: None, bools, ints, floats, str,
    bytes, and lists, tuples, dicts, sets and frozensets of them (what the reference's mmCIF
    dicts are: preprocess_pdb_mmcif.py:171-172 pickles mmcif.py:196-206's dict, its atoms
    compressed to bytes and shape tuples by mmcif.py:210-230). The opcodes are decoded by
    pickletools.genops (which runs nothing) and the values built here: a pickle that names a
    global or would call anything raises PickleRefused naming it, before anything is built from
    it; a damaged one ValueError (or the error its bytes lead to).

    Bounded while it decodes, before any value is hashed or shown: containers nested at most
    `max_depth` deep; at most `max_values` values, a container counted again with all it holds
    each time the memo (or DUP) puts it in another place, so a structure doubled through the
    memo is refused by its size, not by its bytes; integers of at most 64 bits; dict keys and
    set items strings, numbers, bytes, bools or None only (never a container, whose hash would
    recurse); a container added to after it was placed in another (a cycle, or a change its
    holders' bounds would miss) refused. The standard pickler's output of the reference's
    dicts never does any of these."""
    stack: list = []
    marks: list[int] = []
    memo: dict = {}
    info: dict[int, list] = {}   # id(container) -> [values it holds, itself included; depth; placed]
    made: list = []              # every container made, kept alive so that no id in `info` is reused
    total = 0

    def count(n: int) -> None:
        nonlocal total
        total += n
        if total > max_values:
            raise ValueError(f"more than {max_values} values (a container shared through the memo counts each time "
                             "it is used)")

    def new(container, size: int, depth: int) -> None:
        if depth > max_depth:
            raise ValueError(f"values nested more than {max_depth} deep (the reference's mmCIF dicts nest 6)")
        if size > max_values:
            raise ValueError(f"a container of more than {max_values} values, counting those it shares")
        info[id(container)] = [size, depth, False]
        made.append(container)
        stack.append(container)
        count(1)

    def place(items) -> tuple[int, int]:
        """The values `items` hold together and their depth; each container among them placed."""
        size = depth = 0
        for v in items:
            if type(v) in _CONTAINER_TYPES:
                i = info[id(v)]
                i[2] = True
                size += i[0]
                if i[1] > depth:
                    depth = i[1]
            else:
                size += 1
        return size, depth

    def flat(keys, what: str) -> None:
        for k in keys:
            if type(k) not in _FLAT_TYPES:
                raise ValueError(f"{what} is {describe(k)} (a string, number, bytes or None only)")

    def add(target, items) -> None:
        size, depth = place(items)
        i = info[id(target)]
        if i[2]:
            raise ValueError(f"a {type(target).__name__} is added to after it was placed in another container "
                             "(or in itself)")
        i[0] += size
        if depth + 1 > i[1]:
            i[1] = depth + 1
        if i[1] > max_depth:
            raise ValueError(f"values nested more than {max_depth} deep (the reference's mmCIF dicts nest 6)")
        if i[0] > max_values:
            raise ValueError(f"a container of more than {max_values} values, counting those it shares")

    def again(value) -> None:
        """DUP, GET: `value` in one more place, counted with all it holds."""
        count(info[id(value)][0] if type(value) in _CONTAINER_TYPES else 1)
        stack.append(value)

    def pop_mark() -> list:
        if not marks:
            raise ValueError("an opcode takes a mark there is none of")
        at = marks.pop()
        items = stack[at:]
        del stack[at:]
        return items

    def top(kind: type):
        if not stack or type(stack[-1]) is not kind:
            raise ValueError(f"an opcode adds to a {kind.__name__} where there is none")
        return stack[-1]

    def pairs(items: list, what: str) -> list:
        if len(items) % 2:
            raise ValueError(f"{what} of an odd number of values")
        keys = items[::2]
        flat(keys, "a dict key")
        return keys

    for op, arg, _pos in pickletools.genops(raw):
        name = op.name
        if name in _CONSTANTS:      # the most frequent: count() inlined
            if type(arg) is int and arg.bit_length() > MAX_PICKLE_INT_BITS:
                raise ValueError(f"an integer of {arg.bit_length()} bits (at most {MAX_PICKLE_INT_BITS})")
            stack.append(arg)
            total += 1
            if total > max_values:
                count(0)
        elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
            if not stack:
                raise ValueError("PUT of an empty stack")
            memo[arg] = stack[-1]
        elif name == "MEMOIZE":
            if not stack:
                raise ValueError("MEMOIZE of an empty stack")
            memo[len(memo)] = stack[-1]
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            if arg not in memo:
                raise ValueError(f"GET of memo entry {describe(arg)}, which was never put")
            again(memo[arg])
        elif name == "STOP":
            if len(stack) != 1 or marks:
                raise ValueError("the pickle ends with more than one value")
            return stack[0]
        elif name in _SINGLETONS:
            stack.append(_SINGLETONS[name])
            count(1)
        elif name in ("PROTO", "FRAME"):
            continue
        elif name in _NAMING:
            module, _, attr = str(arg).partition(" ")
            raise PickleRefused(f"{module[:100]}.{attr[:100]}")
        elif name == "STACK_GLOBAL":
            module, attr = (stack[-2], stack[-1]) if len(stack) >= 2 else ("?", "?")
            raise PickleRefused(f"{module[:100]}.{attr[:100]}" if type(module) is str and type(attr) is str
                                else "a global")
        elif name == "MARK":
            marks.append(len(stack))
        elif name == "POP":
            if marks and marks[-1] == len(stack):
                marks.pop()
            elif stack:
                stack.pop()
            else:
                raise ValueError("POP of an empty stack")
        elif name == "POP_MARK":
            pop_mark()
        elif name == "DUP":
            if not stack:
                raise ValueError("DUP of an empty stack")
            again(stack[-1])
        elif name == "EMPTY_LIST":
            new([], 1, 1)
        elif name == "EMPTY_DICT":
            new({}, 1, 1)
        elif name == "EMPTY_TUPLE":
            new((), 1, 1)
        elif name == "EMPTY_SET":
            new(set(), 1, 1)
        elif name == "APPEND":
            if len(stack) < 2:
                raise ValueError("APPEND without a list and a value")
            value = stack.pop()
            target = top(list)
            add(target, (value,))
            target.append(value)
        elif name == "APPENDS":
            items = pop_mark()
            target = top(list)
            add(target, items)
            target.extend(items)
        elif name in ("LIST", "TUPLE", "FROZENSET"):
            items = pop_mark()
            if name == "FROZENSET":
                flat(items, "a set's item")
            size, depth = place(items)
            new(items if name == "LIST" else tuple(items) if name == "TUPLE" else frozenset(items),
                size + 1, depth + 1)
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            n = int(name[-1])
            if len(stack) - (marks[-1] if marks else 0) < n:
                raise ValueError(f"{name} takes {n} values there are not")
            items = stack[-n:]
            del stack[-n:]
            size, depth = place(items)
            new(tuple(items), size + 1, depth + 1)
        elif name == "DICT":
            items = pop_mark()
            pairs(items, "DICT")
            size, depth = place(items)
            new(dict(zip(items[::2], items[1::2])), size + 1, depth + 1)
        elif name == "SETITEM":
            if len(stack) < 3:
                raise ValueError("SETITEM without a dict, a key and a value")
            value = stack.pop()
            key = stack.pop()
            target = top(dict)
            flat((key,), "a dict key")
            add(target, (key, value))
            target[key] = value
        elif name == "SETITEMS":
            items = pop_mark()
            target = top(dict)
            pairs(items, "SETITEMS")
            add(target, items)
            target.update(zip(items[::2], items[1::2]))
        elif name == "ADDITEMS":
            items = pop_mark()
            target = top(set)
            flat(items, "a set's item")
            add(target, items)
            target.update(items)
        else:
            raise PickleRefused(f"opcode {name}")
    raise ValueError("the pickle has no STOP")


class _Node:
    """A value check_pickle_shape stands in for: a container or an object the pickle builds."""
    __slots__ = ("size", "depth", "placed")

    def __init__(self, size: int, depth: int):
        self.size, self.depth, self.placed = size, depth, False


_OPAQUE = _Node(1, 0)    # a global, a persistent id, an extension code or a buffer: one value, holds none
_OPAQUE.placed = True


def check_pickle_shape(raw: bytes, max_depth: int = MAX_PICKLE_DEPTH, max_values: int = MAX_PICKLE_VALUES) -> None:
    """The bounds loads_builtins keeps, for a pickle another unpickler will build (torch.load's
    weights-only one, which hashes every dict key it sets: a key nested a million deep crashed
    it, one doubled through the memo hung it). Nothing is built or called: the opcodes are
    decoded by pickletools.genops and each value stands as its size and depth (a constant as
    itself, a container or an object a _Node, a global an opaque value). Refused (ValueError)
    past `max_depth` or `max_values` (a container counted each place it stands), a dict key or
    set item that is not a constant string, number, bytes or None, an integer of more than 64
    bits, a container added to after it was placed, an opcode pickle does not define."""
    stack: list = []
    marks: list[int] = []
    memo: dict = {}
    total = 0

    def count(n: int) -> None:
        nonlocal total
        total += n
        if total > max_values:
            raise ValueError(f"more than {max_values} values (a container shared through the memo counts each time "
                             "it is used)")

    def measure(items) -> tuple[int, int]:
        size = depth = 0
        for v in items:
            if type(v) is _Node:
                v.placed = True
                size += v.size
                if v.depth > depth:
                    depth = v.depth
            else:
                size += 1
        return size, depth

    def new(items) -> None:
        size, depth = measure(items)
        if depth + 1 > max_depth:
            raise ValueError(f"values nested more than {max_depth} deep")
        if size + 1 > max_values:
            raise ValueError(f"a container of more than {max_values} values, counting those it shares")
        stack.append(_Node(size + 1, depth + 1))
        count(1)

    def add(items) -> None:
        if not stack or type(stack[-1]) is not _Node or stack[-1] is _OPAQUE:
            raise ValueError("an opcode adds to a value that is not a container")
        size, depth = measure(items)
        target = stack[-1]
        if target.placed:
            raise ValueError("a container is added to after it was placed in another (or in itself)")
        target.size += size
        target.depth = max(target.depth, depth + 1)
        if target.depth > max_depth:
            raise ValueError(f"values nested more than {max_depth} deep")
        if target.size > max_values:
            raise ValueError(f"a container of more than {max_values} values, counting those it shares")

    def flat(keys, what: str) -> None:
        for k in keys:
            if type(k) not in _FLAT_TYPES:
                raise ValueError(f"{what} is not a constant string, number, bytes or None")

    def pop(n: int) -> list:
        if len(stack) - (marks[-1] if marks else 0) < n:
            raise ValueError("an opcode takes values there are not")
        items = stack[-n:]
        del stack[-n:]
        return items

    def pop_mark() -> list:
        if not marks:
            raise ValueError("an opcode takes a mark there is none of")
        at = marks.pop()
        items = stack[at:]
        del stack[at:]
        return items

    def again(value) -> None:
        count(value.size if type(value) is _Node else 1)
        stack.append(value)

    for op, arg, _pos in pickletools.genops(raw):
        name = op.name
        if name in _SHAPE_CONSTANTS:
            if type(arg) is int and arg.bit_length() > MAX_PICKLE_INT_BITS:
                raise ValueError(f"an integer of {arg.bit_length()} bits (at most {MAX_PICKLE_INT_BITS})")
            stack.append(arg)
            count(1)
        elif name in _SINGLETONS:
            stack.append(_SINGLETONS[name])
            count(1)
        elif name in ("PROTO", "FRAME", "READONLY_BUFFER"):
            continue
        elif name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
            if not stack:
                raise ValueError(f"{name} of an empty stack")
            memo[len(memo) if name == "MEMOIZE" else arg] = stack[-1]
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            if arg not in memo:
                raise ValueError("GET of a memo entry never put")
            again(memo[arg])
        elif name == "DUP":
            if not stack:
                raise ValueError("DUP of an empty stack")
            again(stack[-1])
        elif name == "STOP":
            if len(stack) != 1 or marks:
                raise ValueError("the pickle ends with more than one value")
            return
        elif name == "MARK":
            marks.append(len(stack))
        elif name == "POP":
            if marks and marks[-1] == len(stack):
                marks.pop()
            else:
                pop(1)
        elif name == "POP_MARK":
            pop_mark()
        elif name in ("GLOBAL", "PERSID", "EXT1", "EXT2", "EXT4", "NEXT_BUFFER"):
            stack.append(_OPAQUE)
            count(1)
        elif name in ("STACK_GLOBAL", "BINPERSID"):
            pop(2 if name == "STACK_GLOBAL" else 1)
            stack.append(_OPAQUE)
            count(1)
        elif name in ("EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET", "EMPTY_TUPLE"):
            new(())
        elif name in ("LIST", "TUPLE", "OBJ", "INST"):
            new(pop_mark())
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            new(pop(int(name[-1])))
        elif name in ("REDUCE", "NEWOBJ", "NEWOBJ_EX"):
            new(pop(3 if name == "NEWOBJ_EX" else 2))
        elif name == "FROZENSET":
            items = pop_mark()
            flat(items, "a set's item")
            new(items)
        elif name == "DICT":
            items = pop_mark()
            if len(items) % 2:
                raise ValueError("DICT of an odd number of values")
            flat(items[::2], "a dict key")
            new(items)
        elif name in ("APPEND", "BUILD"):
            add(pop(1))
        elif name == "SETITEM":
            items = pop(2)
            flat(items[:1], "a dict key")
            add(items)
        elif name in ("APPENDS", "SETITEMS", "ADDITEMS"):
            items = pop_mark()
            if name == "SETITEMS":
                if len(items) % 2:
                    raise ValueError("SETITEMS of an odd number of values")
                flat(items[::2], "a dict key")
            elif name == "ADDITEMS":
                flat(items, "a set's item")
            add(items)
        else:
            raise ValueError(f"opcode {name}, which this check does not know")   # none left: every opcode is handled
    raise ValueError("the pickle has no STOP")


_ENTRY_KEYS = {   # mmcif.py:196-206: the keys of one entry's mmcif_dict and their types
    "pdb_id": str, "exptl_method": str, "release_date": str, "resolution": (float, int),
    "author_chain_ids": list, "entity_id_to_mmcif_chain_ids": dict, "mmcif_chain_id_to_author_chain_id": dict,
    "sequences": dict, "atoms": dict,
}


def dicts_file(dicts_dir: str | os.PathLike, pdb_id: str) -> Path:
    """The dicts file holding `pdb_id`: its middle two characters (mmcif.py:137-138, the
    mirror's subdirectory the preprocessing names its output after, preprocess_pdb_mmcif.py:149,168)."""
    if not isinstance(pdb_id, str) or not _PDB_ID.fullmatch(pdb_id):
        raise KitError(f"{dicts_dir}: {describe(pdb_id)} is not a PDB id (4 lower-case letters or digits)")
    return Path(dicts_dir) / pdb_id[1:3]


def read_dicts_file(path: str | os.PathLike) -> dict:
    """A dicts file's {pdb_id: mmcif_dict}, its atoms still compressed (loads_builtins; a
    refused or damaged pickle is one KitError naming the file)."""
    path = Path(path)
    raw = read_bytes(path, str(path))
    try:
        value = loads_builtins(raw)
    except PickleRefused as e:
        raise KitError(f"{path}: refused: the pickle names {e}, which the reference's mmCIF dicts do not hold "
                       "(builtin dicts, lists, strings, numbers and bytes only); nothing in it was run") from None
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, OverflowError, UnicodeDecodeError,
            EOFError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise KitError(f"{path}: not a pickle of the reference's mmCIF dicts ({first})") from None
    if type(value) is not dict:
        raise KitError(f"{path}: holds a {type(value).__name__}, not the reference's dict of mmCIF entries")
    return value


# The atoms an entry's chains inflate to (docs/security.md "Bounds"): a chain's arrays take
# 37 x 3 float32 and 37 bools a residue (481 bytes); the longest protein chains of the PDB are
# some thousands of residues (full viral polyproteins about 7,000) and its largest entries some
# hundred thousand residues in all (the HIV capsid 3J3Q: 1,356 chains of 231). Beyond these an
# entry is refused before a byte is inflated: a few MB of zlib and one sequence shared through
# the memo by a thousand chains asked for 4 GB.
MAX_CHAIN_RESIDUES = 1 << 16
MAX_ENTRY_RESIDUES = 1 << 21      # 1 GiB of atom arrays inflated at most
MAX_RESOLUTION = 1000.0           # A; the PDB's lowest resolutions are some tens of A


def _decompress(blob, shape, dtype, where: str) -> np.ndarray:
    """One array compress_mmcif_dict_atoms wrote (mmcif.py:210-230: zlib of its bytes, and its
    shape), inflated as decompress_mmcif_dict_atoms does (mmcif.py:233-257), to no more bytes
    than the shape says (a damaged or hostile blob never inflates past them)."""
    need = math.prod(shape) * np.dtype(dtype).itemsize   # check_entry bounded the shape
    try:
        inflater = zlib.decompressobj()
        data = inflater.decompress(blob, need + 1)
        complete = inflater.eof
    except zlib.error as e:
        raise KitError(f"{where}: not zlib-compressed data ({e})") from None
    if len(data) != need or not complete:
        raise KitError(f"{where}: holds {'more than ' if len(data) > need else ''}{len(data)} bytes"
                       f"{'' if complete or len(data) > need else ' (cut short)'}, its shape {tuple(shape)} "
                       f"needs {need}")
    return np.frombuffer(data, dtype=np.uint8 if dtype is bool else dtype).reshape(shape).copy()


def check_entry(entry, pdb_id: str, where: str) -> None:
    """One mmcif_dict as preprocess_pdb_mmcif.py writes it (mmcif.py:196-206, atoms compressed),
    its atom arrays not yet inflated: the keys and types, the chains of sequences and atoms
    those of author_chain_ids, each chain's arrays shaped (L, 37, 3) and (L, 37) for its L
    residues (mmcif.py:548-553 asserts it when the dicts are made)."""
    if type(entry) is not dict:
        raise KitError(f"{where}: a {type(entry).__name__}, not an mmCIF dict")
    for key, kind in _ENTRY_KEYS.items():
        if key not in entry:
            raise KitError(f"{where}: no '{key}'")
        if isinstance(entry[key], bool) or not isinstance(entry[key], kind):
            raise KitError(f"{where}: '{key}' is a {type(entry[key]).__name__}")
    if entry["pdb_id"] != pdb_id:
        raise KitError(f"{where}: its pdb_id is {describe(entry['pdb_id'], 20)}")
    if not _check_date(entry["release_date"]):
        raise KitError(f"{where}: release_date {describe(entry['release_date'])} is not a date YYYY-MM-DD")
    resolution = entry["resolution"]    # mmcif.py:_get_resolution: a float, nan where none is recorded
    if not (type(resolution) is float and math.isnan(resolution)) and not (
            (type(resolution) is float or (type(resolution) is int and resolution.bit_length() <= 64))
            and 0 <= resolution <= MAX_RESOLUTION):
        raise KitError(f"{where}: resolution {describe(resolution)} is not a resolution in A (0 to {MAX_RESOLUTION:g}, "
                       "or nan: none recorded)")
    authors = entry["author_chain_ids"]
    if not all(type(a) is str for a in authors) or len(set(authors)) != len(authors):
        raise KitError(f"{where}: author_chain_ids is not a list of distinct chain ids")
    for key in ("entity_id_to_mmcif_chain_ids", "mmcif_chain_id_to_author_chain_id"):
        for k, v in entry[key].items():
            ok = type(k) is str and (type(v) is str if key.endswith("author_chain_id")
                                     else type(v) is list and all(type(c) is str for c in v))
            if not ok:
                raise KitError(f"{where}: {key} is not a mapping of chain ids")
    sequences, atoms = entry["sequences"], entry["atoms"]
    if set(sequences) != set(authors) or set(atoms) != set(authors):
        raise KitError(f"{where}: sequences and atoms are not of the chains author_chain_ids names")
    residues = 0
    for chain in authors:
        seq = sequences[chain]
        if type(seq) is not str or not seq.isascii() or not seq.isalpha():
            raise KitError(f"{where} chain {describe(chain, 8)}: its sequence is not one-letter codes")
        if len(seq) > MAX_CHAIN_RESIDUES:
            raise KitError(f"{where} chain {describe(chain, 8)}: {len(seq)} residues, more than the {MAX_CHAIN_RESIDUES} "
                           "a chain is read with")
        residues += len(seq)
        if residues > MAX_ENTRY_RESIDUES:
            raise KitError(f"{where}: its chains hold more than the {MAX_ENTRY_RESIDUES} residues an entry is read with "
                           f"(their atoms would inflate to more than {MAX_ENTRY_RESIDUES * 481 >> 20} MiB)")
        arrays = atoms[chain]
        if type(arrays) is not dict or set(arrays) != {"all_atom_positions", "all_atom_mask"}:
            raise KitError(f"{where} chain {describe(chain, 8)}: atoms is not all_atom_positions and all_atom_mask")
        for name, shape in (("all_atom_positions", (len(seq), ATOM_TYPE_NUM, 3)),
                            ("all_atom_mask", (len(seq), ATOM_TYPE_NUM))):
            value = arrays[name]
            if not (type(value) is tuple and len(value) == 2 and type(value[0]) is bytes
                    and type(value[1]) is tuple):
                raise KitError(f"{where} chain {describe(chain, 8)}: {name} is not (zlib bytes, shape)")
            got = value[1]     # compared item by item, each an int of few bits, never hashed or shown whole
            if len(got) != len(shape) or not all(type(n) is int and n == m for n, m in zip(got, shape)):
                shown = (f"({', '.join(describe(n, 12) for n in got)})" if len(got) <= 4 else describe(got))
                raise KitError(f"{where} chain {describe(chain, 8)}: {name} has shape {shown}, its "
                               f"{len(seq)} residues make {shape}")


def decompress_atoms(entry: dict, where: str) -> dict:
    """{author chain: {"all_atom_positions": float32 (L, 37, 3), "all_atom_mask": bool (L, 37)}}
    of a checked entry (decompress_mmcif_dict_atoms, mmcif.py:233-257), positions finite and
    the mask's bytes 0 or 1."""
    out = {}
    for chain, arrays in entry["atoms"].items():
        w = f"{where} chain {chain}"
        pos = _decompress(*arrays["all_atom_positions"], np.float32, f"{w} all_atom_positions")
        mask = _decompress(*arrays["all_atom_mask"], bool, f"{w} all_atom_mask")
        if not np.isfinite(pos).all():
            raise KitError(f"{w} all_atom_positions: holds a non-finite coordinate")
        if mask.size and mask.max() > 1:
            raise KitError(f"{w} all_atom_mask: holds a byte that is not a bool")
        out[chain] = {"all_atom_positions": pos, "all_atom_mask": mask.view(bool)}
    return out


def load_mmcif_dict(dicts_dir: str | os.PathLike, pdb_id: str) -> dict:
    """The mmcif_dict of `pdb_id`, as load_mmcif_dict returns it (mmcif.py:135-143): the entry
    of the dicts file named after its middle characters, its atoms inflated to arrays. The file
    is read and checked whole on every call, as the reference reads it on every sample."""
    path = dicts_file(dicts_dir, pdb_id)
    entries = read_dicts_file(path)
    where = f"{path} key '{pdb_id}'"
    if pdb_id not in entries:
        raise KitError(f"{where}: no such entry (chains.csv names it)")
    entry = entries[pdb_id]
    check_entry(entry, pdb_id, where)
    return {**entry, "atoms": decompress_atoms(entry, where)}


# ----------------------------------------------------------------- alignments

# Bounds of the alignments (docs/security.md "Bounds"). OpenProteinSet's entries hold four files
# (uniref90_hits.a3m, bfd_uniclust_hits.a3m, mgnify_hits.a3m, pdb70_hits.hhr); its largest a3m
# files are some hundred MB; jackhmmer and hhblits write up to some ten thousand sequences
# (uniref90 at most 10,000, mgnify 5,000), hhsearch alignment lines of 80 residues and
# descriptions of some hundred characters. Each bound is far above these, and each is checked
# before the work it bounds (a range before it is read, the lines before they are split).
MAX_ENTRY_FILES = 16               # files of one super.index entry
MAX_ENTRY_BYTES = MAX_INPUT_BYTES  # 1 GiB: one entry's files together (each range disjoint from the others)
MAX_FILE_NAME = 255                # characters of a file name in an entry
MAX_ALIGNMENT_LINES = 1 << 22      # lines of one a3m or hhr file
MAX_A3M_LINE = 1 << 20             # characters of one a3m line (a whole sequence with its insertions)
MAX_A3M_SEQUENCES = 1 << 20        # sequences of one a3m file
MAX_HHR_LINE = 1 << 16             # characters of one hhr line
MAX_HHR_NUMBER = 18                # digits of a number in an hhr (a hit's number, a residue index)
# what str.splitlines breaks lines at (as the reference's parsers split): counted before splitting
_LINE_BREAKS = ("\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")


def split_lines(text: str, where: str, max_line: int) -> list[str]:
    """text.splitlines(), refused (one KitError naming `where`) where it would make more than
    MAX_ALIGNMENT_LINES lines (counted before the list is made: a file of line breaks alone would
    be a list of a billion strings) or a line longer than `max_line` characters."""
    breaks = sum(text.count(c) for c in _LINE_BREAKS)   # "\r\n" counted twice: a bound, not the count
    if breaks > MAX_ALIGNMENT_LINES:
        raise KitError(f"{where}: more than {MAX_ALIGNMENT_LINES} lines (an alignment file is read to that many)")
    lines = text.splitlines()
    if lines and max(map(len, lines)) > max_line:
        n = next(i for i, line in enumerate(lines, 1) if len(line) > max_line)
        raise KitError(f"{where} line {n}: {len(lines[n - 1])} characters, more than the {max_line} a line of this "
                       "file is read to")
    return lines


class AlignmentIndex:
    """The alignments' super index (load_alignments_super_index, alignments.py:20-34: JSON
    {pdb_chain_id: {"db": shard file name, "files": [[file name, start, size], ...]}}, written
    by preprocess_open_protein_set.py:479-512,614-625: each chain's OpenProteinSet files
    concatenated into its shard, chains with identical sequences sharing one entry) and the
    shards beside it. `load(key)` reads an entry's files as load_alignments does
    (alignments.py:37-51), each entry checked when it is first used."""

    def __init__(self, alignments_dir: str | os.PathLike):
        self.dir = Path(alignments_dir)
        self.path = self.dir / SUPER_INDEX
        index = read_json(self.path, str(self.path))
        if type(index) is not dict:
            raise KitError(f"{self.path}: holds a {type(index).__name__}, not the reference's JSON object of "
                           "pdb_chain_id -> {db, files}")
        self.entries: dict = index

    def __contains__(self, key) -> bool:
        return key in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def keys(self):
        return self.entries.keys()

    def shard_path(self, db, where: str) -> Path:
        """The shard `db` names, refused unless it is a file inside the alignments directory:
        not absolute, no '..', no symbolic link that leads out of it."""
        if type(db) is not str or not db or "\x00" in db:
            raise KitError(f"{where}: its db {db!r:.60} is not a shard file name")
        if os.path.isabs(db) or PurePosixPath(db).is_absolute() or ".." in PurePosixPath(db).parts:
            raise KitError(f"{where}: its db {db!r:.80} is a path out of {self.dir} (refused: the index names "
                           "shards inside its own directory)")
        base = os.path.realpath(self.dir)
        real = os.path.realpath(self.dir / db)
        if os.path.commonpath([base, real]) != base:
            raise KitError(f"{where}: its db {db!r:.80} leads out of {self.dir} through a symbolic link (refused)")
        return self.dir / db

    def entry(self, key: str) -> tuple[Path, list[tuple[str, int, int]]]:
        """(shard, [(file name, start, size), ...]) of `key`, checked; KitError naming the index
        and the key."""
        where = f"{self.path} key '{key}'"
        if key not in self.entries:
            raise KitError(f"{where}: no such entry")
        value = self.entries[key]
        if type(value) is not dict or "db" not in value or "files" not in value or type(value["files"]) is not list:
            raise KitError(f"{where}: not an entry {{\"db\": ..., \"files\": [[name, start, size], ...]}}")
        shard = self.shard_path(value["db"], where)
        if len(value["files"]) > MAX_ENTRY_FILES:
            raise KitError(f"{where}: {len(value['files'])} files, more than the {MAX_ENTRY_FILES} an entry is read "
                           "with (the reference's have four)")
        files, names, total = [], set(), 0
        for i, item in enumerate(value["files"]):
            ok = (type(item) is list and len(item) == 3 and type(item[0]) is str and item[0]
                  and len(item[0]) <= MAX_FILE_NAME and all(type(n) is int and 0 <= n <= 1 << 62 for n in item[1:]))
            if not ok:
                raise KitError(f"{where}: files[{i}] is not [file name, start >= 0, size >= 0]")
            if item[0] in names:
                raise KitError(f"{where}: files[{i}] names {describe(item[0], 60)} again")
            names.add(item[0])
            total += item[2]
            if total > MAX_ENTRY_BYTES:
                raise KitError(f"{where}: its files hold more than the {MAX_ENTRY_BYTES} bytes one entry's alignments "
                               "are read to")
            files.append((item[0], item[1], item[2]))
        spans = sorted((start, start + size, name) for name, start, size in files if size)
        for (_, end, name), (start, _, other) in zip(spans, spans[1:]):
            if start < end:    # the preprocessing concatenates each file once: an entry's ranges are disjoint
                raise KitError(f"{where}: files {describe(name, 60)} and {describe(other, 60)} overlap in the shard "
                               f"(bytes {start} to {end}; the reference's entries hold each byte once)")
        return shard, files

    def load(self, key: str) -> dict[str, str]:
        """{file name: its text} of `key`'s entry: each byte range checked against the shard's
        size before it is read (pread; a shard that shrinks meanwhile is a short read, refused);
        KitError naming the shard, the index and the key."""
        shard, files = self.entry(key)
        fd, st = rawread.open_regular(shard)
        try:
            out = {}
            for name, start, size in files:
                end = start + size
                if end > st.st_size:
                    raise KitError(f"{shard}: {st.st_size} bytes, but {self.path} key '{key}' puts {name} at bytes "
                                   f"{start} to {end} (a truncated shard, or a damaged index)")
                buf = bytearray(size)
                rawread.read_into(fd, shard, rawread.Extent(start, np.dtype(np.uint8), (size,)),
                                  np.frombuffer(buf, dtype=np.uint8), f"{name} of {key}")
                try:
                    out[name] = buf.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise KitError(f"{shard}: {name} of {self.path} key '{key}' is not UTF-8 text (byte "
                                   f"{start + e.start} of the shard)") from None
            return out
        finally:
            os.close(fd)

    def check_all(self) -> None:
        """Every entry checked (shard inside the directory, ranges within the shard's size):
        what `load` checks, for all keys, without reading the alignments."""
        sizes: dict[Path, int] = {}
        for key in self.entries:
            shard, files = self.entry(key)
            if shard not in sizes:
                fd, st = rawread.open_regular(shard)
                os.close(fd)
                sizes[shard] = st.st_size
            for name, start, size in files:
                if start + size > sizes[shard]:
                    raise KitError(f"{shard}: {sizes[shard]} bytes, but {self.path} key '{key}' puts {name} at "
                                   f"bytes {start} to {start + size} (a truncated shard, or a damaged index)")


# ----------------------------------------------------------------- a3m and hhr

def parse_fasta(text: str, where: str) -> tuple[list[str], list[str]]:
    """(sequences, descriptions) as parse_fasta reads them (parsers.py:42-71): stripped lines,
    '>' starts a sequence, '#' lines and blank lines skipped. A sequence line before the first
    '>' (an IndexError there) is one KitError naming `where`."""
    sequences, descriptions = [], []
    parts: list[str] | None = None     # the lines of the sequence being read, joined once (linear time)
    for n, line in enumerate(split_lines(text, where, MAX_A3M_LINE), 1):
        line = line.strip()
        if line.startswith(">"):
            if parts is not None:
                sequences.append("".join(parts))
            if len(descriptions) >= MAX_A3M_SEQUENCES:
                raise KitError(f"{where} line {n}: more than {MAX_A3M_SEQUENCES} sequences (an alignment is read "
                               "to that many)")
            descriptions.append(line[1:])
            parts = []
        elif line.startswith("#") or not line:
            continue
        elif parts is None:
            raise KitError(f"{where} line {n}: a sequence before the first '>' header")
        else:
            parts.append(line)
    if parts is not None:
        sequences.append("".join(parts))
    return sequences, descriptions


_LOWER = str.maketrans("", "", string.ascii_lowercase)
_INSERTIONS = re.compile(r"[a-z]+")     # one class run: matched once where it starts, never backtracked


def parse_a3m(text: str, where: str) -> tuple[list[str], list[list[int]]]:
    """(aligned sequences, deletion matrix) as parse_a3m computes them (parsers.py:135-167):
    lower-case letters are insertions, counted into the deletion matrix at the next aligned
    column and removed. Checked as create_msa_features will use them (features.py:139-157): at
    least one sequence, every aligned sequence as long as the first (the query), every letter
    in hhblits' alphabet; else one KitError naming `where` and the sequence."""
    sequences, descriptions = parse_fasta(text, where)
    if not sequences:
        raise KitError(f"{where}: no sequence (an a3m file starts with its query)")
    deletion_matrix, aligned = [], []
    for i, seq in enumerate(sequences):
        residues = seq.translate(_LOWER)
        if seq.isascii():   # str.islower is a-z here: each run of insertions counted into the column after it
            row = [0] * len(residues)
            removed = 0
            for m in _INSERTIONS.finditer(seq):
                start, end = m.span()
                if start - removed < len(row):   # a run after the last residue counts into no column
                    row[start - removed] = end - start
                removed += end - start
        else:
            row, count = [], 0
            for c in seq:
                if c.islower():
                    count += 1
                else:
                    row.append(count)
                    count = 0
        deletion_matrix.append(row)
        aligned.append(residues)
    width = len(aligned[0])
    for i, seq in enumerate(aligned):
        if len(seq) != width:
            raise KitError(f"{where} sequence {i} ({describe(descriptions[i])}): {len(seq)} aligned columns, the "
                           f"query has {width}")
        bad = set(seq) - HHBLITS_AA_TO_ID.keys()
        if bad:
            raise KitError(f"{where} sequence {i} ({describe(descriptions[i])}): {sorted(bad)[0]!r} is not in "
                           "hhblits' alphabet")
    return aligned, deletion_matrix


@dataclass(frozen=True)
class TemplateHit:
    """One hit of an hhr file (parsers.py:28-39)."""
    index: int
    name: str
    aligned_cols: int
    sum_probs: float
    query: str
    hit_sequence: str
    indices_query: list
    indices_hit: list


# The reference reads an hhr with three regular expressions (parsers.py:274-279, 310, 336) whose
# greedy groups backtrack: its summary line's eight `(.*)` made a 3.7 KB line take hours, its
# alignment lines' runs of blanks are quadratic. The kit finds the same groups without a
# regular expression that can backtrack (each helper below says how it matches the reference's
# result), in time linear in the line, on lines of at most MAX_HHR_LINE characters.
_SUMMARY_START = "Probab="
# the literals between the summary's eight groups; the fifth is '%', blanks, 'Similarity='
_SUMMARY_KEYS = ("E-value=", "Score=", "Aligned_cols=", "Identities=", "Similarity=", "Sum_probs=", "Template_Neff=")
_DIGITS = re.compile(r"[0-9]*")       # single runs of one class: matched once, never backtracked
_BLANKS = re.compile(r"[\t ]*")
_RESIDUES = re.compile(r"[A-Z-]*")


def _hhr_summary(line: str) -> list[str] | None:
    """The eight groups of the reference's summary pattern ("Probab=(.*)[\\t ]*E-value=(.*)...
    Template_Neff=(.*)", re.match), or None where it does not match. Its greedy groups take the
    last place of each literal that leaves room for the ones after it; so, from the right: the
    last 'Template_Neff=', the last 'Sum_probs=' before it, ..., the last 'E-value=' before
    'Score=', each found with str.rfind (the `[\\t ]*` before each literal matches nothing:
    the group before it takes the blanks; only '%' and 'Similarity=' have blanks between them
    that no group takes)."""
    if not line.startswith(_SUMMARY_START):
        return None
    lo = len(_SUMMARY_START)
    hi = len(line)
    cuts: list[tuple[int, int]] = []     # (where the group before a literal ends, where the next group starts)
    for key in reversed(_SUMMARY_KEYS):
        at = line.rfind(key, lo, hi)
        if key == "Similarity=":     # '%' [\t ]* 'Similarity=': the last whose '%' stands before its blanks
            while at >= 0:
                j = at
                while j > lo and line[j - 1] in "\t ":
                    j -= 1
                if j > lo and line[j - 1] == "%":
                    break
                at = line.rfind(key, lo, at + len(key) - 1)
            if at < 0:
                return None
            cuts.append((j - 1, at + len(key)))
            hi = j - 1
            continue
        if at < 0:
            return None
        cuts.append((at, at + len(key)))
        hi = at
    cuts.reverse()
    groups, start = [], lo
    for end, nxt in cuts:
        groups.append(line[start:end])
        start = nxt
    groups.append(line[start:])
    return groups


def _hhr_alignment_line(text: str, template: bool) -> tuple[str, str, str | None] | None:
    """(start, residues, end) of a Q line's text after its 17 characters of label and name, as
    the reference's `[\\t ]*([0-9]*) ([A-Z-]*)[\\t ]*([0-9]*) \\([0-9]*\\)` gives them where its
    start and end are numbers (the only results the reference can use: it takes int() of both);
    for a T line (`template`, the end not captured: `[\\t ]*([0-9]*) ([A-Z-]*)[\\t ]*[0-9]*
    \\([0-9]*\\)`), (start, residues, None) where the start is a number. None where the
    reference's match fails or yields an empty number. Blanks, digits and residues are disjoint
    classes, so a match with the numbers it needs takes each run whole, and that is the first
    match the pattern's backtracking finds; the one exception, a T line whose end is absent, is
    the blank before '(' taken by the literal space."""
    i = _BLANKS.match(text).end()
    j = _DIGITS.match(text, i).end()
    if j == i or text[j:j + 1] != " ":
        return None
    start = text[i:j]
    k = _RESIDUES.match(text, j + 1).end()
    residues = text[j + 1:k]
    m = _BLANKS.match(text, k).end()
    n = _DIGITS.match(text, m).end()
    end = text[m:n]
    if end:
        at = n
    elif template and m > k and text[m - 1] == " ":
        at = m - 1                    # `[0-9]*` empty, the last blank the literal ' '
    else:
        return None
    if text[at:at + 2] != " (":
        return None
    close = _DIGITS.match(text, at + 2).end()
    if text[close:close + 1] != ")":
        return None
    return start, residues, (end if not template else None)


def _hhr_int(text: str, where: str, what: str) -> int:
    """int(text) of a number the hhr holds (ASCII digits, as the reference's patterns take them),
    of at most MAX_HHR_NUMBER digits."""
    if len(text) > MAX_HHR_NUMBER:
        raise KitError(f"{where}: {what} has {len(text)} digits (a residue index or hit number has at most "
                       f"{MAX_HHR_NUMBER})")
    return int(text)


def _hhr_indices(sequence: str, start: int, out: list) -> None:
    """parsers.py:240-251: -1 at a gap, else the residue's index counting from `start`."""
    for symbol in sequence:
        if symbol == "-":
            out.append(-1)
        else:
            out.append(start)
            start += 1


def _parse_hhr_hit(lines: list[str], where: str) -> TemplateHit:
    """One hit's detailed section, as _parse_hhr_hit reads it (parsers.py:254-355): 'No <n>',
    '>name', the summary line, then the Q and T alignment lines (17 characters of label and
    name, then start, residues, end and length); the reference's RuntimeErrors, ValueErrors and
    asserts are KitErrors naming `where`, and so are an aligned_cols or sum_probs that is not a
    finite number (the reference's int() fails on the one, the other would order the hits and
    stand in the template features as NaN)."""
    if len(lines) < 3:
        raise KitError(f"{where}: the hit's section has {len(lines)} lines (No, >name and the summary at least)")
    words = lines[0].split()
    try:
        if len(words[-1]) > MAX_HHR_NUMBER:
            raise ValueError
        number = int(words[-1])
    except (ValueError, IndexError):
        raise KitError(f"{where}: {describe(lines[0])} does not end with the hit's number") from None
    name = lines[1][1:]
    groups = _hhr_summary(lines[2])
    if groups is None:
        raise KitError(f"{where}: {describe(lines[2], 60)} is not the hit's summary line (Probab=... Template_Neff=...)")
    try:
        _prob, _evalue, _score, aligned_cols, _ident, _sim, sum_probs, _neff = (float(x) for x in groups)
    except ValueError:
        raise KitError(f"{where}: the summary line {describe(lines[2], 60)} holds a value that is not a number") \
            from None
    for key, value in (("Aligned_cols", aligned_cols), ("Sum_probs", sum_probs)):
        if not math.isfinite(value):
            raise KitError(f"{where}: the summary line's {key} is {value}, not a finite number")
    query, hit, indices_query, indices_hit = [], [], [], []
    block = None
    for n, line in enumerate(lines[3:], 4):
        if line.startswith("Q ") and not line.startswith(("Q ss_dssp", "Q ss_pred", "Q Consensus")):
            parsed = _hhr_alignment_line(line[17:], template=False)
            if parsed is None:
                raise KitError(f"{where} line {n}: cannot parse the query line {describe(line, 60)}")
            start = _hhr_int(parsed[0], f"{where} line {n}", "the query line's start") - 1
            delta = parsed[1]
            end = _hhr_int(parsed[2], f"{where} line {n}", "the query line's end")
            block = end - start + delta.count("-")
            if block != len(delta):
                raise KitError(f"{where} line {n}: the query line's residues do not span {start + 1} to {end}")
            query.append(delta)
            _hhr_indices(delta, start, indices_query)
        elif line.startswith("T ") and not line.startswith(("T ss_dssp", "T ss_pred", "T Consensus")):
            parsed = _hhr_alignment_line(line[17:], template=True)
            if parsed is None:
                raise KitError(f"{where} line {n}: cannot parse the template line {describe(line, 60)}")
            delta = parsed[1]
            if block != len(delta):
                raise KitError(f"{where} line {n}: the template line's residues are not as many as its query "
                               "line's")
            hit.append(delta)
            _hhr_indices(delta, _hhr_int(parsed[0], f"{where} line {n}", "the template line's start") - 1,
                         indices_hit)
    return TemplateHit(number, name, int(aligned_cols), sum_probs, "".join(query), "".join(hit), indices_query,
                       indices_hit)


def parse_hhr(text: str, where: str) -> list[TemplateHit]:
    """The hits of an hhr file, as parse_hhr finds them (parsers.py:358-373): each paragraph
    from a line starting 'No ' to the next; the file's lines bounded first (split_lines)."""
    lines = split_lines(text, where, MAX_HHR_LINE)
    starts = [i for i, line in enumerate(lines) if line.startswith("No ")]
    starts.append(len(lines))
    return [_parse_hhr_hit(lines[a:b], f"{where} hit at line {a + 1}") for a, b in zip(starts, starts[1:])]


# ----------------------------------------------------------------- the training set

def is_aa_frequency_acceptable(sequence: str, max_aa_frequency: float = 0.8) -> bool:
    """datasets.py:364-371: no residue type more frequent than `max_aa_frequency`."""
    if not sequence:
        return False
    return Counter(sequence).most_common(1)[0][1] / len(sequence) <= max_aa_frequency


def filter_for_training(chains: list[Chain], min_release_date: str = "1900-01-01",
                        max_release_date: str = "2999-12-31", max_resolution: float = 9.0,
                        max_aa_frequency: float = 0.8) -> list[Chain]:
    """_filter_pdb_chains_for_training (datasets.py:331-361, supplement 1.2.5): released between
    the dates (inclusive, compared as the strings they are), resolution below `max_resolution`
    or none, no residue type above `max_aa_frequency`, in a cluster (pdb_cluster_id != -1); in
    the file's order."""
    return [c for c in chains
            if min_release_date <= c.release_date <= max_release_date
            and (math.isnan(c.resolution) or c.resolution < max_resolution)
            and is_aa_frequency_acceptable(c.sequence, max_aa_frequency)
            and c.pdb_cluster_id != -1]


def with_cluster_sizes(chains: list[Chain]) -> list[Chain]:
    """_compute_pdb_cluster_size (datasets.py:503-512): each chain's pdb_cluster_size, the number
    of the given chains in its cluster (0 for -1, no cluster)."""
    counts = Counter(c.pdb_cluster_id for c in chains)
    counts[-1] = 0
    return [replace(c, pdb_cluster_size=counts[c.pdb_cluster_id]) for c in chains]


def sampling_weight(chain: Chain) -> float:
    """_get_weight (datasets.py:374-386, supplement 1.2.5): max(min(L, 512), 256) / 512, divided
    by the square root of the cluster's size when it has one."""
    if chain.pdb_cluster_size is None:
        raise ValueError("sampling_weight needs pdb_cluster_size (with_cluster_sizes)")
    weight = max(min(chain.sequence_length, 512), 256) / 512
    if chain.pdb_cluster_size > 0:
        weight *= 1 / math.sqrt(chain.pdb_cluster_size)
    return weight


def sampler_weights(chains: list[Chain]) -> list[float]:
    """InitialTrainingDataset.get_sampler_weights (datasets.py:233-238), one per chain in order."""
    return [sampling_weight(c) for c in chains]


def _restrict(chains: list[Chain], use_only: list[str] | None) -> list[Chain]:
    if use_only is None:
        return chains
    keep = set(use_only)
    return [c for c in chains if c.pdb_chain_id in keep]


def check_alignments(chains: list[Chain], index: AlignmentIndex, filter_by_alignments: bool) -> list[Chain]:
    """_filter_by_alignments / _assert_pdb_alignments (datasets.py:467-488): with the flag, the
    chains the index has; without, every chain must have an entry (the reference's RuntimeError:
    one KitError naming the index, how many are missing and the first)."""
    if filter_by_alignments:
        return [c for c in chains if c.pdb_chain_id in index]
    missing = [c.pdb_chain_id for c in chains if c.pdb_chain_id not in index]
    if missing:
        raise KitError(f"{index.path}: has no alignments for {len(missing)} of the chains selected from chains.csv "
                       f"(the first: {missing[0]}); the reference's --filter_by_alignments leaves them out")
    return chains


def training_chains(chains: list[Chain], index: AlignmentIndex,
                    max_release_date: str = TRAIN_MAX_PDB_RELEASE_DATE, filter_by_alignments: bool = False,
                    use_only_pdb_chain_ids: list[str] | None = None) -> list[Chain]:
    """InitialTrainingDataset's samples (datasets.py:164-205): the filtered chains (released from
    1900-01-01 to `max_release_date`), restricted to `use_only_pdb_chain_ids`, checked or
    filtered against the alignments, then their cluster sizes; the sample index is the position
    in this list."""
    selected = filter_for_training(chains, "1900-01-01", max_release_date)
    selected = _restrict(selected, use_only_pdb_chain_ids)
    selected = check_alignments(selected, index, filter_by_alignments)
    return with_cluster_sizes(selected)


def seed_from_string(text: str) -> int:
    """get_seed_from_string (helpers.py:44-48): 64 random bits of random.Random(text)."""
    return random.Random(text).getrandbits(64)


def training_sampler_seed(seed: int) -> int:
    """The seed train.py gives the training sampler (train.py:677)."""
    return seed_from_string(f"initial_training_sampler_{seed}")


def training_index_seed_pairs(weights: list[float], num_train_iters: int, local_batch_size: int,
                              global_batch_size: int, seed: int, rank: int | None = None,
                              world_size: int | None = None, num_prev_iters: int = 0) -> list[tuple[int, int]]:
    """InitialTrainingSampler's (index, seed) pairs (samplers.py:28-78): num_train_iters x
    global_batch_size indices drawn with replacement by torch.multinomial over the float64
    weights, and as many sample seeds by torch.randint(0, 2**63 - 1), each from a generator
    seeded with `seed`; a rank takes every world_size-th pair from its own, and skips the
    iterations already done."""
    import torch
    if num_prev_iters > num_train_iters:
        raise ValueError("num_prev_iters > num_train_iters")
    if world_size is not None and global_batch_size % world_size:
        raise ValueError("global_batch_size is not a multiple of world_size")
    n = num_train_iters * global_batch_size
    gen = torch.Generator()
    gen.manual_seed(seed)
    indices = torch.multinomial(torch.tensor(weights, dtype=torch.float64), n, replacement=True, generator=gen)
    gen = torch.Generator()
    gen.manual_seed(seed)
    seeds = torch.randint(0, 2 ** 63 - 1, [n], generator=gen)
    pairs = list(zip(indices.tolist(), seeds.tolist()))
    if world_size is not None:
        pairs = pairs[rank::world_size]
    return pairs[num_prev_iters * local_batch_size:]


# ----------------------------------------------------------------- the CAMEO validation set

# The CAMEO targets the reference validates on, by submission date (hpc@2c627d4
# openfold/openfold/data/cameo_targets.py:15-230, from cameo3d.org's 3-month list to 2021-12-11):
# "pdb_id[chain]", the chain an mmCIF (label) chain id, occasionally an author chain id.
_CAMEO_TEXT = """
2021-09-18: 7bgg[A] 7bly[A] 7cz9[B] 7d2w[A] 7e6g[A] 7jta[A] 7jua[A] 7ksn[A] 7lm0[A] 7m1w[A] 7o86[A] 7rih[B] 7rij[A]
    7s3u[A] 7s5n[B]
2021-09-25: 7ba4[A] 7czo[A] 7dg7[A] 7dg9[A] 7dlw[B] 7du6[A] 7du7[A] 7dvr[A] 7dxs[C] 7dxv[B] 7dxw[A] 7e24[D] 7e57[C]
    7k3s[A] 7ltc[A] 7mbf[A] 7mj0[C]
2021-10-02: 7a59[B] 7a73[A] 7aao[A] 7agj[A] 7aj6[L] 7bmu[A] 7bsx[A] 7d3y[A] 7d50[B] 7e4m[A] 7jyp[A] 7n79[A] 7ny0[A]
    7og3[A] 7p01[A] 7sbc[C]
2021-10-09: 7d6l[A] 7d8r[A] 7d8s[A] 7jrk[A] 7p2f[A] 7pmu[A] 7r65[A] 7rk1[C] 7rk2[C] 7s6e[B]
2021-10-16: 7amc[A] 7da9[A] 7dah[E] 7dnm[B] 7eea[A] 7eft[B] 7kgc[A] 7nmb[A] 7o62[B] 7p1b[C] 7p1v[A] 7rrm[C] 7s13[C]
    7s13[L] 7sh3[A]
2021-10-23: 7dck[A] 7f17[B] 7msj[A] 7nwz[D] 7nx0[B] 7nx0[E] 7og0[B] 7pkx[A] 7plq[B] 7s6g[A] 7siq[A]
2021-10-30: 7ar0[B] 7cjs[B] 7dcm[A] 7ef6[A] 7et8[A] 7lc5[A] 7ndr[A] 7nl4[A] 7o49[F] 7s6b[A] 7sir[A] 7v1v[A] 7vmu[A]
2021-11-06: 6wmk[A] 6wqc[A] 7au7[A] 7b3a[A] 7bcz[A] 7bhy[A] 7dru[C] 7eqx[A] 7eqx[C] 7esx[A] 7f7n[A] 7fbp[B] 7fe3[A]
    7lew[B] 7mfw[B] 7obm[A] 7ool[A] 7r84[A] 7rwk[A]
2021-11-13: 6xqj[A] 6z01[A] 7atr[A] 7dfe[A] 7dtp[A] 7kik[A] 7kos[A] 7ouq[A] 7p82[C] 7pbk[A] 7q47[A] 7re4[A] 7re6[A]
2021-11-20: 6tf4[A] 7awk[A] 7bcj[A] 7djy[A] 7dk9[A] 7dvn[A] 7kqv[D] 7ls0[B] 7ny6[A] 7plb[B] 7rbw[A] 7vnb[A]
2021-11-27: 7b0d[A] 7e2v[A] 7f6e[B] 7fbh[A] 7fh3[A] 7kiu[A] 7kua[A] 7l6j[A] 7l6y[A] 7lxc[A] 7swh[A] 7swk[B]
2021-12-04: 7b1k[B] 7b1w[F] 7b26[C] 7b28[F] 7b29[A] 7b2a[A] 7b2o[A] 7bny[B] 7dkk[A] 7dko[A] 7dmf[A] 7dms[A] 7lbu[A]
    7ljh[A] 7poh[B] 7ppp[A] 7q03[A]
2021-12-11: 7b4q[A] 7dnu[A] 7e37[A] 7kuw[A] 7kzh[A] 7mfi[A] 7p3t[B] 7q1b[A] 7sf6[A] 7sy9[A] 7t24[A] 7v5y[B] 7vdy[A]
"""


def _cameo_targets() -> dict[str, list[str]]:
    """{submission date: ["7bgg [A]", ...]} in the reference's form and order."""
    targets: dict[str, list[str]] = {}
    date = None
    for line in _CAMEO_TEXT.strip().splitlines():
        if not line.startswith(" "):
            date, line = line.split(":", 1)
            targets[date] = []
        targets[date] += [t.replace("[", " [") for t in line.split()]
    return targets


CAMEO_TARGETS = _cameo_targets()
assert sum(len(v) for v in CAMEO_TARGETS.values()) == 183


def parse_cameo_target(target: str) -> str:
    """_parse_cameo_target (datasets.py:459-464): "7BGG [A]" -> "7bgg_A"."""
    pdb_id, chain = target.split()
    return f"{pdb_id.lower()}_{chain.strip('[]')}"


def pdb_chain_ids_mapping(chains: list[Chain], where: str = "chains.csv") -> dict[str, str]:
    """_get_pdb_chain_ids_mapping (datasets.py:435-456): f"{pdb_id}_{mmcif chain id}" -> the
    chain's pdb_chain_id (author), then each pdb_chain_id to itself where no mmCIF id took it
    (CAMEO targets named by their author chain). The reference asserts an mmCIF chain maps to
    one chain only: a KitError naming `where` here."""
    mapping: dict[str, str] = {}
    for c in chains:
        for mmcif_id in c.mmcif_chain_ids.split(";"):
            key = f"{c.pdb_id}_{mmcif_id}"
            if key in mapping:
                raise KitError(f"{where}: mmCIF chain {key} belongs to two chains ({mapping[key]}, {c.pdb_chain_id})")
            mapping[key] = c.pdb_chain_id
    for c in chains:
        mapping.setdefault(c.pdb_chain_id, c.pdb_chain_id)
    return mapping


def select_cameo_targets(chains: list[Chain], min_submission_date: str, max_submission_date: str,
                         max_sequence_length: int = VAL_MAX_SEQUENCE_LENGTH,
                         targets: dict[str, list[str]] | None = None, where: str = "chains.csv") -> list[Chain]:
    """_select_cameo_targets_for_validation (datasets.py:389-432, supplement 1.11.7): the targets
    submitted between the dates (inclusive) found among the chains by their mmCIF (or author)
    chain id, the first target of a chain kept; the chains in the file's order, at most
    `max_sequence_length` long, each with its cameo_target_id."""
    targets = CAMEO_TARGETS if targets is None else targets
    mapping = pdb_chain_ids_mapping(chains, where)
    selected: dict[str, str] = {}
    for date, ids in targets.items():
        if not min_submission_date <= date <= max_submission_date:
            continue
        for target in ids:
            key = parse_cameo_target(target)
            if key in mapping and mapping[key] not in selected:
                selected[mapping[key]] = target
    return [replace(c, cameo_target_id=selected[c.pdb_chain_id]) for c in chains
            if c.pdb_chain_id in selected and c.sequence_length <= max_sequence_length]


def validation_chains(chains: list[Chain], index: AlignmentIndex,
                      min_submission_date: str = VAL_MIN_CAMEO_SUBMISSION_DATE,
                      max_submission_date: str = VAL_MAX_CAMEO_SUBMISSION_DATE,
                      max_sequence_length: int = VAL_MAX_SEQUENCE_LENGTH, filter_by_alignments: bool = False,
                      use_only_pdb_chain_ids: list[str] | None = None,
                      targets: dict[str, list[str]] | None = None, chains_path: str = "chains.csv") -> list[Chain]:
    """ValidationDataset's samples (datasets.py:262-298): the CAMEO targets among all chains,
    restricted to `use_only_pdb_chain_ids`, checked or filtered against the alignments."""
    selected = select_cameo_targets(chains, min_submission_date, max_submission_date, max_sequence_length,
                                    targets, str(chains_path))
    selected = _restrict(selected, use_only_pdb_chain_ids)
    return check_alignments(selected, index, filter_by_alignments)


def validation_index_seed_pairs(chains: list[Chain], rank: int | None = None,
                                world_size: int | None = None) -> list[tuple[int, int]]:
    """ValidationSampler's (index, seed) pairs (samplers.py:90-135): every sample once, its seed
    from its pdb_chain_id; with ranks, the list padded from its start to a multiple of
    world_size and dealt out rank by rank."""
    seeds = [seed_from_string(c.pdb_chain_id) for c in chains]
    indices = list(range(len(chains)))
    if world_size is not None:
        epoch = math.ceil(len(indices) / world_size)
        padding = epoch * world_size - len(indices)
        padded = indices + (indices * math.ceil(padding / len(indices)) if indices else [])[:padding]
        indices = padded[rank::world_size]
    return [(i, seeds[i]) for i in indices]


# ----------------------------------------------------------------- one sample's records

@dataclass
class SampleRecords:
    """What PDBDataset.__getitem__ reads for one chain before featurising it (datasets.py:78-125):
    the chain's row, its entry's mmcif_dict, its alignment files, the hhr's template hits and
    the three MSAs (parsed; an absent file is the empty string, skipped)."""
    chain: Chain
    mmcif_dict: dict
    alignments: dict[str, str]
    template_hits: list[TemplateHit]
    msas: list[tuple[list[str], list[list[int]]]]
    hits_where: str = TEMPLATE_HITS    # the hhr's place (its shard, index and key), for errors about its hits


def read_sample(chain: Chain, layout: Layout, index: AlignmentIndex) -> SampleRecords:
    """The records of one sample (datasets.py:78-125), each checked: the mmcif_dict has the
    chain, with its sequence; the alignments parse; each MSA's query is as long as the chain."""
    mmcif = load_mmcif_dict(layout.dicts, chain.pdb_id)
    where = f"{dicts_file(layout.dicts, chain.pdb_id)} key '{chain.pdb_id}'"
    if chain.author_chain_id not in mmcif["sequences"]:
        raise KitError(f"{where}: has no chain {chain.author_chain_id} (chains.csv's {chain.pdb_chain_id})")
    if mmcif["sequences"][chain.author_chain_id] != chain.sequence:
        raise KitError(f"{where} chain {chain.author_chain_id}: its sequence is not chains.csv's")
    alignments = index.load(chain.pdb_chain_id)
    shard = index.entry(chain.pdb_chain_id)[0]

    def at(name: str) -> str:
        return f"{shard} ({index.path} key '{chain.pdb_chain_id}', {name})"

    hits = parse_hhr(alignments.get(TEMPLATE_HITS, ""), at(TEMPLATE_HITS))
    msas = []
    for name in MSA_FILES:
        text = alignments.get(name, "")
        if not text:     # create_msa_features skips an empty or absent MSA (features.py:125-127)
            continue
        msa = parse_a3m(text, at(name))
        if len(msa[0][0]) != chain.sequence_length:
            raise KitError(f"{at(name)}: its query has {len(msa[0][0])} aligned columns, the chain "
                           f"{chain.sequence_length} residues")
        msas.append(msa)
    return SampleRecords(chain, mmcif, alignments, hits, msas, at(TEMPLATE_HITS))
