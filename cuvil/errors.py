"""The error hierarchy every user-caused failure goes through.

Each error carries a stable code (documented in the README), the location it
refers to (model node, op, pass, file) and a hint, so a failure in a regulated
pipeline can be triaged from its log line alone.
"""

from __future__ import annotations


class CuvilError(Exception):
    """Base class: a failure the user can act on."""

    code = "CUVIL-000"
    default_hint = ""

    def __init__(self, message: str, *, location: str | None = None, hint: str | None = None) -> None:
        self.message = message
        self.location = location
        self.hint = hint if hint is not None else self.default_hint
        super().__init__(self.__str__())

    def __str__(self) -> str:
        text = f"[{self.code}] {self.message}"
        if self.location:
            text += f" (at {self.location})"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


class IRError(CuvilError):
    """Malformed CIR: a broken invariant in a module (a bug in its producer)."""

    code = "CUVIL-IR"


class ParseError(CuvilError):
    """The .cir text could not be parsed."""

    code = "CUVIL-PARSE"


class OpDefinitionError(CuvilError):
    """An op was used with operands or attributes its definition does not accept."""

    code = "CUVIL-OP"


class ShapeError(CuvilError):
    """Operand shapes are incompatible with the op's shape rule."""

    code = "CUVIL-SHAPE"


class ModelLoadError(CuvilError):
    """The model file or object could not be read (truncated, wrong format)."""

    code = "CUVIL-LOAD"
    default_hint = "check that the file is a complete ONNX/.pt2 model"


class UnsupportedOpError(CuvilError):
    """The model uses an op (or op variant) Cuvil does not implement."""

    code = "CUVIL-UNSUPPORTED-OP"
    default_hint = "run `cuvil ops` for the list of supported ops"


class UnsupportedOpsetError(CuvilError):
    """The model's opset is outside the supported range."""

    code = "CUVIL-OPSET"
    default_hint = "re-export the model with opset 13 or newer"


class MissingInitializerError(CuvilError):
    """A node refers to a tensor no node, input or initializer defines."""

    code = "CUVIL-MISSING-TENSOR"


class AttributeTypeError(CuvilError):
    """A node attribute has the wrong type or an invalid value."""

    code = "CUVIL-ATTR"


class ExternalDataError(CuvilError):
    """An external-data reference is unsafe or unreadable."""

    code = "CUVIL-EXTERNAL-DATA"
    default_hint = "external data must live inside the model's directory"


class InputError(CuvilError):
    """Inputs passed at run time do not match the model's signature."""

    code = "CUVIL-INPUT"


class FileAccessError(CuvilError):
    """A file the command was told to read or write could not be (missing folder, a directory,
    permissions, no space, a closed output stream)."""

    code = "CUVIL-IO"
    default_hint = "check the path and its permissions"


class PluginError(CuvilError):
    """A pass plugin failed: it does not import, is not a Pass, raises, or returns something else
    than a module (the user's code, not a bug in Cuvil)."""

    code = "CUVIL-PLUGIN"
    default_hint = "fix the plugin; run with -v for its traceback"


class BudgetError(CuvilError):
    """Work a model or a plugin can make unbounded ran past its budget (unrolled loop trips,
    elements of a tensor, the time a pass may take)."""

    code = "CUVIL-BUDGET"
    default_hint = "the model or the plugin asks for more than Cuvil allows; see the limit in the message"


class ConstraintError(InputError):
    """A symbolic dimension took a value its constraints do not allow."""

    code = "CUVIL-DIM-CONSTRAINT"


class RuntimeEvalError(CuvilError):
    """Evaluation failed on valid-looking input (e.g. an index out of range)."""

    code = "CUVIL-EVAL"


class CodegenError(CuvilError):
    """A model cannot be compiled to native code (symbolic dims left, no linker, ...)."""

    code = "CUVIL-CODEGEN"
