"""A saved GraphModule replayed from CUDA graphs, one per shape bucket (pasted into ``module.py``).

At small batches a GPU model is bound by launching its kernels from Python: a CUDA graph
replays all of them in one launch. A graph has fixed shapes, so the recipe names buckets
(``export.graph_module.cuda_graphs: {batch: [1, 8, 32], sequence: [64, 128]}``) and a call::

    sizes of each dim      batch 5, sequence 100
    smallest bucket        batch 8, sequence 128        (beyond the largest: the model runs uncaptured)
    pad into its buffers   input_ids / token_type_ids with 0, attention_mask with 0 over the padding
    replay                 the bucket's graph (captured at its first call, or all at load, largest first,
                           in one shared memory pool)
    slice and copy out     each output cut back to batch 5, sequence 100 on the axes that follow them

The attention mask is 0 over the padding, so padded keys take no part in the real tokens'
attention; padded rows and positions are computed and cut away. The build validates exactly this
path, padded shapes included, against the eager model. Off CUDA there is nothing to capture: a call
pads, runs and slices, which is what the build's CPU tests hold to the same outputs.

Torch and the standard library only: ``module.py`` stays torch-only.
"""

import bisect

import torch
import torch.utils._pytree as _cuda_graph_pytree  # module.py's own pytree helpers come from the same place

_CUDA_GRAPH_WARMUP_CALLS = 3


class CudaGraphBuckets(torch.nn.Module):
    """``model`` behind per-bucket CUDA graphs; see the module docstring.

    ``spec``: ``{"buckets": {dim: [sizes]}, "input_axes": {input: {axis: dim}}, "output_axes":
    [{axis: dim} per output leaf], "pad_values": {input: value}, "device": the build's}``, literals the build
    wrote. A CUDA build's model moves to its device here, where CUDA is, so that ``capture="all"`` can capture.
    """

    def __init__(self, model, spec, capture="lazy"):
        super().__init__()
        self.model = model
        self.buckets = {dim: sorted(sizes) for dim, sizes in spec["buckets"].items()}
        self.input_axes = {name: {int(axis): dim for axis, dim in axes.items()} for name, axes in spec["input_axes"].items()}
        self.output_axes = [{int(axis): dim for axis, dim in axes.items()} for axes in spec["output_axes"]]
        self.pad_values = dict(spec.get("pad_values", {}))
        self.graphs = {}
        self.pool = None
        device = spec.get("device", "cpu")
        if device.startswith("cuda") and torch.cuda.is_available():
            self.model.to(device)
        if capture == "all":
            self.capture_all()
        elif capture != "lazy":
            raise ValueError(f"capture must be 'lazy' or 'all', not {capture!r}")

    # -- shapes ----------------------------------------------------------------------------------

    def sizes_of(self, inputs):
        """``{dim: size}`` read from the inputs that carry each bucketed dim."""
        sizes = {}
        for name, axes in self.input_axes.items():
            if name in inputs:
                for axis, dim in axes.items():
                    if dim in self.buckets:
                        sizes[dim] = int(inputs[name].shape[axis])
        return sizes

    def bucket_for(self, sizes):
        """The smallest bucket that holds ``sizes`` (a tuple of sizes, dims in order), or None beyond the largest."""
        chosen = []
        for dim, sizes_of_dim in self.buckets.items():
            index = bisect.bisect_left(sizes_of_dim, sizes[dim])
            if index == len(sizes_of_dim):
                return None
            chosen.append(sizes_of_dim[index])
        return tuple(chosen)

    def padded(self, inputs, bucket):
        """The inputs padded (at the end of each bucketed axis) up to ``bucket``."""
        target = dict(zip(self.buckets, bucket))
        out = {}
        for name, value in inputs.items():
            shape = list(value.shape)
            for axis, dim in self.input_axes.get(name, {}).items():
                if dim in target:
                    shape[axis] = target[dim]
            if shape == list(value.shape):
                out[name] = value
                continue
            filled = value.new_full(shape, self.pad_values.get(name, 0))
            filled[tuple(slice(0, size) for size in value.shape)] = value
            out[name] = filled
        return out

    def sliced(self, leaves, sizes):
        """Each output leaf cut back to the call's real sizes on the axes that follow a bucketed dim, copied out."""
        out = []
        for leaf, axes in zip(leaves, self.output_axes):
            if not isinstance(leaf, torch.Tensor):
                out.append(leaf)
                continue
            index = [slice(None)] * leaf.dim()
            for axis, dim in axes.items():
                if dim in sizes:
                    index[axis] = slice(0, sizes[dim])
            out.append(leaf[tuple(index)].clone())
        return out

    # -- calls -----------------------------------------------------------------------------------

    def forward(self, **inputs):
        sizes = self.sizes_of(inputs)
        bucket = self.bucket_for(sizes)
        if bucket is None:  # beyond the largest bucket: uncaptured, as the graph module itself
            return self.model(**inputs)
        padded = self.padded(inputs, bucket)
        if not _cuda_graph_on_cuda(padded):
            result = self.model(**padded)
        else:
            result = self._replay(bucket, padded)
        leaves, spec = _cuda_graph_pytree.tree_flatten(result)
        return _cuda_graph_pytree.tree_unflatten(self.sliced(leaves, sizes), spec)

    def _replay(self, bucket, padded):
        if bucket not in self.graphs:
            self.graphs[bucket] = self._capture(padded)
        static_inputs, graph, static_outputs = self.graphs[bucket]
        for name, value in padded.items():
            static_inputs[name].copy_(value)
        graph.replay()
        return static_outputs

    def _capture(self, example):
        static_inputs = {name: value.clone() for name, value in example.items()}
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.no_grad():
            for _ in range(_CUDA_GRAPH_WARMUP_CALLS):
                self.model(**static_inputs)
        torch.cuda.current_stream().wait_stream(stream)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool), torch.no_grad():
            static_outputs = self.model(**static_inputs)
        return static_inputs, graph, static_outputs

    def capture_all(self, example_inputs=None):
        """Capture every bucket now, largest first (the pool then holds the largest's memory once)."""
        device = next(self.model.parameters()).device
        if device.type != "cuda":
            return
        dims = list(self.buckets)
        combos = [()]
        for dim in dims:
            combos = [combo + (size,) for combo in combos for size in self.buckets[dim]]
        for bucket in sorted(combos, key=lambda combo: tuple(-size for size in combo)):
            if bucket not in self.graphs:
                self.graphs[bucket] = self._capture(self._example(bucket, device))

    def _example(self, bucket, device):
        """Token inputs at ``bucket`` (zeros, a mask of ones): inputs whose every axis is a bucketed dim."""
        target = dict(zip(self.buckets, bucket))
        example = {}
        for name, axes in self.input_axes.items():
            if sorted(axes) != list(range(len(axes))) or not all(dim in target for dim in axes.values()):
                raise ValueError(f"capture='all' makes token inputs only; '{name}' has other axes: capture lazily")
            shape = [target[dim] for _, dim in sorted(axes.items())]
            example[name] = torch.full(shape, 1 if name == "attention_mask" else 0, dtype=torch.int64, device=device)
        return example


def _cuda_graph_on_cuda(inputs):
    return any(isinstance(value, torch.Tensor) and value.is_cuda for value in inputs.values())
