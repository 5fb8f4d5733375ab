"""Content digests of base weights: the same numbers give the same digest whatever float type stores
them; any changed element, or a reshaped tensor, gives another; a malformed record is refused."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from lora.errors import AdapterError
from lora.identity import RECORD_KEY, recorded, tensor_digest


def test_digest_is_of_values_and_shape():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3000, 40)).astype(ml_dtypes.bfloat16)  # more rows than one block
    assert tensor_digest(w) == tensor_digest(w.astype(np.float32)) == tensor_digest(w.astype(np.float64))
    changed = w.astype(np.float32)
    changed[2999, 39] = np.nextafter(changed[2999, 39], np.float32(np.inf))
    assert tensor_digest(changed) != tensor_digest(w)
    assert tensor_digest(w.reshape(6000, 20)) != tensor_digest(w)
    assert tensor_digest(w).startswith("sha256:") and len(tensor_digest(w)) == 7 + 64


class _File:
    def __init__(self, metadata):
        self.metadata, self.path = metadata, "adapter_model.safetensors"


class _Adapter:
    def __init__(self, metadata):
        self.file = _File(metadata)


@pytest.mark.parametrize("raw, fragment", [("{", "not JSON"), ("[1]", "not a map"),
                                           (json.dumps({"q": "md5:abc"}), "not a map"),
                                           (json.dumps({"q": 1}), "not a map")])
def test_a_malformed_record_is_refused(raw, fragment):
    with pytest.raises(AdapterError, match=fragment):
        recorded(_Adapter({RECORD_KEY: raw}))  # type: ignore[arg-type]


def test_no_record_is_no_claim():
    assert recorded(_Adapter({"format": "pt"})) == {}  # type: ignore[arg-type]
