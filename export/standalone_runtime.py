"""Runtime helpers that every generated ``module.py`` carries, copied verbatim.

This file is the single source of the loader code in saved artifacts, so it
may import only ``torch`` and the standard library, and nothing here may refer
to aot. :func:`aot.export.module_writer.write_module_source` pastes the source
below the ``# --- runtime ---`` marker into ``module.py``.

The safetensors format is small enough to read by hand: an 8-byte
little-endian header length, a JSON header mapping each tensor name to its
dtype, shape and ``[begin, end)`` byte range, then the raw data. Tensors are
views into one ``bytearray`` (``torch.frombuffer``), so loading copies the
file once and nothing else.
"""

# --- runtime ---
import json
import os
import sys

import torch

_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}


def read_safetensors(path):
    """Return ``{name: tensor}`` for a safetensors file, using torch alone."""
    if sys.byteorder != "little":
        raise RuntimeError("safetensors data is little-endian; this loader needs a little-endian machine")
    data = bytearray(os.path.getsize(path))  # one writable buffer, filled in place: no second copy
    with open(path, "rb") as file:
        if file.readinto(data) != len(data):
            raise RuntimeError(f"{path} changed while it was read")
    header_size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + header_size].decode("utf-8"))
    header.pop("__metadata__", None)
    data_start = 8 + header_size
    tensors = {}
    for name, info in header.items():
        dtype = _SAFETENSORS_DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        shape = info["shape"]
        if end == begin:
            tensors[name] = torch.empty(shape, dtype=dtype)
            continue
        count = (end - begin) // torch.empty((), dtype=dtype).element_size()
        tensors[name] = torch.frombuffer(data, dtype=dtype, count=count, offset=data_start + begin).reshape(shape)
    return tensors


def assign_tensor(model, qualified_name, tensor):
    """Put ``tensor`` where ``qualified_name`` points: a parameter, a buffer or a plain tensor attribute."""
    owner_path, _, leaf = qualified_name.rpartition(".")
    owner = model.get_submodule(owner_path)
    if leaf in owner._parameters:
        if not isinstance(tensor, torch.nn.Parameter):
            tensor = torch.nn.Parameter(tensor, requires_grad=False)
        owner._parameters[leaf] = tensor
    elif leaf in owner._buffers:
        owner._buffers[leaf] = tensor
    else:
        setattr(owner, leaf, tensor)


def lookup_tensor(model, qualified_name):
    owner_path, _, leaf = qualified_name.rpartition(".")
    return getattr(model.get_submodule(owner_path), leaf)


def load_weights(model, path, aliases, constants):
    """Fill a model built on the meta device with the tensors stored at ``path``.

    ``aliases`` maps a name to the name it shares its tensor with (tied weights are
    stored once); ``constants`` names plain tensor attributes that are neither
    parameters nor buffers. Every tensor the model declares must be filled.
    """
    tensors = read_safetensors(path)
    for name, tensor in tensors.items():
        assign_tensor(model, name, tensor)
    for alias, name in aliases.items():
        assign_tensor(model, alias, lookup_tensor(model, name))
    declared = [name for name, _ in model.named_parameters(remove_duplicate=False)]
    declared += [name for name, _ in model.named_buffers(remove_duplicate=False)]
    declared += list(constants)
    missing = [name for name in declared if lookup_tensor(model, name).is_meta]
    if missing:
        raise RuntimeError(f"{os.path.basename(path)} holds no tensor for {', '.join(missing)}")
    return model


class skip_weight_init:
    """Within it, ``torch.nn.init`` functions leave tensors as they are.

    Constructors fill their weights at random, and every weight is replaced on
    load; on the meta device that work is pointless, and ``normal_`` there even
    imports torch._dynamo (about a second).
    """

    def __enter__(self):
        self.saved = {
            name: function
            for name, function in vars(torch.nn.init).items()
            if name.endswith("_") and not name.startswith("_") and callable(function)
        }
        for name in self.saved:
            setattr(torch.nn.init, name, _leave_unchanged)
        return self

    def __exit__(self, *exc_info):
        for name, function in self.saved.items():
            setattr(torch.nn.init, name, function)


def _leave_unchanged(tensor, *args, **kwargs):
    return tensor


class NoGuards(torch.nn.Module):
    """Stands in for torch.export's input-guard module: the saved graph does not re-check input shapes."""

    def forward(self, *args):
        return None
