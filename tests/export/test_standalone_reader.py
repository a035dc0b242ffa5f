"""The torch-only safetensors reader that saved artifacts carry: as strict as the safetensors library, and mapped, not copied."""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch

from aot.export import standalone_runtime
from aot.export.standalone_runtime import read_safetensors

DTYPES = standalone_runtime._SAFETENSORS_DTYPES

# A small valid file: every malformed case below is this file with one fault.
VALID_HEADER = {
    "__metadata__": {"format": "pt"},
    "weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
    "bias": {"dtype": "I16", "shape": [3], "data_offsets": [16, 22]},
}
VALID_DATA = bytes(range(22))


def write_safetensors(
    path: Path, header=None, data: bytes = b"", *, header_bytes: bytes | None = None, header_size: int | None = None
) -> Path:
    """Write a safetensors file by hand: the 8-byte length (``header_size`` if given), the header, the data."""
    encoded = json.dumps(header).encode() if header_bytes is None else header_bytes
    size = len(encoded) if header_size is None else header_size
    path.write_bytes(size.to_bytes(8, "little") + encoded + data)
    return path


def header_of(path: Path) -> tuple[dict, int]:
    """The JSON header of a safetensors file and the offset where its data area starts."""
    content = path.read_bytes()
    size = int.from_bytes(content[:8], "little")
    return json.loads(content[8 : 8 + size]), 8 + size


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view(torch.uint8)


