"""A GGUF file's header, read with every size it claims bounded by the file's own size, and checked against the
tensors it holds before any library that trusts it (gguf's reader, transformers' loader) sees the file.

A header is a list of claims: counts of fields and tensors, lengths of strings and arrays, each tensor's shape, type
and offset, and the model's dimensions in its metadata. gguf's reader loops over an array's claimed length even past
the end of the file (an array of 2**60 integers in a 1 KB file never ends), and transformers builds the model that
the metadata describes before it reads a weight (4,096 layers of width 65,536 claimed by a 1 KB file: minutes and
gigabytes). Here a count is taken only if that many of its smallest items fit in what is left of the file, a tensor
only if its bytes (from its shape and type) lie inside the file, and the metadata's layer count, embedding width and
vocabulary only if the tensors present have them.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # what gguf's reader takes
MAX_DIMS = 4  # GGML_MAX_DIMS
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY, UINT32 = 8, 9, 4
SMALLEST = {STRING: 8, ARRAY: 12}  # bytes of the smallest string (its length) and array (item type and count)
DEFAULT_ALIGNMENT = 32
SPECIAL_IDS = ("bos_token_id", "eos_token_id", "padding_token_id", "unknown_token_id")


class Unreadable(ValueError):
    """The file is not a GGUF whose claims fit in it (structure: sizes, counts, offsets)."""


class Inconsistent(ValueError):
    """The header reads, but its metadata does not describe the tensors the file holds."""


@dataclass(frozen=True)
class Tensor:
    name: str
    dims: tuple[int, ...]  # GGUF order: dims[0] is the row width
    type: int
    offset: int  # from the start of the data section
    nbytes: int


@dataclass(frozen=True)
class Header:
    fields: dict  # key -> value (an array as a list)
    types: dict  # key -> value type
    tensors: tuple[Tensor, ...]
    data_offset: int
    size: int

    @property
    def architecture(self) -> str | None:
        value = self.fields.get("general.architecture")
        return value if isinstance(value, str) else None


class _Cursor:
    def __init__(self, buf, order: str):
        self.buf, self.pos, self.order = buf, 0, order

    def need(self, n: int, what: str) -> None:
        if self.pos + n > len(self.buf):
            raise Unreadable(
                f"{what} claims {n:,} bytes at offset {self.pos:,}, past the end of the file ({len(self.buf):,} bytes)"
            )

    def unpack(self, code: str, what: str, count: int = 1) -> tuple:
        size = struct.calcsize(code) * count
        self.need(size, what)
        values = struct.unpack_from(f"{self.order}{count}{code}", self.buf, self.pos)
        self.pos += size
        return values

    def string(self, what: str) -> str:
        (n,) = self.unpack("Q", what)
        self.need(n, what)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise Unreadable(f"{what} is not UTF-8 text") from None

    def value(self, vtype: int, what: str, depth: int = 0):
        if vtype in SCALARS:
            return self.unpack(SCALARS[vtype], what)[0]
        if vtype == STRING:
            return self.string(what)
        if vtype != ARRAY:
            raise Unreadable(f"{what} has an unknown value type {vtype}")
        if depth > 1:
            raise Unreadable(f"{what} nests arrays deeper than two")
        (itype,) = self.unpack("I", what)
        (n,) = self.unpack("Q", what)
        smallest = struct.calcsize(SCALARS[itype]) if itype in SCALARS else SMALLEST.get(itype)
        if smallest is None:
            raise Unreadable(f"{what} is an array of an unknown value type {itype}")
        self.need(n * smallest, f"{what} (an array of {n:,} items)")
        if itype in SCALARS:
            return list(self.unpack(SCALARS[itype], what, n))
        return [self.value(itype, what, depth + 1) for _ in range(n)]


def read(path: Path) -> Header:
    """The header of the GGUF file ``path``, each claim bounded by the file's size; ``Unreadable`` says which does not
    fit. Reads only the header's bytes (the file is mapped, not read)."""
    with open(path, "rb") as fh:
        if fh.read(4) != MAGIC:
            raise Unreadable("GGUF magic invalid")
        size = fh.seek(0, 2)
        if size < 24:
            raise Unreadable(f"{size} bytes: shorter than a GGUF header")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(buf, size)


