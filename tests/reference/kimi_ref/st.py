"""Minimal safetensors reader/writer: struct + json + numpy + torch only.

File layout (safetensors): u64 little-endian header length N, N bytes of JSON header
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the byte buffer;
offsets are relative to the start of the buffer.

BF16 is read as uint16, shifted left 16 bits and viewed as float32 (exact).
"""
import json
import os
import struct

import numpy as np
import torch

# dtype name -> (numpy dtype of the raw storage, item size)
_RAW = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "I8": np.dtype("i1"),
    "I32": np.dtype("<i4"),
    "I64": np.dtype("<i8"),
    "U16": np.dtype("<u2"),
}


def _bf16_to_f32(u16):
    u32 = u16.astype(np.uint32) << np.uint32(16)
    return u32.view(np.float32)


class SafeFile:
    """One .safetensors file, memory-mapped; tensors decoded on demand."""

    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n).decode("utf-8"))
        self.metadata = header.pop("__metadata__", None)
        self.header = header
        self.data_start = 8 + n
        self._mm = np.memmap(path, dtype=np.uint8, mode="r")

    def keys(self):
        return list(self.header.keys())

    def info(self, name):
        h = self.header[name]
        return h["dtype"], tuple(h["shape"])

    def raw(self, name):
        """Returns the stored numpy array (BF16 as uint16), shaped, read-only view into the mmap."""
        h = self.header[name]
        dt = h["dtype"]
        if dt not in _RAW:
            raise ValueError(f"{self.path}: tensor {name}: unsupported dtype {dt}")
        b, e = h["data_offsets"]
        buf = self._mm[self.data_start + b:self.data_start + e]
        shape = tuple(h["shape"])
        count = int(np.prod(shape)) if shape else 1
        if (e - b) != count * _RAW[dt].itemsize:
            raise ValueError(f"{self.path}: tensor {name}: byte size {e - b} != {count} x {_RAW[dt].itemsize}")
        return buf.view(_RAW[dt]).reshape(shape)

    def get(self, name, float_dtype=None):
        """Returns a torch tensor. Float types are decoded to float32 (or float_dtype if given);
        integer types keep their integer dtype."""
        dt, _ = self.info(name)
        a = self.raw(name)
        if dt == "BF16":
            t = torch.from_numpy(np.array(_bf16_to_f32(a)))
        elif dt in ("F16", "F32", "F64"):
            t = torch.from_numpy(np.array(a, dtype=np.float32 if dt != "F64" else np.float64))
        else:
            t = torch.from_numpy(np.array(a))
            return t
        if float_dtype is not None:
            t = t.to(float_dtype)
        return t


class Checkpoint:
    """A model directory: model.safetensors, or model.safetensors.index.json + shards."""

    def __init__(self, model_dir):
        self.dir = model_dir
        idx = os.path.join(model_dir, "model.safetensors.index.json")
        self.files = {}
        self.where = {}
        if os.path.exists(idx):
            with open(idx) as f:
                wm = json.load(f)["weight_map"]
            for name, fn in wm.items():
                if fn not in self.files:
                    self.files[fn] = SafeFile(os.path.join(model_dir, fn))
                self.where[name] = self.files[fn]
            for fn, sf in self.files.items():
                for k in sf.keys():
                    if k not in self.where:
                        raise ValueError(f"{fn}: tensor {k} is not in the index")
        else:
            sf = SafeFile(os.path.join(model_dir, "model.safetensors"))
            self.files["model.safetensors"] = sf
            for k in sf.keys():
                self.where[k] = sf

    def keys(self):
        return list(self.where.keys())

    def __contains__(self, name):
        return name in self.where

    def info(self, name):
        return self.where[name].info(name)

    def raw(self, name):
        return self.where[name].raw(name)

    def get(self, name, float_dtype=None):
        if name not in self.where:
            raise KeyError(f"tensor {name} not found in {self.dir}")
        return self.where[name].get(name, float_dtype)


def load_file(path, float_dtype=None):
    sf = SafeFile(path)
    return {k: sf.get(k, float_dtype) for k in sf.keys()}


def _dtype_name(t):
    m = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
         torch.uint8: "U8", torch.int8: "I8", torch.int32: "I32", torch.int64: "I64"}
    if t.dtype not in m:
        raise ValueError(f"cannot write dtype {t.dtype}")
    return m[t.dtype]


def save_file(tensors, path, metadata=None):
    """tensors: dict name -> torch tensor (or numpy array). Dtype is kept (F64/F32/F16/BF16/U8/I8/I32/I64);
    a torch.bfloat16 tensor is written as the top 16 bits of its (exact) float32 value."""
    header = {}
    blobs = []
    off = 0
    for name in sorted(tensors.keys()):
        t = tensors[name]
        if isinstance(t, np.ndarray):
            t = torch.from_numpy(t)
        t = t.detach().contiguous()
        dn = _dtype_name(t)
        if t.dtype == torch.bfloat16:
            u32 = t.to(torch.float32).numpy().view(np.uint32)
            data = (u32 >> np.uint32(16)).astype("<u2").tobytes()
        else:
            data = t.numpy().astype(_RAW[dn]).tobytes()
        header[name] = {"dtype": dn, "shape": list(t.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for b in blobs:
            f.write(b)