def random_tensor(shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """Random bit patterns (NaNs included) of ``dtype``; bools are 0 or 1, the only bytes a bool may hold."""
    count = 1
    for size in shape:
        count *= size
    high = 2 if dtype is torch.bool else 256
    raw = torch.randint(0, high, (count * dtype.itemsize,), dtype=torch.uint8, generator=generator)
    return raw.view(dtype).reshape(shape)


def edited(**entries) -> dict:
    """VALID_HEADER with entries replaced or added."""
    return {**copy.deepcopy(VALID_HEADER), **entries}


def bias(**changes) -> dict:
    return {**VALID_HEADER["bias"], **changes}


# --- valid files --------------------------------------------------------------------------------


def test_the_valid_file_loads_with_both_readers(tmp_path):
    path = write_safetensors(tmp_path / "valid.safetensors", VALID_HEADER, VALID_DATA)
    ours, reference = read_safetensors(path), safetensors.torch.load_file(path)
    assert list(ours) == ["weight", "bias"]  # header order
    for name in reference:
        assert ours[name].dtype == reference[name].dtype and torch.equal(bits(ours[name]), bits(reference[name]))


@pytest.mark.parametrize("code", sorted(DTYPES))
def test_every_dtype_round_trips_bit_for_bit(tmp_path, code):
    dtype = DTYPES[code]
    generator = torch.Generator().manual_seed(len(code))
    shapes = {"matrix": (3, 5), "scalar": (), "empty": (0, 4), "inner_empty": (2, 0, 3)}
    tensors = {name: random_tensor(shape, dtype, generator) for name, shape in shapes.items()}
    path = tmp_path / "dtypes.safetensors"
    safetensors.torch.save_file(tensors, path)
    header, _ = header_of(path)
    assert {entry["dtype"] for entry in header.values()} == {code}, "the table's code is the one the library writes"

    ours, reference = read_safetensors(path), safetensors.torch.load_file(path)
    assert set(ours) == set(tensors)
    for name, tensor in tensors.items():
        assert ours[name].dtype == dtype and ours[name].shape == tensor.shape, name
        assert torch.equal(bits(ours[name]), bits(tensor)), name
        assert torch.equal(bits(ours[name]), bits(reference[name])), name


def test_mixed_alignment_views_the_aligned_and_copies_the_rest(tmp_path):
    layout = [("double", "F64", [2]), ("byte", "I8", [3]), ("float", "F32", [2]), ("half", "F16", [1]), ("scalar", "I32", [])]
    header, offset = {}, 0
    for name, code, shape in layout:
        count = 1
        for size in shape:
            count *= size
        end = offset + count * DTYPES[code].itemsize
        header[name] = {"dtype": code, "shape": shape, "data_offsets": [offset, end]}
        offset = end
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data area starts 8-aligned, so "byte" knocks the rest off alignment
    data = bytes((index * 37) % 251 for index in range(offset))
    path = write_safetensors(tmp_path / "mixed.safetensors", data=data, header_bytes=encoded)
    data_start = 8 + len(encoded)

    ours, reference = read_safetensors(path), safetensors.torch.load_file(path)
    mapping = ours["double"].untyped_storage()
    copied = set()
    for name, code, _ in layout:
        assert ours[name].dtype == reference[name].dtype and ours[name].shape == reference[name].shape, name
        assert torch.equal(bits(ours[name]), bits(reference[name])), name
        aligned = (data_start + header[name]["data_offsets"][0]) % DTYPES[code].itemsize == 0
        if ours[name].untyped_storage().data_ptr() != mapping.data_ptr():
            copied.add(name)
            assert not aligned, f"{name} is aligned, yet copied"
    assert copied == {"float", "half", "scalar"}


# --- malformed files: (file, words the message must hold, whether the safetensors library rejects it too) ---

MALFORMED_HEADERS = {
    # dtype
    "unknown dtype": (edited(weight={**VALID_HEADER["weight"], "dtype": "F128"}), ["'weight'", "unknown dtype", "'F128'"], True),
    "dtype not a string": (edited(bias=bias(dtype=16)), ["'bias'", "unknown dtype", "16"], True),
    # shape
    "negative dimension": (edited(bias=bias(shape=[-1])), ["'bias'", "shape [-1]", "non-negative integers"], True),
    "float dimension": (edited(bias=bias(shape=[3.0])), ["'bias'", "shape [3.0]"], True),
    "bool dimension": (edited(bias=bias(shape=[True, 3])), ["'bias'", "shape [True, 3]"], True),
    "string dimension": (edited(bias=bias(shape=["3"])), ["'bias'", "shape ['3']"], True),
    "shape not a list": (edited(bias=bias(shape=3)), ["'bias'", "shape 3"], True),
    "strides overflow int64": (
        edited(empty={"dtype": "F32", "shape": [2**40, 2**40, 0], "data_offsets": [22, 22]}),
        ["'empty'", "too large"],
        True,
    ),
    # data_offsets
    "one offset": (edited(bias=bias(data_offsets=[16])), ["'bias'", "data_offsets [16]"], True),
    "three offsets": (edited(bias=bias(data_offsets=[16, 22, 22])), ["'bias'", "data_offsets [16, 22, 22]"], True),
    "negative offset": (edited(bias=bias(data_offsets=[-2, 4])), ["'bias'", "data_offsets [-2, 4]"], True),
    "float offset": (edited(bias=bias(data_offsets=[16.0, 22])), ["'bias'", "data_offsets [16.0, 22]"], True),
    "bool offset": (edited(bias=bias(data_offsets=[16, True])), ["'bias'", "data_offsets [16, True]"], True),
    "end before begin": (edited(bias=bias(data_offsets=[22, 16])), ["'bias'", "[22, 16]", "end before they begin"], True),
    # byte counts
    "0-byte range for a 60000x60000 tensor": (
        edited(huge={"dtype": "F32", "shape": [60000, 60000], "data_offsets": [22, 22]}),
        ["'huge'", "has 0 bytes", "F32 of shape [60000, 60000] takes 14400000000"],
        True,
    ),
    "fewer elements than bytes": (edited(bias=bias(shape=[2])), ["'bias'", "has 6 bytes", "takes 4"], True),
    # ranges that do not tile the data area
    "overlap": (
        edited(bias=bias(data_offsets=[12, 18])),
        ["'bias' (bytes 12 to 18)", "overlaps tensor 'weight'", "ends at byte 16"],
        True,
    ),
    "two tensors on one range": (
        edited(alias={**VALID_HEADER["weight"]}),
        ["overlaps", "'weight'", "'alias'"],
        True,
    ),
    "past the end of the file": (
        edited(bias=bias(data_offsets=[2**40, 2**40 + 6])),
        ["'bias'", "past the end of the file", "holds 22 bytes"],
        True,
    ),
    # entries and metadata
    "entry not an object": (edited(bias=[16, 22]), ["'bias'", "list, not an object"], True),
    "entry without a shape": (edited(bias={"dtype": "I16", "data_offsets": [16, 22]}), ["'bias'", "no 'shape'"], True),
    "unknown key in an entry": (edited(bias=bias(offset=16)), ["'bias'", "unknown key 'offset'"], False),  # the library ignores it
    "metadata not an object": (edited(__metadata__="pt"), ["__metadata__", "str, not an object"], True),
    "metadata value not a string": (edited(__metadata__={"format": 1}), ["__metadata__", "'format' to 1"], True),
    "metadata null": (edited(__metadata__=None), ["__metadata__", "NoneType"], False),  # the library reads null as absent
}


@pytest.mark.parametrize("case", list(MALFORMED_HEADERS))
def test_malformed_header_is_rejected_with_one_clear_message(tmp_path, case):
    header, words, library_rejects = MALFORMED_HEADERS[case]
    data = VALID_DATA
    assert_valid_file_loads(tmp_path)
    path = write_safetensors(tmp_path / "malformed.safetensors", header, data)
    assert_rejected(path, words, library_rejects)


MALFORMED_LAYOUTS = {
    # (header, data, words): each header is valid on its own; the ranges fail to tile the data area
    "hole between tensors": (edited(bias=bias(data_offsets=[18, 24])), VALID_DATA + b"..", ["bytes 16 to 18", "no tensor", "'bias'"]),
    "hole at the start": (
        edited(weight={**VALID_HEADER["weight"], "data_offsets": [2, 18]}, bias=bias(data_offsets=[18, 24])),
        VALID_DATA + b"..",
        ["bytes 0 to 2", "no tensor", "'weight'"],
    ),
    "tail after the last tensor": (VALID_HEADER, VALID_DATA + b"....", ["bytes 22 to 26", "no tensor", "after tensor 'bias'"]),
    "data but no tensor": ({"__metadata__": {}}, b"....", ["bytes 0 to 4", "lists no tensor"]),
    "range ends past the data": (VALID_HEADER, VALID_DATA[:20], ["'bias'", "[16, 22]", "past the end of the file"]),
}


@pytest.mark.parametrize("case", list(MALFORMED_LAYOUTS))
def test_ranges_must_tile_the_data_area(tmp_path, case):
    header, data, words = MALFORMED_LAYOUTS[case]
    assert_valid_file_loads(tmp_path)
    path = write_safetensors(tmp_path / "malformed.safetensors", header, data)
    assert_rejected(path, words, library_rejects=True)


VALID_HEADER_BYTES = json.dumps(VALID_HEADER).encode()
LENGTH_PAST_THE_END = len(VALID_HEADER_BYTES) + len(VALID_DATA) + 1
BIAS_TWICE = VALID_HEADER_BYTES[:-1] + b', "bias": ' + json.dumps(VALID_HEADER["bias"]).encode() + b"}"
MALFORMED_BYTES = {
    # (header bytes, header length field or None, words, whether the library rejects it too)
    "header length past the end of the file": (VALID_HEADER_BYTES, LENGTH_PAST_THE_END, ["header length", "past the end"], True),
    "header not UTF-8": (b'{"\xff": 1}', None, ["not UTF-8"], True),
    "header not JSON": (b'{"weight": ', None, ["not a readable JSON object"], True),
    "header a JSON list": (b"[1, 2]", None, ["header is a JSON list, not an object"], True),
    "header a JSON string": (b'"weight"', None, ["header is a JSON str, not an object"], True),
    "NaN in the header": (b'{"__metadata__": {"format": NaN}}', None, ["NaN is not JSON"], True),
    "tensor named twice": (BIAS_TWICE, None, ["key 'bias' appears twice"], False),  # the library keeps one of them
}


@pytest.mark.parametrize("case", list(MALFORMED_BYTES))
def test_unreadable_header_is_rejected(tmp_path, case):
    header_bytes, header_size, words, library_rejects = MALFORMED_BYTES[case]
    assert_valid_file_loads(tmp_path)
    path = write_safetensors(tmp_path / "malformed.safetensors", data=VALID_DATA, header_bytes=header_bytes, header_size=header_size)
    assert_rejected(path, words, library_rejects)


def test_file_shorter_than_the_header_length_is_rejected(tmp_path):
    assert_valid_file_loads(tmp_path)
    path = tmp_path / "short.safetensors"
    path.write_bytes(b"\x02\x00\x00")
    assert_rejected(path, ["holds 3 bytes", "fewer than the 8"], library_rejects=True)


def test_header_length_over_the_library_limit_is_rejected(tmp_path):
    assert_valid_file_loads(tmp_path)
    path = tmp_path / "huge_header.safetensors"
    length = standalone_runtime._SAFETENSORS_MAX_HEADER_BYTES + 1
    with open(path, "wb") as file:
        file.write(length.to_bytes(8, "little"))
        file.truncate(8 + length + 100)  # sparse: the length is within the file, so only the limit can refuse it
    assert os.path.getsize(path) > length
    assert_rejected(path, [f"header length {length}", "exceeds the limit of 100000000 bytes"], library_rejects=True)


def assert_valid_file_loads(tmp_path: Path) -> None:
    """Precondition of every malformed case: the file it breaks loads, with our reader and the library's."""
    path = write_safetensors(tmp_path / "valid.safetensors", VALID_HEADER, VALID_DATA)
    assert set(read_safetensors(path)) == set(safetensors.torch.load_file(path)) == {"weight", "bias"}


def assert_rejected(path: Path, words: list[str], library_rejects: bool) -> None:
    with pytest.raises(ValueError) as caught:
        read_safetensors(path)
    message = str(caught.value)
    assert message.startswith(f"{path} is not a valid safetensors file: "), message
    assert "\n" not in message, message
    for word in words:
        assert word in message, f"{word!r} not in: {message}"
    if library_rejects:  # our rules are not looser than the library's
        with pytest.raises(Exception) as library:
            safetensors.torch.load_file(path)
        assert not isinstance(library.value, OSError), library.value


# --- memory: views of one private mapping ------------------------------------------------------


def saved_tensors(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    tensors = {"matrix": torch.randn(256, 128), "counts": torch.arange(1000, dtype=torch.int64), "half": torch.randn(7).half()}
    path = tmp_path / "weights.safetensors"
    safetensors.torch.save_file(tensors, path)
    return path, tensors


def test_tensors_are_views_of_one_mapping_of_the_whole_file(tmp_path):
    path, tensors = saved_tensors(tmp_path)
    header, data_start = header_of(path)
    loaded = read_safetensors(path)
    mapping = loaded["matrix"].untyped_storage()
    assert mapping.nbytes() == os.path.getsize(path)  # one storage spanning the file, not a copy per tensor
    for name, tensor in loaded.items():
        assert tensor.untyped_storage().data_ptr() == mapping.data_ptr(), name
        assert tensor.data_ptr() - mapping.data_ptr() == data_start + header[name]["data_offsets"][0], name
        assert torch.equal(tensor, tensors[name]), name
    survivor = loaded.pop("counts")
    del loaded, mapping  # the mapping lives as long as any of its tensors
    assert torch.equal(survivor, tensors["counts"])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_the_storage_is_a_private_mapping_of_the_file(tmp_path):
    path, _ = saved_tensors(tmp_path)
    loaded = read_safetensors(path)  # kept: the mapping goes with its last tensor
    address = loaded["matrix"].untyped_storage().data_ptr()
    stat = os.stat(path)
    mappings = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            start, end = (int(bound, 16) for bound in fields[0].split("-"))
            if start <= address < end:
                mappings.append(fields)
    assert len(mappings) == 1
    permissions, offset, inode = mappings[0][1], int(mappings[0][2], 16), int(mappings[0][4])
    assert inode == stat.st_ino and offset == 0, mappings[0]  # the file itself, from its first byte: no anonymous copy
    assert permissions.endswith("p"), permissions  # private: copy-on-write


def test_writing_a_loaded_tensor_leaves_the_file_unchanged(tmp_path):
    path, tensors = saved_tensors(tmp_path)
    before = path.read_bytes()
    loaded = read_safetensors(path)
    loaded["matrix"].add_(1)
    assert torch.equal(loaded["matrix"], tensors["matrix"] + 1)
    assert path.read_bytes() == before
    assert torch.equal(read_safetensors(path)["matrix"], tensors["matrix"])


def test_loaded_tensors_serve_as_frozen_parameters_and_move(tmp_path):
    linear = torch.nn.Linear(16, 8)
    path = tmp_path / "linear.safetensors"
    safetensors.torch.save_file({name: value.detach() for name, value in linear.state_dict().items()}, path)
    with torch.device("meta"):  # load_weights runs after the model is built on meta; the tensors stay on the CPU
        loaded = read_safetensors(path)
    assert all(tensor.device.type == "cpu" for tensor in loaded.values())
    weight = torch.nn.Parameter(loaded["weight"], requires_grad=False)
    inputs = torch.randn(4, 16)
    with torch.no_grad():
        assert torch.equal(torch.nn.functional.linear(inputs, weight, loaded["bias"]), linear(inputs))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert torch.equal(weight.to(device).cpu(), linear.weight.detach())
    assert torch.equal(weight.to(torch.float64), linear.weight.detach().double())
