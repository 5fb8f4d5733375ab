"""Sequences and optionals at a model's boundary.

CIR functions take and return tensors. An ONNX graph input of sequence or optional type is
imported in the form a run gives it: a sequence of n tensors becomes n parameters
(``x.0`` ... ``x.{n-1}``), a present optional its content, an empty one nothing; the form is
part of what the model is imported for (:class:`InputForm`), like the values of attribute-like
inputs. Outputs are flattened the same way, and the module's metadata records how to regroup
them (:func:`regroup`), so a caller gets lists and ``None`` back where the graph declares them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from cuvil.errors import InputError, ModelLoadError, UnsupportedOpError
from cuvil.frontend.onnx_node import Entity, OptValue, SeqValue, onnx_dtype
from cuvil.ir.values import Value

STRUCTURE_KEY = "onnx.output_forms"
"""Module metadata: JSON ``{output: form}`` for each output that is not a plain tensor, where a form
is ``null`` (an empty optional), ``"tensor"`` (an optional holding a tensor) or the element count
of a sequence (its elements are consecutive results)."""

MAX_SEQUENCE_LENGTH = 4096
"""Most elements a sequence at the model's boundary may have (each becomes a parameter or result)."""


@dataclass(frozen=True)
class InputForm:
    """The run-time form of a sequence or optional graph input, which its declared type leaves
    open: whether it is present, and a sequence's element shapes (``None`` for a tensor)."""

    present: bool = True
    shapes: tuple[tuple[int, ...], ...] | None = None

    @staticmethod
    def of(value: Any, kind: str) -> InputForm:
        """The form of ``value`` fed to an input of ``kind`` (``"sequence"`` or ``"optional"``)."""
        if value is None:
            if kind == "sequence":
                raise InputError("a sequence input cannot be None", hint="pass a list of arrays (maybe empty)")
            return InputForm(present=False)
        if isinstance(value, (list, tuple)):
            if len(value) > MAX_SEQUENCE_LENGTH:
                raise InputError(f"a sequence of {len(value)} tensors is longer than {MAX_SEQUENCE_LENGTH}")
            return InputForm(shapes=tuple(tuple(int(d) for d in np.shape(v)) for v in value))
        if kind == "sequence":
            raise InputError(f"a sequence input takes a list of arrays, got {type(value).__name__}")
        return InputForm()


def input_kind(tp: onnx.TypeProto) -> str:
    """``"tensor"``, ``"sequence"`` or ``"optional"``: what a graph input of this type is fed."""
    which = tp.WhichOneof("value")
    if which == "tensor_type":
        return "tensor"
    if which == "sequence_type":
        return "sequence"
    if which == "optional_type":
        return "optional"
    raise UnsupportedOpError(f"values of type {which or 'unknown'} are not supported (tensors, sequences of "
                             "tensors and optionals are)")


def bind_input(vi: onnx.ValueInfoProto, form: InputForm | None,
               tensor: Callable[[onnx.TypeProto, str, tuple[int, ...] | None], Value]) -> Entity | None:
    """The entity a sequence or optional graph input denotes in ``form``; ``tensor(type, name,
    shape)`` makes one parameter (``shape`` is the fed one, for a declared type without a shape)."""
    where = f"input {vi.name!r}"
    kind = input_kind(vi.type)
    if form is None:
        raise InputError(f"input {vi.name!r} is {'a' if kind == 'sequence' else 'an'} {kind}: its form (a "
                         "sequence's length, whether an optional is present) must be known when the model is "
                         "imported", location=where,
                         hint="run it through cuvil.onnx_backend, which imports it for the form of each run's "
                              "inputs, or import with input_forms={name: InputForm(...)}")
    tp = vi.type
    if kind == "optional":
        if not form.present:
            return OptValue(None)
        tp = tp.optional_type.elem_type
        inner = input_kind(tp)
        if inner == "optional":
            raise UnsupportedOpError("an optional of an optional is not supported", location=where)
        if inner == "tensor":
            if form.shapes is not None:
                raise InputError(f"input {vi.name!r} holds a tensor, got a list", location=where)
            return OptValue(tensor(tp, vi.name, None))
        return OptValue(_sequence(vi.name, tp, form, tensor))
    return _sequence(vi.name, tp, form, tensor)


def _sequence(name: str, tp: onnx.TypeProto, form: InputForm,
              tensor: Callable[[onnx.TypeProto, str, tuple[int, ...] | None], Value]) -> SeqValue:
    elem = tp.sequence_type.elem_type
    if input_kind(elem) != "tensor":
        raise UnsupportedOpError(f"input {name!r}: sequences of non-tensors are not supported", location=name)
    if form.shapes is None:
        raise InputError(f"input {name!r} is a sequence: feed a list of arrays", location=name)
    dtype = onnx_dtype(elem.tensor_type.elem_type, f"input {name!r}")
    return SeqValue(tuple(tensor(elem, f"{name}.{k}", shape) for k, shape in enumerate(form.shapes)), dtype)


def flatten_outputs(names: Sequence[str], entities: Sequence[Entity]
                    ) -> tuple[list[Value], list[str], dict[str, Any]]:
    """The results, their names and the forms of the non-tensor outputs (see :data:`STRUCTURE_KEY`)."""
    values: list[Value] = []
    out_names: list[str] = []
    forms: dict[str, Any] = {}
    for name, e in zip(names, entities, strict=True):
        if isinstance(e, Value):
            values.append(e)
            out_names.append(name)
            continue
        content: Entity | None = e.content if isinstance(e, OptValue) else e
        if isinstance(e, OptValue) and isinstance(content, Value):
            forms[name] = "tensor"
            values.append(content)
            out_names.append(name)
        elif isinstance(content, SeqValue):
            forms[name] = len(content.elems)
            values.extend(content.elems)
            out_names.extend(f"{name}.{k}" for k in range(len(content.elems)))
        else:
            forms[name] = None
    if len(set(out_names)) != len(out_names):
        raise ModelLoadError(f"output names {out_names} collide once sequences are flattened",
                             hint="rename the graph outputs")
    return values, out_names, forms


def encode_forms(forms: Mapping[str, Any]) -> dict[str, str]:
    """The module metadata that records ``forms`` (nothing when every output is a tensor)."""
    return {STRUCTURE_KEY: json.dumps(dict(forms), sort_keys=True)} if forms else {}


def regroup(metadata: Mapping[str, str], names: Sequence[str], flat: Sequence[Any]) -> list[Any]:
    """The outputs as the graph declares them (``names``, in order), from a run's flat results: a
    sequence as a list, an empty optional as None."""
    forms = json.loads(metadata.get(STRUCTURE_KEY, "{}"))
    out: list[Any] = []
    k = 0
    for name in names:
        form = forms.get(name, "tensor")
        if form is None:
            out.append(None)
        elif form == "tensor":
            out.append(flat[k])
            k += 1
        else:
            out.append(list(flat[k:k + int(form)]))
            k += int(form)
    if k != len(flat):
        raise ModelLoadError(f"{len(flat)} results for outputs {list(names)} with forms {forms}")
    return out