def _parse(buf, size: int) -> Header:
    order = "<" if struct.unpack_from("<I", buf, 4)[0] & 0xFFFF else ">"  # a version of 0 read: the other byte order
    cur = _Cursor(buf, order)
    cur.pos = 4
    (version,) = cur.unpack("I", "the version")
    if version not in VERSIONS:
        raise Unreadable(f"GGUF version {version}, which gguf does not read (it reads {VERSIONS[0]} and {VERSIONS[1]})")
    tensor_count, kv_count = cur.unpack("Q", "the counts", 2)
    cur.need(kv_count * 13, f"{kv_count:,} metadata fields")  # a key's length, a type, a 1-byte value at least
    fields: dict = {}
    types: dict = {}
    for _ in range(kv_count):
        key = cur.string("a metadata key")
        if key in fields:
            raise Unreadable(f"metadata field {key} appears twice")
        (types[key],) = cur.unpack("I", key)
        fields[key] = cur.value(types[key], f"metadata field {key}")
    cur.need(tensor_count * 24, f"{tensor_count:,} tensors")  # name length, dimensions, type, offset at least
    infos = []
    for _ in range(tensor_count):
        name = cur.string("a tensor name")
        (n_dims,) = cur.unpack("I", name)
        if not 1 <= n_dims <= MAX_DIMS:
            raise Unreadable(f"tensor {name} has {n_dims} dimensions (1 to {MAX_DIMS})")
        dims = cur.unpack("Q", name, n_dims)
        (ggml_type,) = cur.unpack("I", name)
        (offset,) = cur.unpack("Q", name)
        infos.append((name, dims, ggml_type, offset))
    alignment = fields.get("general.alignment", DEFAULT_ALIGNMENT)
    if types.get("general.alignment", UINT32) != UINT32 or not alignment or alignment & (alignment - 1):
        raise Unreadable(f"general.alignment {alignment!r} is not a power of two held as uint32")
    data_offset = -(-cur.pos // alignment) * alignment
    tensors = tuple(_tensor(*info, data_offset, size) for info in infos)
    if len({t.name for t in tensors}) < len(tensors):
        raise Unreadable("two tensors have one name")
    total = sum(t.nbytes for t in tensors)
    if total > size - data_offset:
        raise Unreadable(f"its tensors claim {total:,} bytes where {max(size - data_offset, 0):,} follow its header")
    return Header(fields, types, tensors, data_offset, size)


def _tensor(name: str, dims: tuple, ggml_type: int, offset: int, data_offset: int, size: int) -> Tensor:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise Unreadable(f"tensor {name} has a type gguf does not know ({ggml_type})") from None
    if min(dims) < 1 or dims[0] % block:
        raise Unreadable(f"tensor {name} has the shape {list(dims)}, not rows of whole blocks of {block}")
    count = 1
    for d in dims:
        count *= d
    nbytes = count // block * type_size
    if data_offset + offset + nbytes > size:
        raise Unreadable(
            f"tensor {name} of shape {list(dims)} claims {nbytes:,} bytes at offset {data_offset + offset:,}, past the "
            f"end of the file ({size:,} bytes)"
        )
    return Tensor(name, tuple(dims), ggml_type, offset, nbytes)


def check_model(header: Header) -> None:
    """``Inconsistent`` where the metadata claims a model the tensors do not hold: its layer count, embedding width,
    feed-forward width, vocabulary (and tokenizer) against the tensors present. transformers builds the model the
    metadata describes before it reads a weight, so a claim the tensors do not back costs that model's memory."""
    arch, fields = header.architecture, header.fields
    tensors = {t.name: t for t in header.tensors}
    embd = tensors.get("token_embd.weight")
    if embd is None or len(embd.dims) != 2:
        raise Inconsistent("it holds no token embeddings (a 2-D token_embd.weight)")
    width, rows = embd.dims
    layers = {name.split(".")[1] for name in tensors if name.startswith("blk.")}
    claims = {key: fields.get(f"{arch}.{key}") for key in ("block_count", "embedding_length", "feed_forward_length")}
    for key in ("block_count", "embedding_length"):
        if not isinstance(claims[key], int) or isinstance(claims[key], bool):
            raise Inconsistent(f"it lacks {arch}.{key} (a whole number)")
    if layers != {str(i) for i in range(claims["block_count"])}:
        raise Inconsistent(
            f"it claims {claims['block_count']:,} layers ({arch}.block_count) and holds tensors of {len(layers):,}"
        )
    if claims["embedding_length"] != width:
        raise Inconsistent(
            f"it claims an embedding width of {claims['embedding_length']:,} ({arch}.embedding_length) and its "
            f"token_embd.weight is {width:,} wide"
        )
    ffn = tensors.get("blk.0.ffn_up.weight")
    if (
        isinstance(claims["feed_forward_length"], int)
        and ffn is not None
        and ffn.dims[-1] != claims["feed_forward_length"]
    ):
        raise Inconsistent(
            f"it claims a feed-forward width of {claims['feed_forward_length']:,} ({arch}.feed_forward_length) and "
            f"its blk.0.ffn_up.weight is {ffn.dims[-1]:,} wide"
        )
    for key in ("attention.head_count", "attention.head_count_kv"):
        heads = fields.get(f"{arch}.{key}")
        if isinstance(heads, int) and not 1 <= heads <= width:
            raise Inconsistent(f"it claims {heads:,} attention heads ({arch}.{key}) in a width of {width:,}")
    vocab = fields.get(f"{arch}.vocab_size")
    if vocab is not None and vocab != rows:
        raise Inconsistent(f"it claims a vocabulary of {vocab:,} ({arch}.vocab_size) and embeds {rows:,} tokens")
    _check_tokenizer(fields, rows)


def _check_tokenizer(fields: dict, rows: int) -> None:
    tokens = fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        return
    if not isinstance(tokens, list) or len(tokens) != rows or not all(isinstance(t, str) for t in tokens):
        count = len(tokens) if isinstance(tokens, list) else 1
        raise Inconsistent(f"its tokenizer has {count:,} tokens (tokenizer.ggml.tokens) and it embeds {rows:,}")
    if len(tokens) < 2:  # transformers' GGUF loader reads a list of one as its item
        raise Inconsistent("its tokenizer has a single token, which transformers cannot load")
    for key in ("token_type", "scores"):
        values = fields.get(f"tokenizer.ggml.{key}")
        if values is not None and (not isinstance(values, list) or len(values) != len(tokens)):
            count = len(values) if isinstance(values, list) else 1
            raise Inconsistent(f"tokenizer.ggml.{key} has {count:,} entries for {len(tokens):,} tokens")
    for key in SPECIAL_IDS:
        index = fields.get(f"tokenizer.ggml.{key}")
        if index is not None and (not isinstance(index, int) or not 0 <= index < len(tokens)):
            raise Inconsistent(f"tokenizer.ggml.{key} {index!r} is not a token (the vocabulary has {len(tokens):,})")
    merges = fields.get("tokenizer.ggml.merges")
    if merges is None:
        return
    if not isinstance(merges, list) or len(merges) == 1:  # (read as a string, then split into letters)
        raise Inconsistent("its tokenizer has a single merge (tokenizer.ggml.merges), which transformers cannot load")
    vocab = set(tokens)
    for n, merge in enumerate(merges):
        parts = merge.split(" ") if isinstance(merge, str) else []
        if len(parts) != 2 or not all(parts) or not {*parts, "".join(parts)} <= vocab:
            raise Inconsistent(f"tokenizer.ggml.merges[{n}] ({merge!r}) is not two tokens whose join is a token")
