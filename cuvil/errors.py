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
    default_hint = 'the module breaks an IR invariant; if Cuvil produced it, report it with the model'


class ParseError(CuvilError):
    """The .cir text could not be parsed."""

    code = "CUVIL-PARSE"
    default_hint = 'check the .cir text at the line and column shown'


class OpDefinitionError(CuvilError):
    """An op was used with operands or attributes its definition does not accept."""

    code = "CUVIL-OP"
    default_hint = "run `cuvil ops` for each op's operands and attributes"


class ShapeError(CuvilError):
    """Operand shapes are incompatible with the op's shape rule."""

    code = "CUVIL-SHAPE"
    default_hint = "check the shapes of the op's operands against its shape rule"


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
    default_hint = ("the model is incomplete: every tensor a node reads must be an input, an initializer "
                    "or a node output")


class AttributeTypeError(CuvilError):
    """A node attribute has the wrong type or an invalid value."""

    code = "CUVIL-ATTR"
    default_hint = "check the node's attributes against the ONNX operator specification"


class ExternalDataError(CuvilError):
    """An external-data reference is unsafe or unreadable."""

    code = "CUVIL-EXTERNAL-DATA"
    default_hint = "external data must live inside the model's directory"


class InputError(CuvilError):
    """Inputs passed at run time do not match the model's signature."""

    code = "CUVIL-INPUT"
    default_hint = "check the inputs (names, dtypes, shapes) against the model's signature"


class UsageError(InputError):
    """A command line the command does not accept: an unknown option, a missing argument."""

    code = "CUVIL-USAGE"
    default_hint = "run `cuvil COMMAND --help` for the options"


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
    default_hint = "choose a size the model's dim constraints admit"


class RuntimeEvalError(CuvilError):
    """Evaluation failed on valid-looking input (e.g. an index out of range)."""

    code = "CUVIL-EVAL"
    default_hint = "the inputs are outside what the model's ops accept (an index out of range, a bad shape)"


class CodegenError(CuvilError):
    """A model cannot be compiled to native code (symbolic dims left, no linker, ...)."""

    code = "CUVIL-CODEGEN"
    default_hint = 'see the message for what the backend could not compile'
